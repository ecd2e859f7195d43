//! The shared rigs of `enim-testkit` (sandbox, agent process, plugin exec,
//! fixtures), plus what only this crate can give them: its binaries
//! (`CARGO_BIN_EXE_*`) and, in one place, the in-process managers some
//! kernel tests build over the sandbox (the agent's internals).

// Each test binary uses its own part of this.
#![allow(dead_code, unused_imports)]

use std::path::Path;
use std::sync::Arc;

use enim::engine::Engine;
use enim::netlink::rtnl::RtnlPlumbing;
use enim::primary::PrimaryDriver;
use enim::secondary::{SecondaryConfig, SecondaryDriver};
use enim::store::checkpoint::Checkpoint;
use enim_provider::EniProvider;
use enim_provider_static::{StaticEniConfig, StaticProvider};

pub mod cloud_node;
pub use enim_testkit::agent::{
    assert_metrics, crash_env, http_get_in, http_method_in, metric, NETWORK,
};
pub use enim_testkit::cni::CniOutput;
pub use enim_testkit::*;

/// This crate's enimd, enim and enimctl.
pub fn bins() -> Bins {
    enim_testkit::bins!()
}

/// A ready enimd over the sandbox's ENIs, in its host netns; `extra` is
/// appended to the config's top-level table.
pub fn start_agent(sb: &Sandbox, dir: &Path, extra: &str) -> Agent {
    Agent::start(bins(), sb, dir, extra)
}

/// `enimctl --json <args>` against the agent at `socket`; it must succeed.
pub fn enimctl(socket: &Path, args: &[&str]) -> serde_json::Value {
    enim_testkit::enimctl(&bins().enimctl, socket, args)
}

/// The real `enim` plugin exec'd as a runtime does, for pod
/// default/pod-`cid`.
pub fn enim(
    command: &str,
    cid: &str,
    netns: Option<&Path>,
    ifname: &str,
    conf: &serde_json::Value,
) -> CniOutput {
    exec_plugin(
        &bins().enim,
        command,
        cid,
        netns,
        ifname,
        &cni::k8s_args("default", cid),
        conf,
    )
}

/// Starts `cmd` (the `enim` plugin, or a wrapper that execs it) for an ADD
/// of `cid` on eth0 in `netns`, `conf` on stdin (no CNI_ARGS).
pub fn spawn_add(
    cmd: std::process::Command,
    cid: &str,
    netns: &Path,
    conf: &serde_json::Value,
) -> std::process::Child {
    let body = serde_json::to_vec(conf).unwrap();
    cni::spawn(
        cmd,
        &cni::Call {
            plugin: &bins().enim,
            command: "ADD",
            container_id: Some(cid),
            netns: Some(netns),
            ifname: Some("eth0"),
            args: None,
            cni_path: Path::new("/usr/lib/cni"),
            conf: &body,
        },
    )
    .unwrap()
}

/// The engine in primary mode, as enimd builds it.
pub type PrimaryEngine = Engine<PrimaryDriver>;
/// The engine in secondary mode, as enimd builds it.
pub type SecondaryEngine = Engine<SecondaryDriver>;

/// A secondary-mode engine in this process over `enis` in the sandbox host
/// namespace, its existing checkpoint at `checkpoint` (not started: no
/// recovery yet).
pub async fn secondary_manager(
    sb: &Sandbox,
    enis: &[StaticEniConfig],
    checkpoint: &Path,
    config: SecondaryConfig,
) -> Arc<SecondaryEngine> {
    let provider = Arc::new(StaticProvider::new(enis.to_vec()).unwrap());
    secondary_manager_over(sb, provider, checkpoint, config).await
}

/// [`secondary_manager`] over any `provider` (a test's own wrapper).
pub async fn secondary_manager_over(
    sb: &Sandbox,
    provider: Arc<dyn EniProvider>,
    checkpoint: &Path,
    config: SecondaryConfig,
) -> Arc<SecondaryEngine> {
    let checkpoint = Arc::new(Checkpoint::open(checkpoint, false).unwrap());
    let driver = SecondaryDriver::over_host(
        config,
        Some(&sb.host.path()),
        provider,
        checkpoint.clone(),
        Default::default(),
    )
    .await
    .unwrap();
    Arc::new(Engine::new(driver, checkpoint))
}

/// A primary-mode engine in this process over `enis` in the sandbox host
/// namespace, its checkpoint at `checkpoint` (fsynced when `fsync`). The
/// one place tests build the agent's internals.
pub async fn manager_over(
    sb: &Sandbox,
    enis: &[StaticEniConfig],
    checkpoint: &Path,
    fsync: bool,
) -> (PrimaryEngine, Arc<StaticProvider>, Arc<Checkpoint>) {
    let provider = Arc::new(StaticProvider::new(enis.to_vec()).unwrap());
    let plumbing = Arc::new(RtnlPlumbing::new(Some(&sb.host.path())).await.unwrap());
    let checkpoint = Arc::new(Checkpoint::open(checkpoint, fsync).unwrap());
    let driver = PrimaryDriver::new(
        provider.clone(),
        plumbing,
        checkpoint.clone(),
        Default::default(),
    );
    (
        Engine::new(driver, checkpoint.clone()),
        provider,
        checkpoint,
    )
}

/// A primary-mode engine over the sandbox's ENIs with its checkpoint at
/// `checkpoint`.
pub async fn manager(sb: &Sandbox, checkpoint: &Path) -> (Arc<PrimaryEngine>, Arc<StaticProvider>) {
    let (manager, provider, _) = manager_over(sb, &sb.enis, checkpoint, true).await;
    (Arc::new(manager), provider)
}

/// A sandbox of `n` ENIs, a pod netns, a temp dir, and a primary-mode
/// manager over the sandbox with its checkpoint in the dir.
pub async fn primary_rig(
    n: usize,
) -> (
    Sandbox,
    NamedNetns,
    tempfile::TempDir,
    Arc<PrimaryEngine>,
    Arc<StaticProvider>,
) {
    let sb = Sandbox::new(n);
    let pod = NamedNetns::new("pod");
    let dir = tempfile::tempdir().unwrap();
    let (mgr, provider) = manager(&sb, &dir.path().join("cp.json")).await;
    (sb, pod, dir, mgr, provider)
}

/// A sandbox of `n` ENIs, a pod netns, a temp dir, and a ready enimd over
/// the sandbox with its files in the dir (`extra` added to its config).
pub fn agent_rig(n: usize, extra: &str) -> Rig {
    let sb = Sandbox::new(n);
    let pod = NamedNetns::new("pod");
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(&sb, dir.path(), extra);
    (sb, pod, dir, agent)
}

/// A sandbox, a pod netns, a temp dir and a ready agent, as [`agent_rig`]
/// makes them.
pub type Rig = (Sandbox, NamedNetns, tempfile::TempDir, Agent);

/// A [`Rig`] and the agent's 1.1.0 config.
pub type ConfRig = (
    Sandbox,
    NamedNetns,
    tempfile::TempDir,
    Agent,
    serde_json::Value,
);

/// `rig` with container c1 ADDed on eth0 into its pod through the plugin,
/// and the agent's 1.1.0 config that did it.
pub fn with_c1((sb, pod, dir, agent): Rig) -> ConfRig {
    let (conf, _) = plugin_add_c1(&agent, &pod);
    (sb, pod, dir, agent, conf)
}

/// ADDs container c1 on eth0 into `pod` through the plugin with the
/// agent's 1.1.0 config, which must succeed: the config and the result.
pub fn plugin_add_c1(agent: &Agent, pod: &NamedNetns) -> (serde_json::Value, serde_json::Value) {
    let conf = agent.net_conf("1.1.0");
    let result = enim("ADD", "c1", Some(&pod.path()), "eth0", &conf).ok();
    (conf, result)
}

/// Crashes the agent at `point` in c1's ADD or DEL (for a DEL point, c1
/// is ADDed first, unarmed), checks that the plugin said "try again later"
/// (11), and brings the agent back: restarted unarmed, one GC run. Returns
/// whether the point was in ADD.
pub fn crash_c1_at(
    agent: &mut Agent,
    pod: &NamedNetns,
    conf: &serde_json::Value,
    point: &str,
) -> bool {
    let is_add = point.starts_with("add:");
    if !is_add {
        enim("ADD", "c1", Some(&pod.path()), "eth0", conf).ok();
    }
    agent.arm_crash(point);
    let verb = if is_add { "ADD" } else { "DEL" };
    // Without the plugin's wait for enimd's return: nobody restarts it
    // before the plugin has answered (the runtime's retry is the test's).
    let mut at_once = conf.clone();
    at_once["agentWaitSeconds"] = 0.into();
    enim(verb, "c1", Some(&pod.path()), "eth0", &at_once).err(11);
    agent.recover_crash();
    is_add
}

/// Asserts that `text` (a command's output) holds each of `needles`.
pub fn assert_holds_all(text: &str, needles: &[String]) {
    for needle in needles {
        assert!(text.contains(needle.as_str()), "no {needle:?} in {text}");
    }
}

/// Two ENIs, an agent that collects at once (`gc_grace = "0s"`), and two
/// pods attached through the plugin: `c1` in `pods[0]`, `c2` in `pods[1]`.
pub struct TwoPods {
    pub sb: Sandbox,
    pub pods: [NamedNetns; 2],
    pub dir: tempfile::TempDir,
    pub agent: Agent,
    pub conf: serde_json::Value,
}

pub fn two_pods() -> TwoPods {
    let sb = Sandbox::new(2);
    let pods = [NamedNetns::new("pod"), NamedNetns::new("pod")];
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(&sb, dir.path(), "gc_grace = \"0s\"");
    let conf = agent.net_conf("1.1.0");
    for (cid, pod) in ["c1", "c2"].iter().zip(&pods) {
        enim("ADD", cid, Some(&pod.path()), "eth0", &conf).ok();
    }
    TwoPods {
        sb,
        pods,
        dir,
        agent,
        conf,
    }
}

/// No record is left and ENI 0 is free in the provider.
pub async fn assert_unrecorded_and_free(mgr: &PrimaryEngine, provider: &StaticProvider) {
    assert!(mgr.attachments().await.is_empty(), "a record is left");
    assert_eq!(eni0_owner(provider).await, None, "ENI 0 is still assigned");
}

/// ADDs container c1 on eth0 into `pod` through the engine; its owner.
pub async fn add_c1(mgr: &PrimaryEngine, pod: &NamedNetns) -> enim_core::EniOwner {
    let o = owner("c1", "eth0");
    mgr.add(&o, &pod.path()).await.unwrap();
    o
}

/// The container that owns ENI 0 in the provider, if any.
pub async fn eni0_owner(provider: &StaticProvider) -> Option<String> {
    use enim_provider::EniProvider;
    let enis = provider.list().await.unwrap();
    enis[0].owner.as_ref().map(|o| o.container_id.clone())
}

/// ENI 0 is home, free and unrecorded: nothing of an attachment is left.
pub async fn assert_eni0_free(sb: &Sandbox, mgr: &PrimaryEngine, provider: &StaticProvider) {
    sb.assert_home(0);
    assert_unrecorded_and_free(mgr, provider).await;
}

/// A sandbox of `n` ENIs, `n` pod netns, a temp dir, and a ready enimd
/// over the sandbox with its files in the dir (`extra` added to its config).
pub fn agent_rig_with_pods(
    n: usize,
    extra: &str,
) -> (Sandbox, Vec<NamedNetns>, tempfile::TempDir, Agent) {
    let sb = Sandbox::new(n);
    let pods = (0..n).map(|_| NamedNetns::new("pod")).collect();
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(&sb, dir.path(), extra);
    (sb, pods, dir, agent)
}

/// ADDs each pod as container c<i> on eth0; the results, in order.
pub fn add_each(pods: &[NamedNetns], conf: &serde_json::Value) -> Vec<serde_json::Value> {
    pods.iter()
        .enumerate()
        .map(|(i, pod)| enim("ADD", &format!("c{i}"), Some(&pod.path()), "eth0", conf).ok())
        .collect()
}

/// Times `n` cycles of `add` then `del` (each given the container id
/// t<i>) and prints the median of each for the record (run with
/// --nocapture).
pub fn print_add_del_medians(
    what: &str,
    n: usize,
    mut add: impl FnMut(&str),
    mut del: impl FnMut(&str),
) {
    let (mut adds, mut dels) = (Vec::new(), Vec::new());
    for i in 0..n {
        let cid = format!("t{i}");
        let t = std::time::Instant::now();
        add(&cid);
        adds.push(t.elapsed());
        let t = std::time::Instant::now();
        del(&cid);
        dels.push(t.elapsed());
    }
    adds.sort();
    dels.sort();
    eprintln!(
        "{what} median of {n}: ADD {:?}, DEL {:?}",
        adds[n / 2],
        dels[n / 2]
    );
}

/// A real control plane with the committed NetResourceSet CRD
/// established, or `None` (the test skips) where its binaries are missing.
pub fn control_plane_with_nrs_crd() -> Option<enim_testkit::apiserver::ControlPlane> {
    let cp = enim_testkit::apiserver::ControlPlane::start()?;
    let crd = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/05-crd-netresourceset.yaml");
    cp.apply_crd(
        &std::fs::read_to_string(crd).unwrap(),
        "crd/netresourcesets.enim.io",
    );
    Some(cp)
}
