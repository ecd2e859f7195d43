//! The allocator over the in-memory cloud and store (`crate::testing`).

use std::sync::Arc;
use std::time::Duration;

use enim_core::ratelimit::RateLimit;
use enim_crd::{EniUse, NetResourceSetStatus, Watermarks};

use super::*;
use crate::config::ApiRates;
use crate::index::tests::node;
use crate::testing::{MemCloud, MemStore};

fn config() -> OperatorConfig {
    OperatorConfig {
        cluster: "c".into(),
        watermarks: enim_core::Watermarks {
            pre_allocate: 2,
            min_allocate: 0,
            max_above_watermark: 1,
        },
        subnets: vec!["subnet-1".into()],
        api: ApiRates {
            mutating_rate: RateLimit::new(Duration::from_millis(1), 1000),
            read_rate: RateLimit::new(Duration::from_millis(1), 1000),
        },
        ..OperatorConfig::default()
    }
}

struct Rig {
    cloud: Arc<MemCloud>,
    store: Arc<MemStore>,
    alloc: Allocator,
    nodes: Vec<NodeInfo>,
}

impl Rig {
    /// A new allocator with `config()` on a clock the test sets, started
    /// at the cloud's now: the clock, and that start.
    fn manual_clock(&mut self) -> (Arc<std::sync::Mutex<SystemTime>>, SystemTime) {
        let start = self.cloud.now.lock().unwrap().to_owned();
        let clock = Arc::new(std::sync::Mutex::new(start));
        let c = clock.clone();
        self.alloc = Allocator::new(self.cloud.clone(), self.store.clone(), config())
            .unwrap()
            .with_clock(Arc::new(move || *c.lock().unwrap()));
        (clock, start)
    }

    fn new(nodes: &[&str]) -> Rig {
        Rig::with(config(), nodes)
    }

    fn with(config: OperatorConfig, nodes: &[&str]) -> Rig {
        let cloud = Arc::new(MemCloud::default());
        let store = Arc::new(MemStore::default());
        let alloc = Allocator::new(cloud.clone(), store.clone(), config).unwrap();
        Rig {
            alloc,
            cloud,
            store,
            nodes: nodes.iter().map(|n| node(n)).collect(),
        }
    }

    /// A new leader: same cloud and store, nothing cached.
    fn successor(&mut self) {
        self.alloc = Allocator::new(self.cloud.clone(), self.store.clone(), config()).unwrap();
    }

    async fn resync(&self) -> ResyncReport {
        self.alloc
            .resync(&self.nodes, &self.store.sets())
            .await
            .unwrap()
    }

    fn spec_ids(&self, name: &str) -> Vec<String> {
        let s = self.store.set(name).unwrap();
        s.spec.enis.iter().map(|e| e.id.clone()).collect()
    }

    fn attached_to(&self, name: &str) -> usize {
        let inst = format!("i-{name}");
        self.cloud
            .enis()
            .iter()
            .filter(|e| e.attachment.as_ref().is_some_and(|a| a.instance == inst))
            .count()
    }
}

fn uses(ids: &[&str]) -> NetResourceSetStatus {
    NetResourceSetStatus {
        used: ids
            .iter()
            .map(|id| EniUse {
                eni: id.to_string(),
                container_id: format!("c-{id}"),
                ifname: "eth0".into(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// A node's instance type is asked of the cloud only once it is known
/// and the node is the cloud's instance: "" is an error on EC2, at every
/// resync, and a node without a providerID yet has no instance to serve.
#[tokio::test]
async fn limits_are_asked_only_for_a_known_type_of_the_clouds_instances() {
    let mut rig = Rig::new(&["a", "b"]);
    rig.nodes[0].instance_type.clear();
    rig.nodes[1].provider_id.clear();
    rig.nodes[1].instance_type = "m6".into();
    let r = rig.resync().await;
    assert_eq!(rig.cloud.calls("limits"), 0, "{r:?}");
    assert!(r.errors.is_empty(), "{r:?}");
    // Node b gets no set while it waits; node a's waits for its type.
    assert!(rig.store.set("b").is_none());
    assert!(rig.store.set("a").is_some_and(|s| s.spec.enis.is_empty()));

    rig.nodes[0].instance_type = "m5".into();
    rig.nodes[1].provider_id = "aws:///z1/i-b".into();
    rig.resync().await;
    assert_eq!(rig.cloud.calls("limits"), 2, "m5 and m6, once each");
    assert_eq!(rig.attached_to("b"), 2);
}

#[tokio::test]
async fn new_nodes_get_sets_and_enis_and_a_second_resync_does_nothing() {
    let rig = Rig::new(&["a", "b"]);
    let r = rig.resync().await;
    assert!(r.listed);
    assert_eq!(r.tasks_failed, 0, "{r:?}");
    for n in ["a", "b"] {
        let s = rig.store.set(n).unwrap();
        assert_eq!(s.spec.enis.len(), 2, "{n}");
        assert!(s.spec.intents.is_empty());
        assert_eq!(rig.attached_to(n), 2);
        assert_eq!(s.spec.instance.id, format!("i-{n}"));
        assert!(s.spec.enis.iter().all(|e| e.device_index.is_some()));
    }
    // Set + intents + publish, per node.
    assert_eq!(rig.store.writes(), 6);
    assert_eq!(rig.cloud.calls("list"), 1);
    assert_eq!(rig.cloud.calls("limits"), 1, "cached per instance type");
    // New intents' tokens were never sent: no look for their ENIs.
    assert_eq!(rig.cloud.calls("look"), 0);

    let r = rig.resync().await;
    assert!(!r.listed, "the listing is fresh: no describe");
    assert_eq!((r.tasks, r.writes, r.cloud_calls), (0, 0, 0), "{r:?}");
    assert_eq!(rig.cloud.calls("create"), 4);
}

#[tokio::test]
async fn a_lagging_watch_does_not_repeat_work() {
    let rig = Rig::new(&["a"]);
    rig.resync().await;
    // The runtime's cache has not seen any write yet.
    let r = rig.alloc.resync(&rig.nodes, &[]).await.unwrap();
    assert_eq!((r.tasks, r.writes), (0, 0), "{r:?}");
    assert_eq!(rig.cloud.calls("create"), 2, "no second round of creates");
    assert_eq!(rig.store.set("a").unwrap().spec.enis.len(), 2);
}

#[tokio::test]
async fn a_failed_attach_leaves_an_intent_the_next_leader_finishes_with_its_token() {
    let mut rig = Rig::new(&["a"]);
    rig.cloud.fail_next("attach", 1);
    let r = rig.resync().await;
    assert_eq!(r.tasks_failed, 1, "{r:?}");
    let s = rig.store.set("a").unwrap();
    assert_eq!(s.spec.enis.len(), 1);
    assert_eq!(s.spec.intents.len(), 1, "the failed one's intent stays");
    let token = s.spec.intents[0].client_token.clone();
    let loose: Vec<_> = rig
        .cloud
        .enis()
        .into_iter()
        .filter(|e| e.attachment.is_none())
        .collect();
    assert_eq!(loose.len(), 1);
    assert_eq!(loose[0].intent.as_deref(), Some(token.as_str()));

    rig.successor();
    let r = rig.resync().await;
    assert_eq!(r.by_kind.get("finish-intent"), Some(&1), "{r:?}");
    assert_eq!(r.tasks_failed, 0, "{r:?}");
    let s = rig.store.set("a").unwrap();
    assert!(s.spec.intents.is_empty());
    assert_eq!(s.spec.enis.len(), 2);
    assert!(s.spec.enis.iter().any(|e| e.id == loose[0].id));
    assert_eq!(rig.cloud.enis().len(), 2, "no second ENI for the intent");
    assert_eq!(rig.attached_to("a"), 2);
}

#[tokio::test]
async fn an_intent_without_its_eni_is_created_with_the_same_token() {
    let mut rig = Rig::new(&["a"]);
    rig.cloud.fail_next("create", 2);
    rig.resync().await;
    let tokens: Vec<String> = rig
        .store
        .set("a")
        .unwrap()
        .spec
        .intents
        .iter()
        .map(|i| i.client_token.clone())
        .collect();
    assert_eq!(tokens.len(), 2);
    assert!(rig.cloud.enis().is_empty());
    rig.successor();
    rig.resync().await;
    let mut made: Vec<String> = rig
        .cloud
        .enis()
        .into_iter()
        .filter_map(|e| e.intent)
        .collect();
    made.sort();
    let mut want = tokens;
    want.sort();
    assert_eq!(made, want);
    assert!(rig.store.set("a").unwrap().spec.intents.is_empty());
    // Tokens found in the spec may have been sent: looked for first.
    assert_eq!(rig.cloud.calls("look-intent"), 2);
    assert_eq!(rig.cloud.calls("create"), 4);
}

#[tokio::test]
async fn a_retry_in_the_same_process_looks_for_the_intents_eni() {
    let rig = Rig::new(&["a"]);
    rig.cloud.fail_next("create", 1);
    let r = rig.resync().await;
    assert_eq!(r.tasks_failed, 1, "{r:?}");
    assert_eq!(rig.cloud.calls("look-intent"), 0, "the first try was fresh");
    rig.alloc.invalidate_listing();
    let r = rig.resync().await;
    assert_eq!(r.by_kind.get("finish-intent"), Some(&1), "{r:?}");
    assert_eq!(rig.cloud.calls("look-intent"), 1, "the retry is not");
    assert_eq!(rig.spec_ids("a").len(), 2);
    assert_eq!(rig.cloud.enis().len(), 2);
}

#[tokio::test]
async fn the_surplus_is_drained_and_only_released_enis_leave() {
    let mut cfg = config();
    cfg.watermarks.pre_allocate = 5;
    let mut rig = Rig::with(cfg, &["a"]);
    rig.resync().await;
    assert_eq!(rig.spec_ids("a").len(), 5);
    // The policy drops to 2 free (+1 above): with one used, one must go,
    // once the surplus has lasted drain_delay (30 s).
    let (clock, start) = rig.manual_clock();
    let ids = rig.spec_ids("a");
    rig.store.edit("a", |s| s.status = Some(uses(&[&ids[4]])));
    rig.resync().await;
    *clock.lock().unwrap() = start + Duration::from_secs(29);
    rig.resync().await;
    let s = rig.store.set("a").unwrap();
    assert!(s.spec.draining.is_empty(), "drained within drain_delay");
    *clock.lock().unwrap() = start + Duration::from_secs(30);
    rig.resync().await;
    let s = rig.store.set("a").unwrap();
    assert_eq!(s.spec.draining.len(), 1, "{:?}", s.spec.draining);
    assert!(
        !s.spec.draining.contains(&ids[4]),
        "a used ENI is never drained"
    );
    assert_eq!(
        rig.attached_to("a"),
        5,
        "nothing detached before the agent answers"
    );
    // The agent releases one of them.
    let released = s.spec.draining[0].clone();
    rig.store.edit("a", |s| {
        s.status.as_mut().unwrap().released = vec![released.clone()];
    });
    rig.cloud.detach_takes_listings(1);
    rig.alloc.invalidate_listing();
    // 1. The detach is only asked for: no wait, no delete, still in the spec.
    let r = rig.resync().await;
    assert_eq!((r.by_kind.get("reclaim"), r.tasks_failed), (Some(&1), 0));
    assert_eq!(
        (rig.cloud.calls("detach"), rig.cloud.calls("delete")),
        (1, 0)
    );
    let state = |rig: &Rig| {
        let e = rig.cloud.enis().into_iter().find(|e| e.id == released);
        e.map(|e| e.attachment.map(|a| a.state))
    };
    assert_eq!(state(&rig), Some(Some("detaching".into())));
    let in_spec = |rig: &Rig| rig.spec_ids("a").contains(&released);
    assert!(in_spec(&rig));
    // From the cached listing (amended: detaching): nothing to ask again.
    let r = rig.resync().await;
    assert!(!r.listed);
    assert_eq!((r.tasks, r.cloud_calls), (0, 0), "{r:?}");
    // 2. A listing shows it still detaching: wait.
    rig.alloc.invalidate_listing();
    let r = rig.resync().await;
    assert_eq!((r.tasks, r.cloud_calls), (0, 1), "only the listing: {r:?}");
    assert!(in_spec(&rig));
    // 3. A listing shows it attached nowhere: deleted, then out of the spec.
    rig.alloc.invalidate_listing();
    let r = rig.resync().await;
    assert_eq!(r.by_kind.get("reclaim"), Some(&1), "{r:?}");
    assert_eq!(
        (rig.cloud.calls("detach"), rig.cloud.calls("delete")),
        (1, 1)
    );
    let s = rig.store.set("a").unwrap();
    assert_eq!(rig.attached_to("a"), 4);
    assert_eq!(state(&rig), None, "deleted");
    assert!(!s.spec.enis.iter().any(|e| e.id == released));
    assert!(s.spec.draining.is_empty());
    assert_eq!(
        rig.cloud.calls("list"),
        5,
        "one listing a step, none polled"
    );
    assert_eq!(rig.cloud.calls("look"), 0, "ours, detached by us: no look");
}

#[tokio::test]
async fn a_gone_node_is_released_after_its_grace() {
    let mut rig = Rig::new(&["a", "b"]);
    let (clock, start) = rig.manual_clock();
    rig.resync().await;
    rig.nodes.retain(|n| n.name != "a");
    rig.resync().await;
    assert!(rig.store.set("a").is_some(), "within the grace");
    assert_eq!(rig.attached_to("a"), 2);
    *clock.lock().unwrap() = start + Duration::from_secs(301);
    // 1. Its ENIs' detaches are asked for; the set stays.
    let r = rig.resync().await;
    assert_eq!(r.by_kind.get("release-node"), Some(&1), "{r:?}");
    assert_eq!(
        (rig.cloud.calls("detach"), rig.cloud.calls("delete")),
        (2, 0)
    );
    assert!(rig.store.set("a").is_some(), "kept while its ENIs detach");
    assert_eq!(rig.attached_to("a"), 2, "detaching");
    // 2. The next listing shows them attached nowhere: deleted, set let go.
    rig.alloc.invalidate_listing();
    let r = rig.resync().await;
    assert_eq!(r.by_kind.get("release-node"), Some(&1), "{r:?}");
    assert_eq!(r.tasks_failed, 0, "{r:?}");
    assert_eq!(
        (rig.cloud.calls("detach"), rig.cloud.calls("delete")),
        (2, 2)
    );
    assert!(rig.store.set("a").is_none(), "the set is let go");
    assert_eq!(rig.cloud.calls("look-delete"), 0);
    assert!(rig
        .cloud
        .enis()
        .iter()
        .all(|e| e.node.as_deref() == Some("i-b")));
}

#[tokio::test]
async fn leaks_are_deleted_on_a_fresh_listing_only_after_the_cooldown() {
    let rig = Rig::new(&["a"]);
    rig.resync().await;
    let mut leak = rig.cloud.enis()[0].clone();
    leak.id = "eni-leak".into();
    leak.attachment = None;
    leak.intent = None;
    let now = *rig.cloud.now.lock().unwrap();
    leak.created_at = enim_provider::cloud::CreatedAt::At(now - Duration::from_secs(3600));
    rig.cloud.insert(leak);
    let mut cfg = config();
    cfg.reap_interval = Duration::from_secs(3600);
    let alloc = Allocator::new(rig.cloud.clone(), rig.store.clone(), cfg)
        .unwrap()
        .with_clock(Arc::new(move || now));
    let r = alloc.resync(&rig.nodes, &rig.store.sets()).await.unwrap();
    assert_eq!(r.by_kind.get("delete-leaked"), Some(&1), "{r:?}");
    assert!(!rig.cloud.enis().iter().any(|e| e.id == "eni-leak"));
    // Found, not made leaving by us: looked at again before the delete.
    assert_eq!(rig.cloud.calls("look-delete"), 1);
    assert_eq!(rig.cloud.enis().len(), 2);
}

#[tokio::test]
async fn no_call_and_no_write_without_leadership() {
    let rig = Rig::new(&["a", "b", "c"]);
    rig.store.set_leader(false);
    assert!(matches!(rig.resync_err().await, Error::NotLeader));
    assert_eq!(rig.cloud.calls("list"), 0);
    // Deposed in the middle: the rest stops.
    rig.store.set_leader(true);
    rig.store.lose_leadership_after(2);
    assert!(matches!(rig.resync_err().await, Error::NotLeader));
    let creates = rig.cloud.calls("create");
    assert!(creates <= 2, "{creates} creates");
    assert_eq!(rig.store.writes(), 2);
}

#[tokio::test]
async fn past_the_leader_deadline_nothing_is_called_or_written() {
    // The lease manager's flag is up, but the Lease was not renewed in
    // time: the refusal is typed, and nothing reaches the cloud or the API.
    let rig = Rig::new(&["a", "b"]);
    let late = Duration::from_millis(300);
    rig.store.set_past_deadline(Some(late));
    match rig.resync_err().await {
        Error::PastDeadline(d) => assert_eq!(d, late),
        other => panic!("{other:?}"),
    }
    assert_eq!(rig.cloud.total_calls(), 0, "a cloud call past the deadline");
    assert_eq!(rig.store.writes(), 0, "a write past the deadline");
    // Renewed in time again: the work is done.
    rig.store.set_past_deadline(None);
    let r = rig.resync().await;
    assert_eq!(r.tasks_failed, 0, "{r:?}");
    assert_eq!(rig.attached_to("a") + rig.attached_to("b"), 4);
}

impl Rig {
    async fn resync_err(&self) -> Error {
        self.alloc
            .resync(&self.nodes, &self.store.sets())
            .await
            .unwrap_err()
    }
}

#[tokio::test(start_paused = true)]
async fn the_mutating_bucket_paces_the_whole_cluster() {
    let mut cfg = config();
    cfg.api.mutating_rate = RateLimit::new(Duration::from_secs(1), 2);
    cfg.watermarks = enim_core::Watermarks {
        pre_allocate: 1,
        min_allocate: 0,
        max_above_watermark: 0,
    };
    let rig = Rig::with(cfg, &["a", "b", "c"]);
    let t0 = Instant::now();
    rig.resync().await;
    // Six mutating calls (create + attach per node), two at once, then
    // one a second.
    assert_eq!(rig.cloud.calls("create") + rig.cloud.calls("attach"), 6);
    assert_eq!(t0.elapsed(), Duration::from_secs(4));
}

#[test]
fn tokens_are_unique_and_fit_a_cloud_token() {
    let rig = Rig::new(&[]);
    let a: std::collections::HashSet<String> = (0..1000).map(|_| rig.alloc.new_token()).collect();
    assert_eq!(a.len(), 1000);
    assert!(a.iter().all(|t| t.len() <= 64 && t.is_ascii()));
}

#[test]
fn watermarks_are_the_configs() {
    let w: Watermarks = config().watermarks;
    assert_eq!(w.pre_allocate, 2);
}

/// A node the static inventory has no ENIs for: every resync plans its
/// pool's creates and the inventory refuses them. The refusal is reported
/// (and so logged) by the first resync only, counted by every one.
#[tokio::test]
async fn a_node_without_inventory_in_a_static_cloud_is_told_once() {
    // node-b's ENIs set the limits: node-a has room for ENIs, none listed.
    let inventory: enim_provider_static::StaticFleetConfig = toml::from_str(
        "[[nodes.node-b]]\nid = \"eni-b1\"\nmac = \"02:00:00:00:0b:01\"\nipv4 = \"10.0.0.10/24\"\ngateway4 = \"10.0.0.1\"\n\
         [[nodes.node-b]]\nid = \"eni-b2\"\nmac = \"02:00:00:00:0b:02\"\nipv4 = \"10.0.0.11/24\"\ngateway4 = \"10.0.0.1\"\n",
    )
    .unwrap();
    let cloud = enim_provider_static::StaticFleet::new(&inventory).unwrap();
    let store = Arc::new(MemStore::default());
    let alloc = Allocator::new(Arc::new(cloud), store.clone(), config()).unwrap();
    // A static cloud's node, known by name: no providerID.
    let mut static_node = node("node-a");
    static_node.provider_id.clear();
    let nodes = [static_node];
    let resync = || async { alloc.resync(&nodes, &store.sets()).await.unwrap() };
    let first = resync().await;
    assert!(first.tasks_failed > 0, "{first:?}");
    assert!(
        first
            .errors
            .iter()
            .any(|e| e.starts_with("node node-a:") && e.contains("static inventory cannot")),
        "{first:?}"
    );
    for _ in 0..2 {
        let again = resync().await;
        assert!(again.tasks_failed > 0, "still failing: {again:?}");
        assert!(again.errors.is_empty(), "told again: {again:?}");
    }
}

/// Pools end to end over the in-memory cloud: each node's set and ENIs
/// as its pool says (the pool's subnet and groups on the cloud's ENIs),
/// nothing for a node in no pool, a pool's changed settings written, and a
/// late instance type filled in, then the node filled up.
#[tokio::test]
async fn pools_set_each_nodes_settings_and_a_late_instance_type_is_filled_in() {
    let pool = |name: &str, mode: &str, pre: u32| {
        format!(
            "[[pools]]\nname = \"{name}\"\nnode_selector = {{ \"enim.io/pool\" = \"{name}\" }}\n\
             mode = \"{mode}\"\nsubnets = [\"subnet-{name}\"]\nsecurity_groups = [\"sg-{name}\"]\n\
             [pools.watermarks]\npre_allocate = {pre}\n"
        )
    };
    let text = format!(
        "cluster = \"c\"\n{}{}",
        pool("prim", "primary", 1),
        pool("sec", "secondary", 12)
    );
    let cfg = OperatorConfig {
        api: config().api,
        ..OperatorConfig::from_toml(&text).unwrap()
    };
    let mut rig = Rig::with(cfg.clone(), &["p", "s", "own"]);
    for (n, value) in rig.nodes.iter_mut().zip(["prim", "sec", "per-node"]) {
        n.labels.insert("enim.io/pool".into(), value.into());
    }
    let r = rig.resync().await;
    assert_eq!(r.tasks_failed, 0, "{r:?}");
    let p = rig.store.set("p").unwrap().spec;
    assert_eq!((p.mode, p.enis.len()), (enim_core::Mode::Primary, 1));
    let s = rig.store.set("s").unwrap().spec;
    assert_eq!(s.mode, enim_core::Mode::Secondary);
    // 12 addresses: MemCloud's ENIs hold 9 besides their primary one.
    let ips: usize = s.enis.iter().map(|e| e.secondary_ips.len()).sum();
    assert_eq!((s.enis.len(), ips), (2, 12));
    assert!(
        rig.store.set("own").is_none(),
        "no set for a node in no pool"
    );
    assert_eq!(rig.attached_to("own"), 0);
    for (node, pool) in [("i-p", "prim"), ("i-s", "sec")] {
        for e in rig
            .cloud
            .enis()
            .iter()
            .filter(|e| e.node.as_deref() == Some(node))
        {
            assert_eq!(e.subnet, format!("subnet-{pool}"));
            assert_eq!(e.security_groups, [format!("sg-{pool}")]);
        }
    }

    // The primary pool keeps two free: its set is rewritten, one more made.
    let mut more = cfg.clone();
    more.pools[0].watermarks = Some(enim_core::Watermarks {
        pre_allocate: 2,
        ..crate::config::DEFAULT_WATERMARKS
    });
    rig.alloc = Allocator::new(rig.cloud.clone(), rig.store.clone(), more.clone()).unwrap();
    let r = rig.resync().await;
    assert_eq!(r.by_kind.get("refresh-policy"), Some(&1), "{r:?}");
    let p = rig.store.set("p").unwrap().spec;
    assert_eq!((p.watermarks.pre_allocate, p.enis.len()), (2, 2));

    // Its groups change: the ENIs made with the old ones are pinned to
    // them (published as what they are), drained, and replaced by ENIs of
    // the new groups.
    let mut regrouped = more.clone();
    regrouped.pools[0].security_groups = Some(vec!["sg-new".into()]);
    rig.alloc = Allocator::new(rig.cloud.clone(), rig.store.clone(), regrouped).unwrap();
    let old: Vec<String> = rig.spec_ids("p");
    let r = rig.resync().await;
    assert_eq!(r.by_kind.get("refresh-policy"), Some(&1), "{r:?}");
    let p = rig.store.set("p").unwrap().spec;
    assert_eq!(p.security_groups, ["sg-new"]);
    for e in p.enis.iter().filter(|e| old.contains(&e.id)) {
        assert_eq!(e.security_groups, ["sg-prim"], "pinned: {e:?}");
    }
    // The next pass plans on the pinned spec.
    rig.resync().await;
    let p = rig.store.set("p").unwrap().spec;
    let mut draining = p.draining.clone();
    draining.sort();
    let mut want = old.clone();
    want.sort();
    assert_eq!(draining, want, "{p:?}");
    let new: Vec<_> = rig
        .cloud
        .enis()
        .into_iter()
        .filter(|e| e.node.as_deref() == Some("i-p") && !old.contains(&e.id))
        .collect();
    assert_eq!(new.len(), 2, "two of the new groups made");
    assert!(new.iter().all(|e| e.security_groups == ["sg-new"]));

    // A node registered before the cloud controller labelled its type:
    // the cloud knows no limits for no type (as EC2), so it gets no ENI.
    rig.nodes.push(node("late"));
    let late = rig.nodes.last_mut().unwrap();
    late.labels.insert("enim.io/pool".into(), "prim".into());
    late.instance_type.clear();
    rig.cloud.fail_next("limits", 1);
    let type_and_enis = |rig: &Rig| {
        let spec = rig.store.set("late").unwrap().spec;
        (spec.instance.instance_type, spec.enis.len())
    };
    let r = rig.resync().await;
    assert_eq!(r.by_kind.get("create-set"), Some(&1), "{r:?}");
    assert_eq!(type_and_enis(&rig), (String::new(), 0));
    rig.nodes.last_mut().unwrap().instance_type = "m5".into();
    let r = rig.resync().await;
    assert_eq!(r.by_kind.get("fill-instance-type"), Some(&1), "{r:?}");
    assert_eq!(type_and_enis(&rig), ("m5".to_string(), 2));
}

/// A rig of node "a", filled once, whose allocator notes the cloud's
/// refusals of policies' ENIs where the test can read them.
async fn rig_noting_refusals() -> (Rig, Arc<Refusals>) {
    let mut rig = Rig::new(&["a"]);
    let refusals = Arc::new(Refusals::default());
    rig.alloc = Allocator::new(rig.cloud.clone(), rig.store.clone(), config())
        .unwrap()
        .with_refusals(refusals.clone());
    rig.resync().await;
    (rig, refusals)
}

/// `policy` keeping one ENI of group sg-db warm.
fn warm_of(policy: &str) -> WarmPool {
    WarmPool {
        policy: policy.into(),
        want: enim_crd::EniParameters {
            security_groups: vec!["sg-db".into()],
            ..Default::default()
        },
        count: 1,
    }
}

/// The agent's condition saying it serves DRA claims.
fn serving_claims(st: &mut NetResourceSetStatus) {
    st.conditions
        .push(k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: enim_crd::CONDITION_SERVES_CLAIMS.into(),
            status: "True".into(),
            reason: "Test".into(),
            message: String::new(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
            observed_generation: None,
        });
}

/// A claim whose ENI the cloud refuses for good (its subnet or groups do
/// not exist): nothing was made, so its intent is dropped rather than sent
/// again at every resync; the claim waits out `CLAIM_RETRY`, its policy
/// is noted for its status, and after the wait it is tried again.
#[tokio::test(start_paused = true)]
async fn a_claim_the_cloud_refuses_waits_and_its_policy_hears_of_it() {
    let (rig, refusals) = rig_noting_refusals().await;
    let pool = rig.spec_ids("a");
    assert_eq!(pool.len(), 2);
    // Its agent serves claims, and pods hold both pool ENIs.
    rig.store.edit("a", |s| {
        let mut st = uses(&pool.iter().map(String::as_str).collect::<Vec<_>>());
        serving_claims(&mut st);
        s.status = Some(st);
    });
    let claims = [ClaimInfo {
        claim: enim_crd::ClaimRef {
            namespace: "web".into(),
            name: "db-1-eni".into(),
            uid: "u1".into(),
        },
        pending: true,
        want: Some(enim_crd::EniParameters {
            security_groups: vec!["sg-db".into()],
            ..Default::default()
        }),
        pod: Some(("db-1".into(), "p1".into())),
        policy: Some("db".into()),
    }];
    async fn pass(rig: &Rig, claims: &[ClaimInfo]) -> ResyncReport {
        rig.alloc
            .resync_with(
                &rig.nodes,
                &rig.store.sets(),
                Demand {
                    claims: Some(claims),
                    warm: None,
                },
            )
            .await
            .unwrap()
    }
    // The pool makes up its free ENIs first (of its own groups: no match).
    rig.resync().await;
    assert_eq!(rig.spec_ids("a").len(), 4);
    rig.cloud.refuse_next("create", 1);
    let creates = rig.cloud.calls("create");
    let r = pass(&rig, &claims).await;
    assert_eq!(rig.cloud.calls("create"), creates + 1, "{r:?}");
    let spec = rig.store.set("a").unwrap().spec;
    assert!(
        spec.intents.is_empty(),
        "the refused intent is dropped: {spec:?}"
    );
    assert_eq!(spec.enis.len(), 4);

    // The next passes: not tried again, and the policy hears why.
    for _ in 0..2 {
        pass(&rig, &claims).await;
        assert_eq!(rig.cloud.calls("create"), creates + 1);
    }
    let refused = refusals.of("db").expect("noted");
    assert_eq!(refused.made_for, "claim web/db-1-eni");
    assert!(
        refused.error.contains("InvalidSubnetID.NotFound"),
        "{refused:?}"
    );

    // Once the wait is over it is tried again, and made this time.
    tokio::time::advance(CLAIM_RETRY + Duration::from_secs(1)).await;
    pass(&rig, &claims).await;
    assert_eq!(rig.cloud.calls("create"), creates + 2);
    let spec = rig.store.set("a").unwrap().spec;
    let made: Vec<_> = spec.enis.iter().filter_map(|e| e.claim.as_ref()).collect();
    assert_eq!(made.len(), 1, "{spec:?}");
    assert_eq!(made[0].uid, "u1");
}

/// A warm create cut short (its create, or its attach, failed and left
/// the intent, as a crash after the intent or the create would): the next
/// leader finishes it with the policy's groups and marks it with the
/// policy, and makes no second one meanwhile.
#[tokio::test]
async fn a_policys_unfinished_warm_create_is_finished_as_the_policys() {
    for verb in ["create", "attach"] {
        let mut rig = Rig::new(&["a"]);
        rig.resync().await;
        rig.store.edit("a", |s| {
            let mut st = NetResourceSetStatus::default();
            serving_claims(&mut st);
            s.status = Some(st);
        });
        let warm = [warm_of("db")];
        let demand = Demand {
            claims: None,
            warm: Some(&warm),
        };
        rig.cloud.fail_next(verb, 1);
        let r = rig
            .alloc
            .resync_with(&rig.nodes, &rig.store.sets(), demand)
            .await
            .unwrap();
        assert_eq!(r.tasks_failed, 1, "{verb}: {r:?}");
        let spec = rig.store.set("a").unwrap().spec;
        assert_eq!(spec.intents.len(), 1, "{verb}");
        assert_eq!(spec.intents[0].policy.as_deref(), Some("db"));
        assert_eq!(spec.intents[0].security_groups, ["sg-db"]);
        let creates = rig.cloud.calls("create");

        rig.successor();
        let r = rig
            .alloc
            .resync_with(&rig.nodes, &rig.store.sets(), demand)
            .await
            .unwrap();
        assert_eq!(r.by_kind.get("finish-intent"), Some(&1), "{verb}: {r:?}");
        assert_eq!(
            r.by_kind.get("create-warm"),
            None,
            "{verb}: the intent counts"
        );
        let spec = rig.store.set("a").unwrap().spec;
        assert!(spec.intents.is_empty(), "{verb}");
        let kept: Vec<_> = spec
            .enis
            .iter()
            .filter(|e| e.policy.as_deref() == Some("db"))
            .collect();
        assert_eq!(kept.len(), 1, "{verb}: {spec:?}");
        assert_eq!(kept[0].security_groups, ["sg-db"]);
        let in_cloud = rig.cloud.enis();
        let made = in_cloud
            .iter()
            .find(|e| e.id == kept[0].id)
            .expect("in the cloud");
        assert_eq!(made.security_groups, ["sg-db"], "{verb}");
        let more = usize::from(verb == "create");
        assert_eq!(rig.cloud.calls("create"), creates + more, "{verb}");
    }
}

/// A policy's warm ENI: made in the cloud with its groups, published
/// marked with it, made once, and drained once the policy keeps none. A
/// warm create the cloud refuses for good drops its intent, waits out
/// `CLAIM_RETRY`, and the policy hears of it.
#[tokio::test(start_paused = true)]
async fn a_policys_warm_eni_is_made_kept_and_drained_and_a_refusal_waits() {
    let (rig, refusals) = rig_noting_refusals().await;
    rig.store.edit("a", |s| {
        let mut st = NetResourceSetStatus::default();
        serving_claims(&mut st);
        s.status = Some(st);
    });
    let warm = warm_of;
    async fn pass(rig: &Rig, warm: &[WarmPool]) -> ResyncReport {
        let demand = Demand {
            claims: None,
            warm: Some(warm),
        };
        let sets = rig.store.sets();
        rig.alloc
            .resync_with(&rig.nodes, &sets, demand)
            .await
            .unwrap()
    }
    let creates = rig.cloud.calls("create");
    pass(&rig, &[warm("db")]).await;
    assert_eq!(rig.cloud.calls("create"), creates + 1);
    let spec = rig.store.set("a").unwrap().spec;
    let kept: Vec<_> = spec
        .enis
        .iter()
        .filter(|e| e.policy.as_deref() == Some("db"))
        .collect();
    assert_eq!(kept.len(), 1, "{spec:?}");
    assert_eq!(kept[0].security_groups, ["sg-db"]);
    assert!(kept[0].claim.is_none() && spec.intents.is_empty());
    let id = kept[0].id.clone();
    // Kept: nothing more is made.
    pass(&rig, &[warm("db")]).await;
    assert_eq!(rig.cloud.calls("create"), creates + 1);
    // The policy keeps none now: it is asked back.
    pass(&rig, &[]).await;
    let spec = rig.store.set("a").unwrap().spec;
    assert!(spec.draining.contains(&id), "{spec:?}");

    // Another policy whose warm ENI the cloud refuses.
    rig.cloud.refuse_next("create", 1);
    pass(&rig, &[warm("web")]).await;
    assert_eq!(rig.cloud.calls("create"), creates + 2);
    let spec = rig.store.set("a").unwrap().spec;
    assert!(spec.intents.is_empty(), "dropped: {spec:?}");
    let refused = refusals.of("web").expect("noted");
    assert_eq!(refused.made_for, "its warm ENIs");
    pass(&rig, &[warm("web")]).await;
    assert_eq!(rig.cloud.calls("create"), creates + 2, "not again yet");
    tokio::time::advance(CLAIM_RETRY + Duration::from_secs(1)).await;
    pass(&rig, &[warm("web")]).await;
    assert_eq!(rig.cloud.calls("create"), creates + 3);
    let spec = rig.store.set("a").unwrap().spec;
    assert!(spec.enis.iter().any(|e| e.policy.as_deref() == Some("web")));
}
