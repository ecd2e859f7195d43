//! `plan` on plain data: clusters in, tasks out.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use enim_core::{AddressLimits, MacAddr};
use enim_crd::{EniSpec, EniUse, Intent, Mode, NetResourceSetStatus, Quarantined, Watermarks};
use enim_provider::cloud::CreatedAt;
use enim_provider::fleet::DeleteCheck::{Listed, SecondLook};
use enim_provider::fleet::{FleetAttachment, FleetEni};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;

mod claims;
mod pools;
mod properties;
mod warm;

pub(super) const T0: u64 = 1_800_000_000;

pub(super) fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(T0)
}

pub(super) fn policy(mode: Mode) -> Policy {
    Policy {
        cluster: "c".into(),
        mode,
        watermarks: Watermarks {
            pre_allocate: 2,
            min_allocate: 0,
            max_above_watermark: 1,
        },
        subnets: vec!["subnet-1".into()],
        security_groups: vec!["sg-1".into()],
        pools: Vec::new(),
        node_grace: Duration::from_secs(300),
        reap_cooldown: Duration::from_secs(600),
        drain_delay: Duration::ZERO,
    }
}

pub(crate) fn node(name: &str) -> NodeInfo {
    NodeInfo {
        name: name.into(),
        uid: format!("uid-{name}"),
        provider_id: format!("aws:///z1/i-{name}"),
        instance_type: "m5".into(),
        zone: "z1".into(),
        labels: Default::default(),
    }
}

pub(super) fn inst(name: &str) -> String {
    format!("i-{name}")
}

pub(super) fn fleet_eni(id: &str, attached: Option<(&str, u32)>, tagged: Option<&str>) -> FleetEni {
    let n: u8 = id
        .bytes()
        .fold(0u8, |a, b| a.wrapping_mul(31).wrapping_add(b));
    FleetEni {
        id: id.into(),
        mac: MacAddr([2, 0, 0, 0, 1, n]),
        ipv4: format!("10.0.1.{n}/24").parse().unwrap(),
        gateway4: Ipv4Addr::new(10, 0, 1, 1),
        ipv6: None,
        gateway6: None,
        subnet: "subnet-1".into(),
        security_groups: vec!["sg-1".into()],
        secondary_ips: Vec::new(),
        attachment: attached.map(|(node, device_index)| FleetAttachment {
            instance: inst(node),
            device_index,
            attachment_id: format!("attach-{id}"),
            state: "attached".into(),
        }),
        node: tagged.map(inst),
        intent: None,
        cluster: Some("c".into()),
        created_at: CreatedAt::At(now() - Duration::from_secs(3600)),
    }
}

pub(super) fn spec_eni(id: &str, device_index: u32) -> EniSpec {
    let mut s = eni_spec(&fleet_eni(id, Some(("x", device_index)), None));
    s.device_index = Some(device_index);
    s
}

pub(super) fn used(eni: &str, ip: Option<&str>) -> EniUse {
    EniUse {
        eni: eni.into(),
        ip: ip.map(|s| s.parse().unwrap()),
        pod_name: format!("pod-{eni}"),
        container_id: format!("c-{eni}"),
        ifname: "eth0".into(),
        ..Default::default()
    }
}

pub(super) fn set_of(policy: &Policy, n: &NodeInfo, enis: Vec<EniSpec>) -> SetInfo {
    let mut spec = policy.new_spec(instance_of(n));
    spec.enis = enis;
    SetInfo {
        name: n.name.clone(),
        spec,
        status: Some(NetResourceSetStatus::default()),
        deleting_since: None,
        uninstall: Default::default(),
    }
}

pub(super) fn status(s: &mut SetInfo) -> &mut NetResourceSetStatus {
    s.status.get_or_insert_with(Default::default)
}

pub(super) fn intent(token: &str) -> Intent {
    Intent {
        client_token: token.into(),
        action: ACTION_CREATE_ATTACH.into(),
        eni: String::new(),
        since: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        claim: None,
        policy: None,
        subnet: String::new(),
        security_groups: Vec::new(),
    }
}

pub(super) struct World {
    pub policy: Policy,
    pub nodes: Vec<NodeInfo>,
    pub sets: Vec<SetInfo>,
    pub enis: Vec<FleetEni>,
    pub limits: HashMap<String, AddressLimits>,
    pub gone: HashMap<String, SystemTime>,
    pub surplus_since: HashMap<String, SystemTime>,
    pub reap: bool,
    pub now: SystemTime,
    pub claims: Option<Vec<ClaimInfo>>,
    /// Claims the cloud refused lately (see `Input::refused`).
    pub refused: HashMap<String, String>,
    /// The policies keeping ENIs warm (see `Input::warm`).
    pub warm: Option<Vec<WarmPool>>,
    /// The provider the operator's cloud serves.
    pub cloud: &'static str,
}

impl World {
    pub fn new(mode: Mode) -> World {
        World {
            policy: policy(mode),
            nodes: Vec::new(),
            sets: Vec::new(),
            enis: Vec::new(),
            limits: HashMap::from([(
                "m5".to_string(),
                AddressLimits {
                    ipv4_per_eni: 5,
                    ipv6_per_eni: 0,
                    enis: 4,
                },
            )]),
            gone: HashMap::new(),
            surplus_since: HashMap::new(),
            reap: false,
            now: now(),
            claims: None,
            refused: HashMap::new(),
            warm: None,
            cloud: "aws",
        }
    }

    /// A node with its set holding `enis` (device indexes 1, 2, ...),
    /// each also listed attached and tagged.
    pub fn live(&mut self, name: &str, enis: &[&str]) -> &mut SetInfo {
        let n = node(name);
        let mut specs = Vec::new();
        for (i, id) in (1u32..).zip(enis) {
            specs.push(spec_eni(id, i));
            self.enis.push(fleet_eni(id, Some((name, i)), Some(name)));
        }
        let s = set_of(&self.policy, &n, specs);
        self.nodes.push(n);
        self.sets.push(s);
        self.sets.last_mut().unwrap()
    }

    pub fn set(&mut self, name: &str) -> &mut SetInfo {
        self.sets.iter_mut().find(|s| s.name == name).unwrap()
    }

    pub fn input(&self) -> Input<'_> {
        Input {
            policy: &self.policy,
            nodes: &self.nodes,
            sets: &self.sets,
            enis: &self.enis,
            limits: &self.limits,
            gone_since: &self.gone,
            surplus_since: &self.surplus_since,
            reap_leaks: self.reap,
            now: self.now,
            claims: self.claims.as_deref(),
            refused: &self.refused,
            warm: self.warm.as_deref(),
            cloud: self.cloud,
        }
    }

    pub fn plan(&self) -> Vec<Task> {
        plan(&Index::build(self.input()))
    }

    /// The claims its plan leaves unservable, by uid, with why.
    pub fn unservable(&self) -> Vec<(String, String)> {
        let index = Index::build(self.input());
        unservable_claims(&index, &plan(&index))
            .into_iter()
            .map(|(c, why)| (c.claim.uid, why))
            .collect()
    }
}

fn kinds(tasks: &[Task]) -> Vec<(&'static str, Option<&str>)> {
    tasks.iter().map(|t| (t.kind(), t.node())).collect()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn a_new_node_gets_its_set_and_its_preallocation() {
    let mut w = World::new(Mode::Primary);
    w.nodes.push(node("a"));
    let tasks = w.plan();
    let Task::CreateSet { node, spec } = &tasks[0] else {
        panic!("{tasks:?}")
    };
    assert_eq!(node, "a");
    assert_eq!(spec.instance.id, "i-a");
    assert_eq!(spec.instance.provider, "aws");
    assert_eq!(spec.watermarks, w.policy.watermarks);
    assert!(spec.enis.is_empty());
    assert_eq!(
        tasks[1],
        Task::CreateEnis {
            node: "a".into(),
            device_indexes: vec![1, 2],
            secondary_ipv4: 0
        }
    );
    assert_eq!(tasks.len(), 2);

    // An unknown instance type: the set, but nothing to create with.
    w.limits.clear();
    assert_eq!(kinds(&w.plan()), [("create-set", Some("a"))]);
}

#[test]
fn a_node_gets_a_set_only_once_its_provider_id_names_an_instance_of_the_cloud() {
    let mut w = World::new(Mode::Primary);
    // Registered before a cloud controller set its providerID.
    let mut n = node("a");
    n.provider_id.clear();
    w.nodes.push(n);
    assert_eq!(w.plan(), []);
    let index = Index::build(w.input());
    let Serving::NoInstance(why) = index.nodes[0].serving else {
        panic!("{:?}", index.nodes[0].serving)
    };
    assert_eq!(
        why.to_string(),
        "it has no providerID yet, so no aws instance"
    );
    // Another cloud's instance: not this operator's either.
    w.nodes[0].provider_id = "bce://i-x".into();
    assert_eq!(w.plan(), []);

    // Once set, the node is served with its instance.
    w.nodes[0].provider_id = "aws:///z1/i-a".into();
    let tasks = w.plan();
    let Task::CreateSet { spec, .. } = &tasks[0] else {
        panic!("{tasks:?}")
    };
    assert_eq!(
        (spec.instance.provider.as_str(), spec.instance.id.as_str()),
        ("aws", "i-a")
    );

    // A static cloud knows nodes by name, with no providerID.
    w.cloud = "static";
    w.nodes[0].provider_id.clear();
    let tasks = w.plan();
    let Task::CreateSet { spec, .. } = &tasks[0] else {
        panic!("{tasks:?}")
    };
    assert_eq!(
        (spec.instance.provider.as_str(), spec.instance.id.as_str()),
        ("static", "a")
    );
}

#[test]
fn a_set_keeps_being_served_whatever_the_nodes_provider_id_says_now() {
    let mut w = World::new(Mode::Primary);
    w.live("a", &["eni-1"]);
    w.nodes[0].provider_id.clear();
    let index = Index::build(w.input());
    assert!(
        index.nodes[0].serving.pool().is_some(),
        "{:?}",
        index.nodes[0].serving
    );
}

#[test]
fn free_enis_are_spec_minus_used_draining_and_quarantined() {
    let mut w = World::new(Mode::Primary);
    let s = w.live("a", &["e1", "e2", "e3"]);
    // Nothing to do: two free.
    status(s).used.push(used("e1", None));
    assert!(w.plan().is_empty(), "{:?}", w.plan());
    // One quarantined: one free; one more slot (limit 4 = primary + 3).
    status(w.set("a")).quarantined.push(Quarantined {
        eni: "e2".into(),
        reason: "no device".into(),
    });
    assert!(w.plan().is_empty(), "the instance is full: {:?}", w.plan());
    // With room on a bigger instance, the one missing is created.
    w.limits.get_mut("m5").unwrap().enis = 8;
    assert_eq!(
        w.plan(),
        [Task::CreateEnis {
            node: "a".into(),
            device_indexes: vec![4],
            secondary_ipv4: 0
        }]
    );
}

#[test]
fn min_allocate_counts_used_and_free() {
    let mut w = World::new(Mode::Primary);
    w.policy.watermarks = Watermarks {
        pre_allocate: 0,
        min_allocate: 3,
        max_above_watermark: 0,
    };
    w.limits.get_mut("m5").unwrap().enis = 10;
    let s = w.live("a", &["e1"]);
    status(s).used.push(used("e1", None));
    let tasks = w.plan();
    assert_eq!(
        tasks,
        [Task::CreateEnis {
            node: "a".into(),
            device_indexes: vec![2, 3],
            secondary_ipv4: 0
        }]
    );
}

#[test]
fn a_surplus_is_drained_from_the_last_attached_never_a_used_one() {
    let mut w = World::new(Mode::Primary);
    w.limits.get_mut("m5").unwrap().enis = 10;
    // pre 2 + max above 1: five free is two too many.
    let s = w.live("a", &["e1", "e2", "e3", "e4", "e5", "e6"]);
    status(s).used.push(used("e6", None));
    assert_eq!(
        w.plan(),
        [Task::Drain {
            node: "a".into(),
            items: vec!["e5".into(), "e4".into()]
        }]
    );
    // min_allocate caps the drain.
    w.policy.watermarks.min_allocate = 5;
    w.set("a").spec.watermarks.min_allocate = 5;
    assert_eq!(
        w.plan(),
        [Task::Drain {
            node: "a".into(),
            items: vec!["e5".into()]
        }]
    );
}

/// With `drain_delay`, a surplus is held back until the passes have seen
/// it for that long; a pass without it starts the wait again.
#[test]
fn a_surplus_is_drained_only_once_it_has_lasted_drain_delay() {
    let mut w = World::new(Mode::Primary);
    w.policy.drain_delay = Duration::from_secs(30);
    w.limits.get_mut("m5").unwrap().enis = 10;
    let s = w.live("a", &["e1", "e2", "e3", "e4", "e5", "e6"]);
    status(s).used.push(used("e6", None));
    let pass = |w: &World| plan_pass(&Index::build(w.input()));
    // First seen: nothing asked back, the node reported in surplus.
    let first = pass(&w);
    assert_eq!(first.tasks, []);
    assert_eq!(first.surplus, BTreeSet::from(["a".to_string()]));
    // 29 s on: still held.
    w.surplus_since
        .insert("a".into(), w.now - Duration::from_secs(29));
    assert_eq!(pass(&w).tasks, []);
    // 30 s on: drained, as without the delay.
    w.surplus_since
        .insert("a".into(), w.now - Duration::from_secs(30));
    let due = pass(&w);
    assert_eq!(
        due.tasks,
        [Task::Drain {
            node: "a".into(),
            items: vec!["e5".into(), "e4".into()]
        }]
    );
    assert!(due.surplus.contains("a"));
    // Pods take the free ENIs: no surplus, so the next one waits afresh.
    for id in ["e2", "e3", "e4", "e5"] {
        status(w.set("a")).used.push(used(id, None));
    }
    let busy = pass(&w);
    assert!(busy.surplus.is_empty(), "{:?}", busy.surplus);
    assert!(
        !busy.tasks.iter().any(|t| matches!(t, Task::Drain { .. })),
        "{:?}",
        busy.tasks
    );
}

#[test]
fn released_enis_are_reclaimed_and_used_ones_never() {
    let mut w = World::new(Mode::Primary);
    let s = w.live("a", &["e1", "e2", "e3"]);
    s.spec.draining = vec!["e2".into(), "e3".into(), "gone".into()];
    let st = status(s);
    // e3 released yet used (the agent contradicts itself): kept.
    st.released = vec!["e2".into(), "e3".into()];
    st.used.push(used("e3", None));
    let tasks = w.plan();
    let e2 = w.enis[1].clone();
    assert_eq!(
        tasks[0],
        Task::Reclaim {
            node: "a".into(),
            detach: vec![e2],
            delete: vec![],
            addresses: vec![],
            stale: vec!["gone".into()],
        }
    );
    // e1 free only: one short of pre_allocate, and slot 3... is e3's.
    assert_eq!(tasks.len(), 1, "{tasks:?}");
}

/// Sets `id`'s listed attachment state, or unattaches it (`None`).
fn listed_as(w: &mut World, id: &str, state: Option<&str>) {
    let e = w.enis.iter_mut().find(|e| e.id == id).unwrap();
    match state {
        Some(st) => e.attachment.as_mut().unwrap().state = st.into(),
        None => e.attachment = None,
    }
}

#[test]
fn a_released_eni_is_detached_then_deleted_a_listing_later() {
    let mut w = World::new(Mode::Primary);
    w.limits.get_mut("m5").unwrap().enis = 10;
    let s = w.live("a", &["e1", "e2", "e3", "e4"]);
    s.spec.draining = vec!["e4".into()];
    status(s).released = vec!["e4".into()];
    let reclaim = |detach: Vec<FleetEni>, delete: Vec<(&str, DeleteCheck)>| Task::Reclaim {
        node: "a".into(),
        detach,
        delete: delete.into_iter().map(|(d, c)| (d.into(), c)).collect(),
        addresses: vec![],
        stale: vec![],
    };
    // 1. Listed attached: only the detach is asked; it stays in the spec.
    let e4 = w.enis[3].clone();
    assert_eq!(w.plan(), [reclaim(vec![e4.clone()], vec![])]);
    // Attaching counts as attached.
    listed_as(&mut w, "e4", Some("attaching"));
    let mut attaching = e4.clone();
    attaching.attachment.as_mut().unwrap().state = "attaching".into();
    assert_eq!(w.plan(), [reclaim(vec![attaching], vec![])]);
    // 2. Listed detaching: nothing to do until a later listing; its slot
    // stays taken and it is not counted free (no create, no drain).
    listed_as(&mut w, "e4", Some("detaching"));
    assert!(w.plan().is_empty(), "{:?}", w.plan());
    // 3. Listed attached nowhere: deleted (then dropped from the spec),
    // with no second look: ours, detached by us, and the cloud refuses
    // an ENI in use.
    listed_as(&mut w, "e4", None);
    assert_eq!(w.plan(), [reclaim(vec![], vec![("e4", Listed)])]);
    // Not listed at all: the delete looks again (gone, or retagged by
    // someone: spared).
    w.enis.retain(|e| e.id != "e4");
    assert_eq!(w.plan(), [reclaim(vec![], vec![("e4", SecondLook)])]);
    // Never before the agent released it, in any of these states.
    w.set("a").status = Some(NetResourceSetStatus::default());
    assert!(w.plan().is_empty(), "{:?}", w.plan());
}

#[test]
fn a_need_takes_back_unanswered_drains_before_creating() {
    let mut w = World::new(Mode::Primary);
    w.limits.get_mut("m5").unwrap().enis = 10;
    let s = w.live("a", &["e1", "e2", "e3"]);
    s.spec.draining = vec!["e2".into(), "e3".into()];
    status(s).used.push(used("e1", None));
    assert_eq!(
        w.plan(),
        [Task::Undrain {
            node: "a".into(),
            items: vec!["e2".into(), "e3".into()]
        }]
    );
    // One of them released already: it goes; one undrained, one created.
    status(w.set("a")).released = vec!["e3".into()];
    assert_eq!(
        kinds(&w.plan()),
        [
            ("reclaim", Some("a")),
            ("undrain", Some("a")),
            ("create-enis", Some("a"))
        ]
    );
}

#[test]
fn enis_attached_and_tagged_here_but_missing_from_spec_are_adopted() {
    let mut w = World::new(Mode::Primary);
    w.live("a", &["e1"]);
    w.live("b", &[]);
    w.enis.push(fleet_eni("mine", Some(("a", 2)), Some("a")));
    // Attached here but tagged for b, tagged here but attached to b, and
    // tagged here but attached nowhere: none is adopted by a.
    w.enis.push(fleet_eni("theirs", Some(("a", 3)), Some("b")));
    w.enis.push(fleet_eni("moved", Some(("b", 1)), Some("a")));
    w.enis.push(fleet_eni("loose", None, Some("a")));
    let tasks = w.plan();
    let adopted: Vec<&str> = tasks
        .iter()
        .filter_map(|t| match t {
            Task::Adopt { node, enis, .. } if node == "a" => {
                Some(enis.iter().map(|e| e.id.as_str()))
            }
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(adopted, ["mine"]);
    let Some(Task::Adopt { enis, .. }) = tasks.iter().find(|t| t.kind() == "adopt") else {
        panic!()
    };
    assert_eq!(enis[0].device_index, Some(2));
    // Adopted counts as free: a has two, wants nothing more.
    assert!(!tasks
        .iter()
        .any(|t| matches!(t, Task::CreateEnis { node, .. } if node == "a")));
    // The pool's groups as the cloud lists them: none of its own.
    assert!(enis[0].security_groups.is_empty());
}

/// An ENI the cloud lists with groups the pool does not have (made before
/// the pool's groups changed, or by someone else) is adopted with them, so
/// that the agent publishes what it is; it is no pool ENI, and goes.
#[test]
fn an_eni_adopted_with_other_groups_keeps_them_and_is_no_pool_eni() {
    let mut w = World::new(Mode::Primary);
    w.live("a", &["e1", "e2"]);
    let mut other = fleet_eni("other", Some(("a", 3)), Some("a"));
    other.security_groups = vec!["sg-9".into()];
    w.enis.push(other);
    let tasks = w.plan();
    let Some(Task::Adopt { enis, .. }) = tasks.iter().find(|t| t.kind() == "adopt") else {
        panic!("{tasks:?}")
    };
    assert_eq!(enis[0].security_groups, ["sg-9"]);
    // Once in the spec: drained while free, never the pool's.
    let mut s = spec_eni("other", 3);
    s.security_groups = vec!["sg-9".into()];
    w.set("a").spec.enis.push(s);
    let tasks = w.plan();
    assert_eq!(w_drains(&tasks), [&vec!["other".to_string()]]);
    // A pool naming no groups gets the cloud's default ones: whatever the
    // listing says of an ENI, it is the pool's.
    w.policy.security_groups.clear();
    w.set("a").spec.security_groups.clear();
    assert!(w_drains(&w.plan()).is_empty(), "{:?}", w.plan());
}

/// The device indexes of each pool create.
pub(super) fn grown(tasks: &[Task]) -> Vec<&Vec<u32>> {
    tasks
        .iter()
        .filter_map(|t| match t {
            Task::CreateEnis { device_indexes, .. } => Some(device_indexes),
            _ => None,
        })
        .collect()
}

fn w_drains(tasks: &[Task]) -> Vec<&Vec<String>> {
    tasks
        .iter()
        .filter_map(|t| match t {
            Task::Drain { items, .. } => Some(items),
            _ => None,
        })
        .collect()
}

/// The pool's ENIs pinned to the groups the pool had (its groups
/// changed): not counted in its watermarks (the node grows ENIs of the new
/// groups) and drained once free; one a pod holds waits.
#[test]
fn pool_enis_of_groups_the_pool_no_longer_has_are_replaced() {
    let mut w = World::new(Mode::Primary);
    w.limits.get_mut("m5").unwrap().enis = 6;
    w.live("a", &["e1", "e2", "e3"]);
    for e in &mut w.set("a").spec.enis {
        e.security_groups = vec!["sg-old".into()];
    }
    status(w.set("a")).used.push(used("e3", None));
    let tasks = w.plan();
    let drained = w_drains(&tasks);
    assert_eq!(drained, [&vec!["e1".to_string(), "e2".to_string()]]);
    assert_eq!(
        grown(&tasks),
        [&vec![4, 5]],
        "two free of the pool's groups"
    );
    // Drained and not yet released: the pool, short, makes new ones
    // rather than take them back.
    w.set("a").spec.draining = vec!["e1".into(), "e2".into()];
    let tasks = w.plan();
    assert!(
        !tasks.iter().any(|t| matches!(t, Task::Undrain { .. })),
        "{tasks:?}"
    );
    // The same groups in another order are the pool's.
    let mut w = World::new(Mode::Primary);
    w.policy.security_groups = vec!["sg-1".into(), "sg-2".into()];
    w.live("a", &["e1", "e2"]);
    w.set("a").spec.security_groups = w.policy.security_groups.clone();
    for e in &mut w.set("a").spec.enis {
        e.security_groups = vec!["sg-2".into(), "sg-1".into()];
    }
    assert!(w_drains(&w.plan()).is_empty(), "{:?}", w.plan());
}

#[test]
fn intents_are_finished_with_their_token_or_dropped() {
    let mut w = World::new(Mode::Primary);
    w.limits.get_mut("m5").unwrap().enis = 10;
    let s = w.live("a", &["e1"]);
    s.spec.intents = vec![
        intent("t-none"),
        intent("t-made"),
        intent("t-attached"),
        intent("t-published"),
    ];
    let mut made = fleet_eni("e-made", None, Some("a"));
    made.intent = Some("t-made".into());
    let mut attached = fleet_eni("e-att", Some(("a", 5)), Some("a"));
    attached.intent = Some("t-attached".into());
    let mut published = fleet_eni("e1", Some(("a", 1)), Some("a"));
    published.intent = Some("t-published".into());
    w.enis.retain(|e| e.id != "e1");
    w.enis.extend([made.clone(), attached.clone(), published]);
    let tasks = w.plan();
    let finish =
        |token: &str, made: Option<FleetEni>, device_index: Option<u32>| Task::FinishIntent {
            node: "a".into(),
            token: token.into(),
            made,
            device_index,
            secondary_ipv4: 0,
        };
    assert_eq!(
        tasks,
        [
            finish("t-none", None, Some(2)),
            finish("t-made", Some(made), Some(3)),
            finish("t-attached", Some(attached), None),
            Task::DropIntent {
                node: "a".into(),
                token: "t-published".into()
            },
            // e1 + three on their way: four free, one above the high mark.
            Task::Drain {
                node: "a".into(),
                items: vec!["e1".into()]
            }
        ]
    );
    // No slot left: an intent whose ENI is not attached is dropped.
    w.limits.get_mut("m5").unwrap().enis = 2;
    let tasks = w.plan();
    assert!(tasks.contains(&Task::DropIntent {
        node: "a".into(),
        token: "t-none".into()
    }));
}

/// Node a's release: what it detaches and deletes, and whether its set goes.
fn release(detach: Vec<FleetEni>, delete: Vec<(&str, DeleteCheck)>, release_set: bool) -> Task {
    Task::ReleaseNode {
        node: "a".into(),
        detach,
        delete: delete.into_iter().map(|(d, c)| (d.into(), c)).collect(),
        release_set,
    }
}

#[test]
fn a_gone_node_is_released_after_its_grace() {
    let mut w = World::new(Mode::Primary);
    let s = w.live("a", &["e1", "e2"]);
    status(s).used.push(used("e1", None));
    w.enis.push(fleet_eni("e-tagged", None, Some("a")));
    w.nodes.clear();
    w.gone.insert("a".into(), now() - Duration::from_secs(299));
    assert!(w.plan().is_empty(), "within the grace: {:?}", w.plan());
    w.gone.insert("a".into(), now() - Duration::from_secs(300));
    let (e1, e2) = (w.enis[0].clone(), w.enis[1].clone());
    // 1. The attached are detached, the loose one deleted; the set waits.
    assert_eq!(
        w.plan(),
        [release(
            vec![e1.clone(), e2.clone()],
            vec![("e-tagged", Listed)],
            false
        )]
    );
    // 2. One still detaching: the other is deleted, the set still waits
    // (e-tagged, deleted, is no longer listed nor in the spec).
    listed_as(&mut w, "e1", Some("detaching"));
    listed_as(&mut w, "e2", None);
    w.enis.retain(|e| e.id != "e-tagged");
    assert_eq!(w.plan(), [release(vec![], vec![("e2", Listed)], false)]);
    // 3. None attached or detaching: the rest deleted (e2, gone but still
    // in the spec nobody may write, finds the delete answer "gone"), then
    // the set goes.
    listed_as(&mut w, "e1", None);
    w.enis.retain(|e| e.id != "e2");
    assert_eq!(
        w.plan(),
        [release(
            vec![],
            vec![("e1", Listed), ("e2", SecondLook)],
            true
        )]
    );
    // A set deleted while its Node is there: pods live on; their ENIs stay.
    let mut w = World::new(Mode::Primary);
    let s = w.live("a", &["e1", "e2"]);
    status(s).used.push(used("e1", None));
    s.deleting_since = Some(now() - Duration::from_secs(600));
    w.enis.push(fleet_eni("e-tagged", None, Some("a")));
    let e2 = w.enis[1].clone();
    assert_eq!(
        w.plan(),
        [release(vec![e2], vec![("e-tagged", Listed)], false)]
    );
    // Once e2 is gone, only e1 is left, which a pod holds: nothing to do.
    w.enis.retain(|e| e.id != "e2" && e.id != "e-tagged");
    w.set("a").spec.enis.retain(|e| e.id != "e2");
    assert!(w.plan().is_empty(), "{:?}", w.plan());
}

#[test]
fn the_uninstall_annotation_releases_a_live_node_at_once_and_then_leaves_it() {
    let mut w = World::new(Mode::Primary);
    // Annotated a moment ago, with its Node there: no grace is waited.
    let s = w.live("a", &["e1", "e2"]);
    s.uninstall = Uninstall::Releasing;
    status(s).used.push(used("e1", None));
    let (e1, e2) = (w.enis[0].clone(), w.enis[1].clone());
    // A pod holds e1: only e2 leaves, and the set is kept.
    assert_eq!(w.plan(), [release(vec![e2], vec![], false)]);
    // Its pod gone, e1 leaves too; the set is not served again (no
    // create, no refresh), though it is below its watermarks.
    status(w.set("a")).used.clear();
    w.enis.retain(|e| e.id != "e2");
    w.set("a").spec.enis.retain(|e| e.id != "e2");
    assert_eq!(w.plan(), [release(vec![e1], vec![], false)]);
    // Detached: deleted, and the finalizer goes.
    listed_as(&mut w, "e1", None);
    assert_eq!(w.plan(), [release(vec![], vec![("e1", Listed)], true)]);
    // Released (the finalizer gone, the annotation kept): nothing more,
    // even with the ENI still in the spec nobody rewrites.
    w.enis.clear();
    w.set("a").uninstall = Uninstall::Released;
    assert!(w.plan().is_empty(), "{:?}", w.plan());
    // The same node without the annotation is served again.
    w.set("a").uninstall = Uninstall::No;
    assert!(
        kinds(&w.plan()).contains(&("create-enis", Some("a"))),
        "{:?}",
        w.plan()
    );
}

#[test]
fn only_old_unclaimed_unattached_enis_with_a_readable_tag_are_reaped() {
    let mut w = World::new(Mode::Primary);
    let s = w.live("a", &["e1"]);
    s.spec.intents = vec![intent("live")];
    w.reap = true;
    let old = now() - Duration::from_secs(600);
    let young = now() - Duration::from_secs(599);
    let mut add = |id: &str, created_at: CreatedAt, intent: Option<&str>, attached: bool| {
        let mut e = fleet_eni(id, attached.then_some(("zz", 1)), None);
        e.created_at = created_at;
        e.intent = intent.map(String::from);
        w.enis.push(e);
    };
    add("leak", CreatedAt::At(old), None, false);
    add("leak-dead-intent", CreatedAt::At(old), Some("dead"), false);
    add("young", CreatedAt::At(young), None, false);
    add("missing", CreatedAt::Missing, None, false);
    add(
        "unreadable",
        CreatedAt::Unreadable("soon".into()),
        None,
        false,
    );
    add("live-intent", CreatedAt::At(old), Some("live"), false);
    add("attached", CreatedAt::At(old), None, true);
    // e1 is in a spec, detached from outside: not a leak either.
    w.enis.iter_mut().find(|e| e.id == "e1").unwrap().attachment = None;
    let reaped: Vec<Task> = w
        .plan()
        .into_iter()
        .filter(|t| t.kind() == "delete-leaked")
        .collect();
    assert_eq!(
        reaped,
        [
            Task::DeleteLeaked { eni: "leak".into() },
            Task::DeleteLeaked {
                eni: "leak-dead-intent".into()
            }
        ]
    );
    w.reap = false;
    assert!(!w.plan().iter().any(|t| t.kind() == "delete-leaked"));
}

#[test]
fn neediest_first_surplus_last_leaks_at_the_end() {
    let mut w = World::new(Mode::Primary);
    w.limits.get_mut("m5").unwrap().enis = 10;
    w.live("surplus", &["s1", "s2", "s3", "s4"]);
    w.live("short1", &["x1"]);
    w.live("ok", &["o1", "o2"]);
    w.nodes.push(node("new")); // short 2
    w.reap = true;
    let mut leak = fleet_eni("leak", None, None);
    leak.created_at = CreatedAt::At(now() - Duration::from_secs(7200));
    w.enis.push(leak);
    assert_eq!(
        kinds(&w.plan()),
        [
            ("create-set", Some("new")),
            ("create-enis", Some("new")),
            ("create-enis", Some("short1")),
            ("drain", Some("surplus")),
            ("delete-leaked", None)
        ]
    );
}

#[test]
fn a_changed_policy_is_written_to_existing_sets() {
    let mut w = World::new(Mode::Primary);
    w.live("a", &["e1", "e2"]);
    assert!(w.plan().is_empty());
    w.policy.security_groups.push("sg-2".into());
    assert_eq!(kinds(&w.plan()), [("refresh-policy", Some("a"))]);
}

#[test]
fn secondary_mode_counts_addresses() {
    let mut w = World::new(Mode::Secondary);
    // Four secondary addresses per ENI, three ENIs per instance.
    w.policy.watermarks = Watermarks {
        pre_allocate: 6,
        min_allocate: 0,
        max_above_watermark: 2,
    };
    let s = w.live("a", &["e1"]);
    s.spec.enis[0].secondary_ips = vec![ip("10.0.0.11"), ip("10.0.0.12")];
    status(s).used.push(used("e1", Some("10.0.0.11")));
    // One free of six: two more on e1, then one new ENI with the other three.
    assert_eq!(
        w.plan(),
        [
            Task::AssignAddresses {
                node: "a".into(),
                eni: "e1".into(),
                count: 2
            },
            Task::CreateEnis {
                node: "a".into(),
                device_indexes: vec![2],
                secondary_ipv4: 3
            }
        ]
    );
    // The listing shows an address the spec lacks (an assign whose publish
    // was lost): adopted, and counted.
    w.enis[0].secondary_ips = vec![ip("10.0.0.11"), ip("10.0.0.12"), ip("10.0.0.13")];
    let tasks = w.plan();
    assert_eq!(
        tasks[0],
        Task::Adopt {
            node: "a".into(),
            enis: vec![],
            addresses: vec![("e1".into(), vec![ip("10.0.0.13")])]
        }
    );
    assert_eq!(
        tasks[1],
        Task::AssignAddresses {
            node: "a".into(),
            eni: "e1".into(),
            count: 1
        }
    );
}

/// Addresses resting their cooldown (the agent's `status.cooling`) are
/// not free: counted so, a node whose pods just went is neither drained
/// of them nor left short.
#[test]
fn secondary_mode_counts_cooling_addresses_as_not_free() {
    let mut w = World::new(Mode::Secondary);
    let s = w.live("a", &["e1", "e2"]);
    s.spec.enis[0].secondary_ips = ["10.0.0.11", "10.0.0.12", "10.0.0.13"].map(ip).to_vec();
    s.spec.enis[1].secondary_ips = ["10.0.1.11", "10.0.1.12", "10.0.1.13"].map(ip).to_vec();
    status(s).used.push(used("e2", Some("10.0.1.13")));
    // Five free but four cooling: one free, short of pre_allocate 2.
    status(s).cooling = ["10.0.0.11", "10.0.0.12", "10.0.0.13", "10.0.1.11"]
        .map(ip)
        .to_vec();
    let tasks = w.plan();
    assert!(
        !tasks.iter().any(|t| matches!(t, Task::Drain { .. })),
        "{tasks:?}"
    );
    assert!(
        tasks
            .iter()
            .any(|t| matches!(t, Task::AssignAddresses { .. } | Task::CreateEnis { .. })),
        "{tasks:?}"
    );
}

#[test]
fn secondary_mode_drains_and_reclaims_free_addresses_only() {
    let mut w = World::new(Mode::Secondary);
    let s = w.live("a", &["e1", "e2"]);
    s.spec.enis[0].secondary_ips = ["10.0.0.11", "10.0.0.12", "10.0.0.13"].map(ip).to_vec();
    s.spec.enis[1].secondary_ips = ["10.0.1.11", "10.0.1.12", "10.0.1.13"].map(ip).to_vec();
    status(s).used.push(used("e2", Some("10.0.1.13")));
    // Five free, high mark 3: the last two free addresses are drained.
    assert_eq!(
        w.plan(),
        [Task::Drain {
            node: "a".into(),
            items: vec!["10.0.1.12".into(), "10.0.1.11".into()]
        }]
    );
    let s = w.set("a");
    s.spec.draining = vec!["10.0.1.12".into(), "10.0.1.11".into(), "10.0.1.13".into()];
    status(s).released = vec!["10.0.1.12".into(), "10.0.1.11".into(), "10.0.1.13".into()];
    assert_eq!(
        w.plan(),
        [Task::Reclaim {
            node: "a".into(),
            detach: vec![],
            delete: vec![],
            addresses: vec![("e2".into(), vec![ip("10.0.1.12"), ip("10.0.1.11")])],
            stale: vec![]
        }]
    );
}
