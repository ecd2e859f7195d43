//! Issue #29, "Trust boundaries": the NetResourceSet spec as the agent's
//! cluster provider reads it. The operator writes it, and so can anyone
//! with write access to the resource: any ids, MACs and addresses, the
//! same MAC twice, long lists. The provider must serve exactly the valid
//! ENIs, quarantine every other entry under its id with the reason, and
//! never panic.
//!
//! Pure state, no API server (tests/apiserver.rs has that); each property
//! runs at most 256 small cases.

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::Instant;

use enim_core::{EniOwner, ProviderError};
use enim_crd::{EniSpec, Quarantined};
use enim_crd::{Instance, Mode, NetResourceSetSpec, Watermarks};
use enim_provider_cluster::state::{parse_eni_in, SeenSpec, State};
use enim_testkit::metadata_stub::answers::cases;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use proptest::collection::vec;
use proptest::prelude::*;
use serde_json::Value;

fn wild_string() -> impl Strategy<Value = String> {
    prop_oneof!["\\PC{0,20}", "(?s:.{0,20})", "[a-f0-9:./\\-+ \\x00]{0,20}",]
}

fn ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        (0u8..4, 0u8..20).prop_map(|(i, h)| IpAddr::from([10, 0, i, h])),
        any::<[u8; 4]>().prop_map(IpAddr::from),
        any::<[u8; 16]>().prop_map(IpAddr::from),
    ]
}

/// A field: the plausible value of ENI `i`, or anything.
fn or_wild(plausible: impl Strategy<Value = String>) -> impl Strategy<Value = String> {
    prop_oneof![4 => plausible, 1 => wild_string()]
}

/// An ENI of the spec: mostly plausible (ids and MACs from small sets, so
/// both repeat), any field possibly wrong.
fn eni_spec() -> impl Strategy<Value = EniSpec> {
    (0u8..4, 0u8..4, 0u8..4)
        .prop_flat_map(|(id, mac, net)| {
            (
                (
                    or_wild(Just(format!("eni-{id}"))),
                    prop_oneof![
                        6 => Just(format!("02:00:00:00:00:0{mac}")),
                        1 => Just(format!("02-00-00-00-00-0{mac}")),
                        1 => Just(format!("+2:00:00:00:00:0{mac}")),
                        1 => wild_string(),
                    ],
                    or_wild(Just(format!("10.0.{net}.10/24"))),
                    prop_oneof![3 => Just(IpAddr::from([10, 0, net, 1])), 1 => ip()],
                ),
                (
                    proptest::option::of(or_wild(Just(format!("fd00:{net}::10/64")))),
                    proptest::option::of(prop_oneof![
                        Just(format!("fd00:{net}::1").parse::<IpAddr>().unwrap()),
                        ip()
                    ]),
                    proptest::option::of(prop_oneof![Just(9001u32), any::<u32>()]),
                    proptest::option::of(any::<u32>()),
                ),
                (wild_string(), vec(ip(), 0..4), vec(wild_string(), 0..3)),
            )
        })
        .prop_map(
            |(
                (id, mac, ipv4, gateway4),
                (ipv6, gateway6, mtu, device_index),
                (subnet, secondary_ips, security_groups),
            )| EniSpec {
                id,
                mac,
                ipv4,
                gateway4,
                ipv6,
                gateway6,
                mtu,
                device_index,
                subnet,
                secondary_ips,
                security_groups,
                claim: None,
                policy: None,
            },
        )
}

fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![Just(Mode::Primary), Just(Mode::Secondary)]
}

fn seen_spec() -> impl Strategy<Value = SeenSpec> {
    (
        mode(),
        proptest::option::of(any::<i64>()),
        vec(eni_spec(), 0..10),
        vec(
            prop_oneof![wild_string(), "eni-[0-3]", "10\\.0\\.[0-3]\\.1[0-9]"],
            0..4,
        ),
        wild_string(),
    )
        .prop_map(|(mode, generation, enis, draining, zone)| SeenSpec {
            generation,
            spec: NetResourceSetSpec {
                instance: Instance {
                    provider: "static".into(),
                    id: "i-1".into(),
                    zone,
                    ..Default::default()
                },
                mode,
                watermarks: Watermarks::default(),
                enis,
                draining,
                ..Default::default()
            },
        })
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap())
}

fn pod(container: &str) -> EniOwner {
    EniOwner {
        network: "enim".into(),
        container_id: container.into(),
        ifname: "eth0".into(),
        pod: Default::default(),
    }
}

/// Walks the spec in order: the first entry of an id and of a MAC that
/// parses is served (listed, or held back while draining); every other
/// entry is the next quarantined one, under its own id, with the parser's
/// reason or "twice".
fn assert_every_entry_accounted(seen: &SeenSpec, state: &mut State) -> Result<(), TestCaseError> {
    let spec = &seen.spec;
    let listed = state.list();
    let quarantined: Vec<Quarantined> = state.status("node-1", now()).quarantined;
    let mut next = quarantined.iter();
    let (mut ids, mut macs) = (HashSet::new(), HashSet::new());
    for e in &spec.enis {
        let first = ids.insert(e.id.clone());
        let verdict = parse_eni_in(e, spec);
        let refused = match &verdict {
            _ if !first => Some("twice".to_string()),
            Err(why) => Some(why.clone()),
            Ok(eni) if !macs.insert(eni.mac) => Some("twice".to_string()),
            Ok(_) => None,
        };
        if let Some(reason) = refused {
            let q = next.next();
            prop_assert!(
                q.is_some_and(|q| q.eni == e.id),
                "{:?} not quarantined: {:?}",
                e,
                quarantined
            );
            let q = q.unwrap();
            prop_assert!(
                q.reason.contains(&reason),
                "{}: {} lacks {}",
                e.id,
                q.reason,
                reason
            );
            continue;
        }
        let eni = verdict.unwrap();
        match listed.iter().find(|l| l.id == e.id) {
            Some(l) => {
                prop_assert_eq!(l.mac, eni.mac);
                prop_assert_eq!(
                    (l.ipv4, l.gateway4, l.ipv6, l.gateway6, l.mtu),
                    (eni.ipv4, eni.gateway4, eni.ipv6, eni.gateway6, eni.mtu)
                );
                prop_assert!(l
                    .secondary_ips
                    .iter()
                    .all(|ip| eni.secondary_ips.contains(ip)));
                prop_assert!(l.owner.is_none());
            }
            None => prop_assert!(spec.draining.contains(&e.id), "{} silently dropped", e.id),
        }
    }
    prop_assert!(
        next.next().is_none(),
        "quarantined beyond the spec: {:?}",
        quarantined
    );
    // One device per listed ENI: ids and MACs unique.
    let ids: HashSet<_> = listed.iter().map(|e| &e.id).collect();
    let macs: HashSet<_> = listed.iter().map(|e| e.mac).collect();
    prop_assert_eq!(ids.len(), listed.len());
    prop_assert_eq!(
        macs.len(),
        listed.len(),
        "one MAC listed under two ENIs: {:?}",
        listed
    );
    Ok(())
}

proptest! {
    #![proptest_config(cases(256))]

    /// Any spec: every entry served as it parses or quarantined under its
    /// id with the reason; nothing else, and one ENI per MAC.
    #[test]
    fn every_spec_entry_is_served_or_quarantined_by_id(seen in seen_spec()) {
        let mut state = State::new(seen.spec.mode);
        state.apply(seen.clone());
        assert_every_entry_accounted(&seen, &mut state)?;
        // Primary mode hands out only what it lists, each once.
        if seen.spec.mode == Mode::Primary {
            let listed: Vec<String> = state.list().into_iter().map(|e| e.id).collect();
            let mut given = HashSet::new();
            for i in 0..=listed.len() {
                match state.allocate("node-1", &pod(&format!("c{i}"))) {
                    Ok(eni) => {
                        prop_assert!(listed.contains(&eni.id));
                        prop_assert!(given.insert(eni.id));
                    }
                    Err(ProviderError::Exhausted { .. }) => prop_assert_eq!(given.len(), listed.len()),
                    Err(e) => prop_assert!(false, "{}", e),
                }
            }
        }
        // The same spec again: the same verdicts. A mode it is not for
        // serves nothing.
        let mut again = State::new(seen.spec.mode);
        again.apply(seen.clone());
        again.apply(seen.clone());
        assert_every_entry_accounted(&seen, &mut again)?;
        let other = match seen.spec.mode { Mode::Primary => Mode::Secondary, Mode::Secondary => Mode::Primary };
        let mut wrong = State::new(other);
        wrong.apply(seen.clone());
        prop_assert!(wrong.list().is_empty());
        prop_assert!(wrong.allocate("node-1", &pod("c")).is_err());
        let _ = wrong.status("node-1", now());
    }

    /// Any JSON as the spec (the API server checks the CRD's schema, a
    /// cache file on disk is checked by nobody): a spec or a serde error;
    /// a spec written back reads the same.
    #[test]
    fn spec_json_decodes_or_fails_and_round_trips(value in json_value(), seen in seen_spec()) {
        let _ = serde_json::from_value::<NetResourceSetSpec>(value.clone());
        let _ = serde_json::from_value::<SeenSpec>(value);
        let back: SeenSpec = serde_json::from_slice(&serde_json::to_vec(&seen).unwrap()).unwrap();
        prop_assert_eq!(back, seen);
    }
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        wild_string().prop_map(Value::from),
        prop_oneof![
            Just("primary"),
            Just("secondary"),
            Just("eni-1"),
            Just("02:00:00:00:00:01")
        ]
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 5, |inner| {
        let key = prop_oneof![
            wild_string(),
            prop_oneof![
                Just("instance"),
                Just("mode"),
                Just("watermarks"),
                Just("enis"),
                Just("draining"),
                Just("id"),
                Just("mac"),
                Just("ipv4"),
                Just("gateway4"),
                Just("spec"),
                Just("generation"),
            ]
            .prop_map(str::to_string),
        ];
        prop_oneof![
            vec(inner.clone(), 0..5).prop_map(Value::Array),
            proptest::collection::btree_map(key, inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Two spec ENIs with one MAC are one device: the agent must not hand
/// both out (two pods would get the same device, or the second pod's ADD
/// would find it gone). The first is served, the second quarantined.
#[test]
fn a_second_eni_with_the_same_mac_is_quarantined() {
    let eni = |id: &str, mac: &str| EniSpec {
        id: id.into(),
        mac: mac.into(),
        ipv4: "10.0.1.10/24".into(),
        gateway4: "10.0.1.1".parse().unwrap(),
        ipv6: None,
        gateway6: None,
        mtu: None,
        device_index: None,
        subnet: String::new(),
        secondary_ips: Vec::new(),
        security_groups: Vec::new(),
        claim: None,
        policy: None,
    };
    let seen = SeenSpec {
        generation: Some(1),
        spec: NetResourceSetSpec {
            mode: Mode::Primary,
            // One MAC, spelled two ways.
            enis: vec![
                eni("eni-a", "02:00:00:00:00:01"),
                eni("eni-b", "02-00-00-00-00-01"),
            ],
            ..Default::default()
        },
    };
    let mut state = State::new(Mode::Primary);
    state.apply(seen);
    let ids: Vec<String> = state.list().into_iter().map(|e| e.id).collect();
    assert_eq!(ids, ["eni-a"]);
    let q = state.status("node-1", now()).quarantined;
    assert_eq!(q.len(), 1, "{q:?}");
    assert_eq!(q[0].eni, "eni-b");
    assert!(
        q[0].reason.contains("02:00:00:00:00:01") && q[0].reason.contains("twice"),
        "{}",
        q[0].reason
    );
}

/// A spec as large as a NetResourceSet can be (etcd keeps objects up to
/// ~1.5 MB: some 10 000 ENIs), half of them draining, in both modes: the
/// provider applies it, lists it and writes its status in bounded time.
#[test]
fn a_spec_of_ten_thousand_enis_is_applied_in_bounded_time() {
    for mode in [Mode::Primary, Mode::Secondary] {
        let enis: Vec<EniSpec> = (0..10_000u32)
            .map(|i| {
                let [_, _, a, b] = i.to_be_bytes();
                EniSpec {
                    id: format!("eni-{i}"),
                    mac: format!("02:00:00:00:{a:02x}:{b:02x}"),
                    ipv4: format!("10.{a}.{b}.10/24"),
                    gateway4: IpAddr::from([10, a, b, 1]),
                    ipv6: None,
                    gateway6: None,
                    mtu: None,
                    device_index: Some(i),
                    subnet: String::new(),
                    secondary_ips: vec![IpAddr::from([10, a, b, 11])],
                    security_groups: Vec::new(),
                    claim: None,
                    policy: None,
                }
            })
            .collect();
        let draining = (0..10_000).step_by(2).map(|i| format!("eni-{i}")).collect();
        let seen = SeenSpec {
            generation: Some(1),
            spec: NetResourceSetSpec {
                mode,
                enis,
                draining,
                ..Default::default()
            },
        };
        let started = Instant::now();
        let mut state = State::new(mode);
        state.apply(seen);
        assert_eq!(state.list().len(), 5_000);
        let status = state.status("node-1", now());
        assert!(status.quarantined.is_empty());
        let took = started.elapsed();
        eprintln!(
            "{} mode: 10 000 ENIs applied, listed, status written in {took:?}",
            mode.as_str()
        );
        assert!(took.as_secs() < 10, "{took:?}");
    }
}
