//! Issue #29, "Trust boundaries": the instance metadata (IMDSv2) answers
//! as the AWS provider parses them. A loopback server answers each path
//! with any text (or 404); the client returns the interface, or an error
//! naming the path and the value, and never panics, also when the
//! interface becomes an ENI.
//!
//! Each property runs at most 128 small cases, over plain HTTP on
//! loopback.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::{MutexGuard, OnceLock};

use enim_core::MacAddr;
use enim_provider_aws::metadata::{Imds, ImdsError};
use enim_testkit::metadata_stub::answers::{
    assert_path_under, cases, entries, listing, mac_text, wild_string,
};
use enim_testkit::metadata_stub::MetadataStub;
use proptest::prelude::*;

/// One metadata stand-in for the whole file (its thread lives as long as
/// the test process); each case sets its answers, the cases run one at a
/// time.
fn metadata() -> &'static MetadataStub {
    static SERVER: OnceLock<MetadataStub> = OnceLock::new();
    SERVER.get_or_init(|| MetadataStub::start(""))
}

/// Lines of a listing: up to four.
const LISTING_LINES: std::ops::Range<usize> = 0..5;

/// One answer: plausible, any text, or none (404).
fn field(plausible: impl Strategy<Value = String>) -> impl Strategy<Value = Option<String>> {
    prop_oneof![4 => plausible.prop_map(Some), 1 => wild_string().prop_map(Some), 1 => Just(None)]
}

const MAC: MacAddr = MacAddr([2, 0, 0, 0xaa, 0xbb, 0xcc]);

fn interface_answers() -> impl Strategy<Value = Vec<(&'static str, Option<String>)>> {
    let v4 = || any::<[u8; 4]>().prop_map(|a| Ipv4Addr::from(a).to_string());
    let v6 = || any::<[u8; 16]>().prop_map(|a| Ipv6Addr::from(a).to_string());
    (
        (
            field("eni-[0-9a-f]{1,17}"),
            field(any::<u32>().prop_map(|n| n.to_string())),
            field(prop_oneof![
                Just("0".to_string()),
                any::<u64>().prop_map(|n| n.to_string())
            ]),
            field(any::<u32>().prop_map(|n| n.to_string())),
            field(listing(v4(), LISTING_LINES)),
        ),
        (
            field(
                (any::<[u8; 4]>(), 0u8..=40)
                    .prop_map(|(a, p)| format!("{}/{p}", Ipv4Addr::from(a))),
            ),
            field(listing(v6(), LISTING_LINES)),
            field(listing(
                (any::<[u8; 16]>(), 0u8..=130)
                    .prop_map(|(a, p)| format!("{}/{p}", Ipv6Addr::from(a))),
                LISTING_LINES,
            )),
            field("subnet-[0-9a-f]{1,17}"),
        ),
    )
        .prop_map(
            |((id, device, card, card_index, ipv4s), (subnet4, ipv6s, subnet6, subnet_id))| {
                vec![
                    ("interface-id", id),
                    ("device-number", device),
                    ("network-card", card),
                    ("network-card-index", card_index),
                    ("local-ipv4s", ipv4s),
                    ("subnet-ipv4-cidr-block", subnet4),
                    ("ipv6s", ipv6s),
                    ("subnet-ipv6-cidr-blocks", subnet6),
                    ("subnet-id", subnet_id),
                ]
            },
        )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Sets the server's answers: `listing` for the MAC list, `fields` under
/// [`MAC`]. They stay until the returned guard is dropped: the tests run
/// in parallel, over one server.
fn set_answers(
    listing: Option<&str>,
    fields: &[(&str, Option<String>)],
) -> MutexGuard<'static, ()> {
    let mut answers = HashMap::new();
    let base = "/latest/meta-data/network/interfaces/macs/";
    if let Some(listing) = listing {
        answers.insert(base.to_string(), listing.to_string());
    }
    for (leaf, value) in fields {
        if let Some(v) = value {
            answers.insert(format!("{base}{MAC}/{leaf}"), v.clone());
        }
    }
    metadata().serve(answers)
}

/// An error the parsers may give: the path (under `under`) and why, or a
/// 404.
fn assert_parse_error(e: &ImdsError, under: &str) -> Result<(), TestCaseError> {
    let path = match e {
        ImdsError::Invalid { path, .. } | ImdsError::NotFound { path } => Some(path.as_str()),
        _ => None,
    };
    assert_path_under(e, path, under)
}

proptest! {
    #![proptest_config(cases(128))]

    /// The MAC listing of any text: one MAC a non-blank line, or an
    /// error naming the line.
    #[test]
    fn mac_listing_of_any_text_is_macs_or_an_error(text in listing(mac_text(), LISTING_LINES)) {
        let _serial = set_answers(Some(&text), &[]);
        let imds = Imds::new(metadata().url()).unwrap();
        match runtime().block_on(imds.macs()) {
            Ok(macs) => {
                let lines = entries(&text);
                prop_assert_eq!(macs.len(), lines.len());
                for (mac, line) in macs.iter().zip(&lines) {
                    prop_assert_eq!(mac.to_string(), line.to_ascii_lowercase().replace('-', ":"));
                }
            }
            Err(e) => {
                assert_parse_error(&e, "meta-data/network/interfaces/macs/")?;
                prop_assert!(matches!(e, ImdsError::Invalid { .. }), "{}", e);
            }
        }
    }

    /// An interface's fields of any text, or missing: the interface (and
    /// an ENI made of it), or an error naming the field.
    #[test]
    fn interface_of_any_answers_is_an_eni_or_an_error(fields in interface_answers(), mtu in proptest::option::of(any::<u32>())) {
        let _serial = set_answers(None, &fields);
        let imds = Imds::new(metadata().url()).unwrap();
        match runtime().block_on(imds.interface(MAC)) {
            Ok(info) => {
                prop_assert!(!info.ipv4s.is_empty());
                let eni = info.to_eni(mtu);
                prop_assert_eq!(eni.ipv4.addr(), info.ipv4s[0]);
                prop_assert_eq!(eni.ipv4.prefix_len(), info.subnet_v4.prefix_len());
                prop_assert_eq!(eni.mac, MAC);
                prop_assert!(!eni.secondary_ips.contains(&eni.ipv4.addr().into()));
                if let Some(v6) = eni.ipv6 {
                    prop_assert!(info.subnet_v6.is_some_and(|n| n.contains(&v6.addr())));
                    prop_assert!(!eni.secondary_ips.contains(&v6.addr().into()));
                }
            }
            Err(e) => assert_parse_error(&e, &format!("meta-data/network/interfaces/macs/{MAC}/"))?,
        }
    }
}
