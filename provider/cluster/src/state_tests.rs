use super::*;
use enim_core::PodRef;
use enim_crd::{Instance, Watermarks};
use enim_provider::testing::owner;

fn eni(i: u8) -> EniSpec {
    EniSpec {
        id: format!("eni-{i}"),
        mac: format!("02:00:00:00:00:{i:02x}"),
        ipv4: format!("10.0.{i}.10/24"),
        gateway4: format!("10.0.{i}.1").parse().unwrap(),
        ipv6: None,
        gateway6: None,
        mtu: None,
        device_index: Some(u32::from(i)),
        subnet: String::new(),
        secondary_ips: vec![
            format!("10.0.{i}.11").parse().unwrap(),
            format!("10.0.{i}.12").parse().unwrap(),
        ],
        security_groups: Vec::new(),
        claim: None,
        policy: None,
    }
}

fn seen(mode: Mode, generation: i64, enis: Vec<EniSpec>, draining: &[&str]) -> SeenSpec {
    SeenSpec {
        generation: Some(generation),
        spec: NetResourceSetSpec {
            instance: Instance {
                provider: "static".into(),
                id: "i-1".into(),
                ..Default::default()
            },
            mode,
            watermarks: Watermarks::default(),
            enis,
            draining: draining.iter().map(|d| d.to_string()).collect(),
            ..Default::default()
        },
    }
}

fn pod(container_id: &str, name: &str) -> EniOwner {
    EniOwner {
        pod: PodRef {
            namespace: "ns".into(),
            name: name.into(),
            uid: Some(format!("uid-{name}")),
        },
        ..owner(container_id)
    }
}

fn ids(enis: &[Eni]) -> Vec<&str> {
    enis.iter().map(|e| e.id.as_str()).collect()
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap())
}

#[test]
fn a_spec_eni_becomes_the_providers_eni_and_bad_ones_are_quarantined() {
    let mut e = eni(1);
    e.ipv6 = Some("fd00:1::10/64".into());
    e.gateway6 = Some("fd00:1::1".parse().unwrap());
    e.mtu = Some(9001);
    let got = parse_eni(&e).unwrap();
    assert_eq!(got.mac.to_string(), "02:00:00:00:00:01");
    assert_eq!(got.ipv4.to_string(), "10.0.1.10/24");
    assert_eq!(got.ipv6.unwrap().to_string(), "fd00:1::10/64");
    assert_eq!((got.mtu, got.device_index), (Some(9001), Some(1)));
    assert_eq!(got.secondary_ips.len(), 2);

    let bad = |f: fn(&mut EniSpec)| {
        let mut e = eni(2);
        f(&mut e);
        parse_eni(&e).unwrap_err()
    };
    assert!(bad(|e| e.mac = "zz".into()).contains("MAC"));
    assert!(bad(|e| e.ipv4 = "10.0.2.10".into()).contains("prefix"));
    assert!(bad(|e| e.gateway4 = "10.9.9.1".parse().unwrap()).contains("inside"));
    assert!(bad(|e| e.gateway4 = "fd00::1".parse().unwrap()).contains("not IPv4"));
    assert!(bad(|e| e.ipv6 = Some("fd00::5/64".into())).contains("together"));
    assert!(bad(|e| e.mtu = Some(10)).contains("mtu"));

    let mut s = State::new(Mode::Primary);
    let mut broken = eni(2);
    broken.mac = "nope".into();
    s.apply(seen(Mode::Primary, 1, vec![eni(1), broken, eni(1)], &[]));
    assert_eq!(ids(&s.list()), ["eni-1"]);
    let q = s.status("n1", now()).quarantined;
    assert_eq!(q.len(), 2, "{q:?}");
    assert!(q[0].eni == "eni-2" && q[0].reason.contains("invalid in the spec"));
    assert!(q[1].eni == "eni-1" && q[1].reason.contains("twice"));
}

#[test]
fn nothing_is_handed_out_before_a_spec_or_in_the_wrong_mode() {
    let mut s = State::new(Mode::Primary);
    assert!(s.list().is_empty());
    let e = s.allocate("n1", &owner("a")).unwrap_err();
    assert!(
        matches!(&e, ProviderError::Unavailable(m) if m.contains("no NetResourceSet for node \"n1\"")),
        "{e:?}"
    );
    assert!(e.is_transient(), "CNI code 11: try again later");
    s.apply(seen(Mode::Secondary, 1, vec![eni(1)], &[]));
    assert!(s.list().is_empty());
    let e = s.allocate("n1", &owner("a")).unwrap_err().to_string();
    assert!(
        e.contains("secondary mode") && e.contains("primary mode"),
        "{e}"
    );
    let st = s.status("n1", now());
    assert_eq!(st.conditions[0].status, "False");
    assert_eq!(st.conditions[0].reason, "NotServing");
}

#[test]
fn allocation_is_idempotent_in_spec_order_and_exhausts() {
    let mut s = State::new(Mode::Primary);
    s.apply(seen(Mode::Primary, 1, vec![eni(1), eni(2)], &[]));
    let a = s.allocate("n1", &pod("a", "pa")).unwrap();
    assert_eq!(a.id, "eni-1");
    assert_eq!(
        s.allocate("n1", &owner("a")).unwrap().id,
        "eni-1",
        "same attachment"
    );
    assert_eq!(s.allocate("n1", &owner("b")).unwrap().id, "eni-2");
    assert_eq!(
        s.allocate("n1", &owner("c")).unwrap_err(),
        ProviderError::Exhausted { total: 2 }
    );
    s.release(&owner("a"));
    s.release(&owner("a"));
    assert_eq!(s.allocate("n1", &owner("c")).unwrap().id, "eni-1");
    let listed = s.list();
    assert_eq!(listed[1].owner.as_ref().unwrap().container_id, "b");
}

#[test]
fn draining_enis_are_never_handed_out_and_are_released_once_free() {
    let mut s = State::new(Mode::Primary);
    s.apply(seen(Mode::Primary, 1, vec![eni(1), eni(2), eni(3)], &[]));
    s.allocate("n1", &owner("a")).unwrap(); // eni-1
    s.apply(seen(
        Mode::Primary,
        2,
        vec![eni(1), eni(2), eni(3)],
        &["eni-1", "eni-2"],
    ));
    // eni-2 is free and draining: gone from the list, released at once;
    // eni-1 is held: listed with its owner, not released.
    assert_eq!(ids(&s.list()), ["eni-1", "eni-3"]);
    assert_eq!(s.released(), ["eni-2"]);
    assert_eq!(s.allocate("n1", &owner("b")).unwrap().id, "eni-3");
    assert_eq!(
        s.allocate("n1", &owner("c")).unwrap_err(),
        ProviderError::Exhausted { total: 2 }
    );
    s.release(&owner("a"));
    assert_eq!(s.released(), ["eni-1", "eni-2"]);
    assert_eq!(ids(&s.list()), ["eni-3"]);
    // A quarantined draining ENI holds no pod: released too.
    s.apply(seen(Mode::Primary, 3, vec![eni(3), eni(4)], &[]));
    let missing = EniOwner {
        network: MISSING_NETWORK.into(),
        container_id: "missing".into(),
        ifname: "eni-4".into(),
        pod: PodRef::default(),
    };
    s.restore(&[("eni-4".into(), missing)]).unwrap();
    let q = s.status("n1", now()).quarantined;
    assert!(
        q[0].eni == "eni-4" && q[0].reason.contains("not in the node"),
        "{q:?}"
    );
    s.apply(seen(Mode::Primary, 4, vec![eni(3), eni(4)], &["eni-4"]));
    assert_eq!(s.released(), ["eni-4"]);
}

#[test]
fn an_eni_gone_from_the_spec_stays_with_its_pod_only() {
    let mut s = State::new(Mode::Primary);
    s.apply(seen(Mode::Primary, 1, vec![eni(1), eni(2)], &[]));
    s.allocate("n1", &owner("a")).unwrap();
    s.apply(seen(Mode::Primary, 2, vec![eni(2)], &[]));
    assert_eq!(ids(&s.list()), ["eni-2", "eni-1"], "kept for its pod");
    assert_eq!(s.allocate("n1", &owner("b")).unwrap().id, "eni-2");
    s.release(&owner("a"));
    assert_eq!(ids(&s.list()), ["eni-2"]);
}

#[test]
fn restore_keeps_pods_of_unknown_enis_and_refuses_conflicts() {
    let mut s = State::new(Mode::Primary);
    // No spec yet (API down, no cache): the checkpoint's pods are kept.
    s.restore(&[("eni-2".into(), pod("x", "px"))]).unwrap();
    assert!(s.allocate("n1", &owner("y")).is_err());
    s.apply(seen(Mode::Primary, 1, vec![eni(1), eni(2)], &[]));
    assert_eq!(s.allocate("n1", &owner("x")).unwrap().id, "eni-2");
    assert_eq!(s.allocate("n1", &owner("y")).unwrap().id, "eni-1");
    let before = s.list();
    let conflict = s.restore(&[("eni-3".into(), owner("z")), ("eni-2".into(), owner("z"))]);
    assert!(matches!(conflict, Err(ProviderError::OwnedByOther { .. })));
    assert_eq!(s.list(), before, "a refused restore changes nothing");
    let used = s.status("n1", now()).used;
    assert_eq!(used.len(), 2);
    assert_eq!(used[1].pod_name, "px");
}

#[test]
fn the_status_document_counts_and_keeps_its_transition_time() {
    let mut s = State::new(Mode::Primary);
    s.apply(seen(
        Mode::Primary,
        7,
        vec![eni(1), eni(2), eni(3)],
        &["eni-3"],
    ));
    s.allocate("n1", &pod("c1", "web")).unwrap();
    let st = s.status("n1", now());
    assert_eq!(
        st.used,
        [EniUse {
            eni: "eni-1".into(),
            ip: None,
            pod_namespace: "ns".into(),
            pod_name: "web".into(),
            pod_uid: "uid-web".into(),
            container_id: "c1".into(),
            ifname: "eth0".into(),
        }]
    );
    assert_eq!(
        st.summary,
        Summary {
            enis: 3,
            used: 1,
            available: 1
        }
    );
    assert_eq!(st.released, ["eni-3"]);
    assert_eq!(st.observed_generation, Some(7));
    assert_eq!(st.last_sync, Some(now()));
    let ready = &st.conditions[0];
    assert_eq!(
        (ready.type_.as_str(), ready.status.as_str()),
        ("Ready", "True")
    );
    assert_eq!(ready.observed_generation, Some(7));
    // Later writes keep the transition time while Ready stays True.
    let later = Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_100).unwrap());
    let again = s.status("n1", later.clone());
    assert_eq!(again.conditions[0].last_transition_time, now());
    assert_eq!(again.last_sync, Some(later));
    // camelCase on the wire, as the CRD says.
    let json = serde_json::to_value(&st).unwrap();
    assert_eq!(json["used"][0]["podName"], "web");
    assert_eq!(json["observedGeneration"], 7);
    assert_eq!(json["summary"]["available"], 1);
}

#[test]
fn secondary_mode_lists_addresses_and_hands_back_draining_ones_once_the_store_let_them_go() {
    let mut s = State::new(Mode::Secondary);
    s.apply(seen(
        Mode::Secondary,
        1,
        vec![eni(1), eni(2)],
        &["10.0.1.12", "eni-2"],
    ));
    let listed = s.list();
    assert_eq!(ids(&listed), ["eni-1"], "a draining ENI is not offered");
    assert_eq!(
        listed[0].secondary_ips,
        ["10.0.1.11".parse::<IpAddr>().unwrap()]
    );
    // Before the store has said what it holds: nothing is released.
    assert!(s.released().is_empty());
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    // The store still holds 10.0.1.12 (applied before the drain) and eni-2.
    s.stored(StoredAddresses {
        enis: vec!["eni-1".into(), "eni-2".into()],
        addresses: vec![ip("10.0.1.11"), ip("10.0.1.12"), ip("10.0.2.11")],
        cooling: vec![],
    });
    s.held("eni-1", &[ip("10.0.1.12")], &pod("p", "web"));
    assert!(s.released().is_empty());
    // The pod goes and the store drops both.
    s.release(&owner("p"));
    s.stored(StoredAddresses {
        enis: vec!["eni-1".into()],
        addresses: vec![ip("10.0.1.11")],
        cooling: vec![],
    });
    assert_eq!(s.released(), ["10.0.1.12", "eni-2"]);
    // A freed address resting its cooldown: in status.cooling, not
    // available; once it has rested, available again.
    s.stored(StoredAddresses {
        enis: vec!["eni-1".into()],
        addresses: vec![ip("10.0.1.11")],
        cooling: vec![ip("10.0.1.11")],
    });
    let st = s.status("n1", now());
    assert_eq!(st.cooling, [ip("10.0.1.11")]);
    assert_eq!(st.summary.available, 0);
    s.stored(StoredAddresses {
        enis: vec!["eni-1".into()],
        addresses: vec![ip("10.0.1.11")],
        cooling: vec![],
    });
    let st = s.status("n1", now());
    assert!(st.cooling.is_empty());
    assert_eq!(st.summary.available, 1);
    s.held("eni-1", &[ip("10.0.1.11")], &pod("q", "db"));
    let st = s.status("n1", now());
    assert_eq!(st.used.len(), 1);
    assert_eq!(st.used[0].ip, Some(ip("10.0.1.11")));
    assert_eq!(st.used[0].pod_name, "db");
    assert_eq!(
        st.summary,
        Summary {
            enis: 2,
            used: 1,
            available: 0
        }
    );
    assert!(st.quarantined.is_empty(), "{:?}", st.quarantined);
    // A listed ENI the store does not serve (its device is not there yet).
    s.apply(seen(Mode::Secondary, 2, vec![eni(1), eni(3)], &[]));
    let q = s.status("n1", now()).quarantined;
    assert!(q.len() == 1 && q[0].eni == "eni-3", "{q:?}");
}

/// What the DRA driver publishes: the subnet, the node's zone, and the
/// node's groups unless the ENI (made for a claim) has its own.
#[test]
fn a_spec_eni_carries_its_placement() {
    let mut spec = seen(Mode::Primary, 1, vec![], &[]).spec;
    spec.instance.zone = "zone-a".into();
    spec.security_groups = vec!["sg-node".into()];
    let mut e = eni(1);
    e.subnet = "subnet-1".into();
    let got = parse_eni_in(&e, &spec).unwrap().placement;
    assert_eq!(got.subnet.as_deref(), Some("subnet-1"));
    assert_eq!(got.zone.as_deref(), Some("zone-a"));
    assert_eq!(got.security_groups, ["sg-node"]);
    e.security_groups = vec!["sg-claim".into()];
    let got = parse_eni_in(&e, &spec).unwrap().placement;
    assert_eq!(got.security_groups, ["sg-claim"]);
}

/// The operator makes ENIs for DRA claims only where the agent says it
/// serves them: the status says so exactly when the agent's `[dra]` is on,
/// before any spec is seen too, and the condition's time holds still.
#[test]
fn the_status_says_it_serves_claims_exactly_when_dra_is_on() {
    for on in [false, true] {
        let mut s = State::new(Mode::Primary).serving_claims(on);
        let first = s.status("n1", now());
        assert_eq!(first.serves_claims(), on, "no spec yet, dra {on}");
        s.apply(seen(Mode::Primary, 3, vec![eni(1)], &[]));
        let later = Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_100).unwrap());
        let st = s.status("n1", later);
        assert_eq!(st.serves_claims(), on, "dra {on}");
        let claims = st
            .conditions
            .iter()
            .find(|c| c.type_ == enim_crd::CONDITION_SERVES_CLAIMS)
            .expect("written either way, apart from an agent too old to say");
        assert_eq!(claims.status, if on { "True" } else { "False" });
        assert_eq!(claims.last_transition_time, now());
        assert_eq!(st.conditions[0].type_, CONDITION_READY);
    }
    // Off unless asked.
    assert!(!State::new(Mode::Secondary)
        .status("n1", now())
        .serves_claims());
}
