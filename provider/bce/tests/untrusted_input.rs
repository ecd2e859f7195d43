//! Issue #29, "Trust boundaries": BCC instance metadata as the BCE
//! provider parses it. A loopback server answers each path with any text
//! (or 404); the client returns the interface, or an error naming the
//! path and the value, and never panics, also when the interface becomes
//! an ENI. The mask parser, which has a writer (a prefix as a netmask),
//! round-trips.
//!
//! Each property runs at most 256 small cases, over plain HTTP on
//! loopback.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{MutexGuard, OnceLock};

use enim_provider_bce::metadata::{parse_mask, MetadataClient, MetadataError};
use enim_testkit::metadata_stub::answers::{
    assert_path_under, cases, entries, listing, wild_string,
};
use enim_testkit::metadata_stub::MetadataStub;
use proptest::collection::vec;
use proptest::prelude::*;

const BASE: &str = "/1.0/meta-data/";

/// One metadata stand-in for the whole file; each case sets its answers,
/// the cases run one at a time.
fn metadata() -> &'static MetadataStub {
    static SERVER: OnceLock<MetadataStub> = OnceLock::new();
    SERVER.get_or_init(|| MetadataStub::start(BASE))
}

/// Lines of a listing: up to three.
const LISTING_LINES: std::ops::Range<usize> = 0..4;

fn ip_text() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u8..4).prop_map(|h| format!("10.0.1.{}", 10 + h)),
        any::<[u8; 4]>().prop_map(|a| Ipv4Addr::from(a).to_string()),
        any::<[u8; 16]>().prop_map(|a| Ipv6Addr::from(a).to_string()),
    ]
}

fn field(plausible: impl Strategy<Value = String>) -> impl Strategy<Value = Option<String>> {
    prop_oneof![4 => plausible.prop_map(Some), 1 => wild_string().prop_map(Some), 1 => Just(None)]
}

/// Prefix lengths and netmasks as metadata may write them.
fn mask_text() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u8..=140).prop_map(|n| n.to_string()),
        (0u8..=40).prop_map(|n| format!("/{n}")),
        any::<[u8; 4]>().prop_map(|a| Ipv4Addr::from(a).to_string()),
        (0u32..=32).prop_map(|n| v4_mask(n).to_string()),
        (0u32..=128).prop_map(|n| v6_mask(n).to_string()),
    ]
}

fn v4_mask(ones: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::MAX.checked_shl(32 - ones).unwrap_or(0))
}

fn v6_mask(ones: u32) -> Ipv6Addr {
    Ipv6Addr::from(u128::MAX.checked_shl(128 - ones).unwrap_or(0))
}

const MAC: &str = "fa:16:3e:00:00:01";

/// The answers for one interface: its fixed IPs and, per IP, a type, a
/// mask and a gateway, each plausible, any text or missing.
fn interface_answers() -> impl Strategy<Value = HashMap<String, String>> {
    let per_ip = (
        field(prop_oneof![
            Just("primary".to_string()),
            Just("secondary".to_string())
        ]),
        field(mask_text()),
        field(ip_text()),
    );
    (listing(ip_text(), LISTING_LINES), vec(per_ip, 4)).prop_map(|(ips, per_ip)| {
        let mut answers = HashMap::new();
        let macs = "network/interfaces/macs";
        for (ip, (ip_type, mask, gateway)) in ips.lines().map(str::trim).zip(per_ip) {
            let ip = ip.trim_end_matches('/');
            for (leaf, value) in [("ip_type", ip_type), ("mask", mask), ("gateway", gateway)] {
                if let Some(v) = value {
                    answers.insert(format!("{macs}/{MAC}/fixed_ips/{ip}/{leaf}"), v);
                }
            }
        }
        answers.insert(format!("{macs}/{MAC}/fixed_ips"), ips);
        answers
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Sets the server's answers until the returned guard is dropped: the
/// tests run in parallel, over one server.
fn set_answers(answers: HashMap<String, String>) -> MutexGuard<'static, ()> {
    metadata().serve(answers)
}

/// An error the parsers may give: the path (under `under`) and why.
fn assert_parse_error(e: &MetadataError, under: &str) -> Result<(), TestCaseError> {
    let path = match e {
        MetadataError::Parse { path, .. }
        | MetadataError::Empty { path }
        | MetadataError::Status { path, .. } => Some(path.as_str()),
        _ => None,
    };
    assert_path_under(e, path, under)
}

proptest! {
    #![proptest_config(cases(256))]

    /// Any text as a mask: a prefix length within the family, or None;
    /// every prefix, written as a netmask or a number, reads back.
    #[test]
    fn a_mask_of_any_text_is_a_prefix_within_bounds(text in prop_oneof![mask_text(), wild_string()], ones in 0u32..=128) {
        for max in [32, 128] {
            if let Some(n) = parse_mask(&text, max) {
                prop_assert!(n <= max);
            }
        }
        let ones4 = ones.min(32);
        let want4 = u8::try_from(ones4).unwrap();
        let want6 = u8::try_from(ones).unwrap();
        prop_assert_eq!(parse_mask(&v4_mask(ones4).to_string(), 32), Some(want4));
        prop_assert_eq!(parse_mask(&format!("/{ones4}"), 32), Some(want4));
        prop_assert_eq!(parse_mask(&v6_mask(ones).to_string(), 128), Some(want6));
        prop_assert_eq!(parse_mask(&ones.to_string(), 128), Some(want6));
    }
}

proptest! {
    #![proptest_config(cases(128))]

    /// The MAC listing of any text: its non-blank lines.
    #[test]
    fn mac_listing_of_any_text_is_its_lines(text in listing(prop_oneof![Just(MAC.to_string()), wild_string()], LISTING_LINES)) {
        let _serial = set_answers(HashMap::from([("network/interfaces/macs".to_string(), text.clone())]));
        let client = MetadataClient::new(metadata().url()).unwrap();
        match runtime().block_on(client.macs()) {
            Ok(macs) => {
                prop_assert_eq!(macs, entries(&text));
            }
            // Blank: metadata not ready.
            Err(e) => prop_assert!(matches!(e, MetadataError::Empty { .. }) && text.trim().is_empty(), "{}", e),
        }
    }

    /// An interface's answers of any text, or missing: the interface (and
    /// an ENI made of it), or an error naming the path.
    #[test]
    fn interface_of_any_answers_is_an_eni_or_an_error(answers in interface_answers()) {
        let _serial = set_answers(answers);
        let client = MetadataClient::new(metadata().url()).unwrap();
        match runtime().block_on(client.interface(MAC)) {
            Ok(iface) => {
                prop_assert!(iface.all_ips.contains(&IpAddr::V4(iface.ipv4.addr())));
                let eni = iface.to_eni("eni-1");
                prop_assert_eq!(eni.mac.to_string(), MAC);
                prop_assert!(!eni.secondary_ips.contains(&IpAddr::V4(eni.ipv4.addr())));
                prop_assert!(eni.secondary_ips.iter().all(|ip| iface.all_ips.contains(ip)));
                if let Some(v6) = eni.ipv6 {
                    prop_assert!(iface.all_ips.contains(&IpAddr::V6(v6.addr())));
                    prop_assert!(eni.gateway6.is_some());
                }
            }
            Err(e) => assert_parse_error(&e, &format!("network/interfaces/macs/{MAC}/fixed_ips"))?,
        }
    }
}

/// A listed MAC that is not one (here: signed octets, which the MAC parser
/// once took) is a parse error naming it, asked of nothing further.
#[test]
fn a_listed_mac_that_is_not_one_is_refused() {
    let _serial = set_answers(HashMap::new());
    let client = MetadataClient::new(metadata().url()).unwrap();
    for bad in ["+a:16:3e:00:00:01", "fa:16:3e:00:00", "zz:16:3e:00:00:01"] {
        let e = runtime().block_on(client.interface(bad)).unwrap_err();
        assert!(
            matches!(&e, MetadataError::Parse { value, .. } if value == bad),
            "{bad}: {e}"
        );
    }
}
