use super::*;
use enim_provider::cloud::{CloudBackend, TaggedEni};

fn rt() -> tokio::runtime::Runtime {
    paused_runtime(1).unwrap()
}

#[test]
fn create_attach_detach_delete_make_the_aws_backends_calls() {
    rt().block_on(async {
        let account = Account::new(CloudParams::default(), 3);
        let node = account.node(0);
        assert_eq!(node.eni_limit().await.unwrap(), 15);
        assert_eq!(node.eni_limit().await.unwrap(), 15, "cached");
        let t = Instant::now();
        let eni = node.create_and_attach().await.unwrap();
        let took = t.elapsed();
        assert!(
            took >= Duration::from_secs(8) && took < Duration::from_secs(14),
            "{took:?}"
        );
        assert_eq!(node.attached().await.unwrap(), vec![eni.clone()]);
        assert_eq!(
            node.tagged().await.unwrap(),
            vec![TaggedEni {
                id: eni.id.clone(),
                attached: true
            }]
        );
        let c = account.counts();
        let n = |a| c.get(a).ok;
        assert_eq!(n(Action::DescribeInstanceTypes), 1);
        // The slot check before the attach and the tagged() list (the
        // check before the create reads metadata).
        assert_eq!(n(Action::DescribeNetworkInterfacesFiltered), 2);
        assert_eq!(n(Action::CreateNetworkInterface), 1);
        assert_eq!(n(Action::AttachNetworkInterface), 1);
        assert_eq!(n(Action::ModifyNetworkInterfaceAttribute), 1);
        assert_eq!(c.throttled(), 0);
        assert!(c.imds_reads >= 2);

        let t = Instant::now();
        node.detach_and_delete(&eni.id).await.unwrap();
        let took = t.elapsed();
        assert!(
            took >= Duration::from_secs(2) && took < Duration::from_secs(6),
            "{took:?}"
        );
        let c = account.counts();
        assert_eq!(c.get(Action::DetachNetworkInterface).ok, 1);
        assert_eq!(c.get(Action::DeleteNetworkInterface).ok, 1);
        // The lookup, then polls until available.
        assert!(c.get(Action::DescribeNetworkInterfacesById).ok >= 2);
        assert!(node.attached().await.unwrap().is_empty());
        assert_eq!(account.eni_count(), 0);
        // Deleting what is gone is done.
        node.detach_and_delete(&eni.id).await.unwrap();
    });
}

#[test]
fn the_limit_counts_the_primary() {
    rt().block_on(async {
        let params = CloudParams {
            eni_limit: 3,
            ..CloudParams::default()
        };
        let account = Account::new(params, 1);
        let node = account.node(0);
        node.create_and_attach().await.unwrap();
        node.create_and_attach().await.unwrap();
        let e = node.create_and_attach().await.unwrap_err();
        assert!(e.is_transient(), "{e}");
        assert_eq!(account.attached_ids(0).len(), 2);
        // Refused before creating anything.
        assert_eq!(account.counts().get(Action::CreateNetworkInterface).ok, 2);
    });
}

#[test]
fn an_empty_bucket_throttles_and_the_client_retries_then_gives_up() {
    rt().block_on(async {
        let account = Account::new(CloudParams::default(), 1);
        // 200 describes at once against 100 tokens + 20/s: the first 100
        // pass, the rest are throttled and retried with backoff (the
        // client's retry alone: unpaced, as the operator's calls are).
        let tasks = describes_at_once(&account, 200);
        let mut ok = 0;
        let mut throttled = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(_) => ok += 1,
                Err(e @ ProviderError::Throttled(_)) => {
                    assert!(e.is_transient());
                    throttled += 1;
                }
                Err(e) => panic!("{e}"),
            }
        }
        let c = account
            .counts()
            .get(Action::DescribeNetworkInterfacesFiltered);
        assert_eq!(ok + throttled, 200);
        assert_eq!(c.ok, ok);
        assert_eq!(c.gave_up, throttled);
        assert!(c.throttled >= 100, "{c:?}");
        // Four retries wait 1.5–3 s in all: 20–60 refilled tokens
        // (20/s) let some more through; the rest give up throttled.
        assert!((120..=170).contains(&ok), "{c:?}");
        assert!(throttled > 0, "{c:?}");
        // Other buckets are untouched.
        assert_eq!(
            account.counts().get(Action::DescribeInstanceTypes),
            Count::default()
        );
    });
}

/// `n` filtered describes at once through the account's unpaced client.
fn describes_at_once(
    account: &Arc<Account>,
    n: usize,
) -> Vec<tokio::task::JoinHandle<Result<(), ProviderError>>> {
    (0..n)
        .map(|_| {
            let account = account.clone();
            tokio::spawn(async move {
                account
                    .call(Action::DescribeNetworkInterfacesFiltered, |_, _| Ok(()))
                    .await
            })
        })
        .collect()
}

#[test]
fn paced_nodes_get_more_through_an_empty_bucket_with_fewer_throttles() {
    let describe = Action::DescribeNetworkInterfacesFiltered;
    let unpaced = rt().block_on(async {
        let account = Account::new(CloudParams::default(), 1);
        for t in describes_at_once(&account, 200) {
            let _ = t.await.unwrap();
        }
        account.counts().get(describe)
    });
    // The same 200 describes, each node's own client pacing its retries
    // by the throttles it got.
    let paced = rt().block_on(async {
        let account = Account::new(CloudParams::default(), 1);
        let tasks: Vec<_> = (0..200)
            .map(|i| {
                let node = account.node(i);
                tokio::spawn(async move { node.tagged().await })
            })
            .collect();
        for t in tasks {
            let _ = t.await.unwrap();
        }
        account.counts().get(describe)
    });
    assert_eq!(unpaced.ok + unpaced.gave_up, 200);
    assert_eq!(paced.ok + paced.gave_up, 200);
    assert!(paced.ok > unpaced.ok, "{paced:?} {unpaced:?}");
    // Fewer throttled replies per success.
    assert!(
        paced.throttled * unpaced.ok < unpaced.throttled * paced.ok,
        "{paced:?} {unpaced:?}"
    );
}

#[test]
fn same_seed_same_run() {
    let run = || {
        rt().block_on(async {
            let account = Account::new(CloudParams::default(), 9);
            let node = account.node(0);
            let mut times = Vec::new();
            for _ in 0..3 {
                let t = Instant::now();
                node.create_and_attach().await.unwrap();
                times.push(t.elapsed());
            }
            (times, account.counts())
        })
    };
    assert_eq!(run(), run());
}

#[test]
fn the_fleet_backend_makes_aws_fleets_calls_and_no_more() {
    use enim_provider::cloud::Reaped;
    use enim_provider::fleet::{CreateEni, DeleteCheck, FleetCloud, Slot};
    rt().block_on(async {
        let account = Account::new(CloudParams::default(), 5);
        let fleet = SimFleet::new(account.clone());
        let req = |token: &str, fresh| CreateEni {
            instance: instance_id(0),
            subnet: "subnet-sim".into(),
            security_groups: vec![],
            client_token: token.into(),
            secondary_ipv4: 0,
            fresh,
        };
        let n = |a| account.counts().get(a).ok;
        let failed = |a| account.counts().get(a).failed;
        // A fresh create: no look-up by intent; create and attach: no look.
        let eni = fleet.create(&req("t-1", true)).await.unwrap();
        fleet
            .attach(&eni, Slot::new(&instance_id(0), 1))
            .await
            .unwrap();
        assert_eq!(n(Action::DescribeNetworkInterfacesFiltered), 0);
        assert_eq!(n(Action::DescribeNetworkInterfacesById), 0);
        assert_eq!(n(Action::CreateNetworkInterface), 1);
        assert_eq!(n(Action::AttachNetworkInterface), 1);
        assert_eq!(n(Action::ModifyNetworkInterfaceAttribute), 1);
        // A retried intent: looked up by its tag, found, not created again.
        let again = fleet.create(&req("t-1", false)).await.unwrap();
        assert_eq!(again.id, eni.id);
        assert_eq!(n(Action::DescribeNetworkInterfacesFiltered), 1);
        assert_eq!(n(Action::CreateNetworkInterface), 1);
        // The stale reply attached again: refused (in use), one look finds
        // it there; at another index the refusal stands.
        fleet
            .attach(&eni, Slot::new(&instance_id(0), 1))
            .await
            .unwrap();
        assert_eq!(failed(Action::AttachNetworkInterface), 1);
        assert_eq!(n(Action::DescribeNetworkInterfacesById), 1);
        fleet
            .attach(&eni, Slot::new(&instance_id(0), 2))
            .await
            .unwrap_err();
        assert_eq!(n(Action::DescribeNetworkInterfacesById), 2);
        // Another cluster's, as seen: refused with no call.
        let foreign = enim_provider::fleet::FleetEni {
            cluster: Some("other".into()),
            ..eni.clone()
        };
        fleet
            .attach(&foreign, Slot::new(&instance_id(0), 3))
            .await
            .unwrap_err();
        assert_eq!(
            account.counts().get(Action::AttachNetworkInterface).failed,
            2
        );
        // Deletes: a second look spares it with no delete; without one,
        // EC2's refusal spares it.
        let r = fleet
            .delete(&eni.id, DeleteCheck::SecondLook)
            .await
            .unwrap();
        assert!(matches!(r, Reaped::Spared(_)), "{r:?}");
        assert_eq!(n(Action::DescribeNetworkInterfacesById), 3);
        assert_eq!(n(Action::DeleteNetworkInterface), 0);
        let r = fleet.delete(&eni.id, DeleteCheck::Listed).await.unwrap();
        assert!(matches!(r, Reaped::Spared(_)), "{r:?}");
        assert_eq!(n(Action::DescribeNetworkInterfacesById), 3);
        assert_eq!(n(Action::DeleteNetworkInterface), 1);
        assert_eq!(account.eni_count(), 1);
    });
}
