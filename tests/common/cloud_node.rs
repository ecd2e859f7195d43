//! The end-to-end rig of a node on a cloud fake (moto for AWS, the
//! loopback BCE fake): each ENI the cloud attaches shows up as a veth with
//! its MAC in a host namespace, its far end on a bridge holding the
//! subnet's router address in a gateway namespace; pods are ADDed as a
//! runtime does it and checked by pinging the router. Shared by the AWS
//! and BCE end-to-end, outage, crash and secondary-mode tests.

use std::collections::HashSet;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{enim, Agent, NamedNetns};
use enim_testkit::agent::crash_env;
pub use enim_testkit::cloud::poll_until;

/// The subnet's router, on the gateway namespace's bridge.
pub const ROUTER: &str = "10.0.1.1";

/// Warm address pool watermarks of the secondary-mode tests
/// (`[secondary.pool]`): free addresses the pool keeps, and how many more
/// it takes while it is allocating anyway.
pub const PRE_ALLOCATE: usize = 2;
pub const MAX_ABOVE_WATERMARK: usize = 1;

/// The gateway namespace `tag`: a bridge `br0` holding the router address.
pub fn gateway(tag: &str) -> Arc<NamedNetns> {
    let gw = Arc::new(NamedNetns::new(tag));
    gw.ip(&["link", "add", "br0", "type", "bridge"]);
    gw.ip(&["addr", "add", &format!("{ROUTER}/24"), "dev", "br0"]);
    gw.ip(&["link", "set", "br0", "up"]);
    gw
}

/// An ENI plugged in: veth `name` with the ENI's `mac` in `host`, its peer
/// on `gw`'s bridge.
pub fn plug(host: &NamedNetns, gw: &NamedNetns, name: &str, mac: &str, peer: &str) {
    host.ip(&[
        "link", "add", name, "address", mac, "type", "veth", "peer", "name", peer, "netns",
        &gw.name,
    ]);
    gw.ip(&["link", "set", peer, "master", "br0", "up"]);
}

/// The top of enimd's config: its files in `dir`, ENIs kept in `host`, no
/// periodic GC (tests run it when they want it).
pub fn config_head(dir: &Path, host: &NamedNetns) -> String {
    format!(
        "socket = {:?}\ncheckpoint = {:?}\nhost_netns = {:?}\ngc_interval = \"0s\"\n",
        dir.join("enimd.sock").display().to_string(),
        dir.join("state/checkpoint.json").display().to_string(),
        host.path().display().to_string(),
    )
}

/// enimd's config in primary mode: `provider` (its `[provider]` table)
/// with a warm pool of `free` ENIs that resyncs every `resync`, short
/// retries.
pub fn primary_config(
    dir: &Path,
    host: &NamedNetns,
    provider: &str,
    free: usize,
    resync: &str,
) -> String {
    format!(
        "{head}{provider}\
         [provider.pool]\nmin_free = {free}\nmax_free = {free}\ninitial_retry = \"100ms\"\n\
         max_backoff = \"1s\"\nresync_interval = {resync:?}\n",
        head = config_head(dir, host),
    )
}

/// enimd's config in secondary mode with the test watermarks, at most
/// `per_eni` addresses per ENI (`0`: the cloud's limit), and `provider`
/// (its `[provider]` table).
pub fn secondary_config(
    dir: &Path,
    host: &NamedNetns,
    cooldown: &str,
    per_eni: usize,
    provider: &str,
) -> String {
    let cap = if per_eni == 0 {
        String::new()
    } else {
        format!("max_per_eni = {per_eni}\n")
    };
    format!(
        "mode = \"secondary\"\n{head}\
         [secondary]\ncooldown = {cooldown:?}\n\
         [secondary.pool]\npre_allocate = {PRE_ALLOCATE}\nmax_above_watermark = {MAX_ABOVE_WATERMARK}\n\
         {cap}resync_interval = \"500ms\"\ninitial_retry = \"100ms\"\nmax_backoff = \"1s\"\n\
         {provider}",
        head = config_head(dir, host),
    )
}

/// ADD as a runtime does it: "try again later" (11) is retried for up to
/// `limit`; the last answer must be a success.
pub fn add_retrying(
    cid: &str,
    pod: &NamedNetns,
    conf: &serde_json::Value,
    limit: Duration,
) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    loop {
        let out = enim("ADD", cid, Some(&pod.path()), "eth0", conf);
        if out.status == 0 || Instant::now() > deadline {
            return out.ok();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Whether `pod` reaches the router.
pub fn pings_router(pod: &NamedNetns) -> bool {
    pod.exec_ok(&["ping", "-c", "1", "-W", "2", ROUTER])
}

/// ADDs each pod as container `<prefix><i>` (retrying for a minute) and
/// checks each got a secondary address of its own in the subnet: the
/// addresses, as `a.b.c.d/32`.
pub fn add_secondary_pods(
    pods: &[NamedNetns],
    prefix: &str,
    conf: &serde_json::Value,
) -> HashSet<String> {
    let mut seen = HashSet::new();
    for (i, pod) in pods.iter().enumerate() {
        let r = add_retrying(&format!("{prefix}{i}"), pod, conf, Duration::from_secs(60));
        let ip = r["ips"][0]["address"].as_str().unwrap().to_string();
        assert!(ip.starts_with("10.0.1.") && ip.ends_with("/32"), "{r}");
        assert!(seen.insert(ip.clone()), "{ip} handed out twice");
    }
    seen
}

/// DELs the pods [`add_secondary_pods`] ADDed as `<prefix><i>`.
pub fn del_pods(pods: &[NamedNetns], prefix: &str, conf: &serde_json::Value) {
    for (i, pod) in pods.iter().enumerate() {
        enim(
            "DEL",
            &format!("{prefix}{i}"),
            Some(&pod.path()),
            "eth0",
            conf,
        )
        .ok();
    }
}

/// Addresses as the plugin reports them (`a.b.c.d/32`).
pub fn as_host_routes<'a>(ips: impl IntoIterator<Item = &'a std::net::IpAddr>) -> HashSet<String> {
    ips.into_iter().map(|ip| format!("{ip}/32")).collect()
}

/// Restarts the agent and checks it kept every live pod's address (`seen`)
/// and every pod still reaches the router.
pub fn restart_keeps_pods(agent: &mut Agent, pods: &[NamedNetns], seen: &HashSet<String>) {
    agent.stop();
    agent.restart();
    let listed = agent.ctl(&["attachments"]);
    let kept: HashSet<String> = listed["attachments"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| Some(format!("{}/32", a["ipv4"].as_str()?)))
        .collect();
    assert_eq!(&kept, seen, "{listed}");
    for pod in pods {
        assert!(pings_router(pod), "{} after the restart", pod.name);
    }
}

/// Runs blocking test steps (plugin execs, `ip`, enimctl) in place: the
/// runtime's other worker keeps serving the cloud fake.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// What the crash tests wait for after each step: the cloud holds exactly
/// `want` ENIs of the node, every one attached to it, and the agent's pool
/// counts as many. `cloud` reads the cloud's side: how many ENIs of the
/// node, whether all are attached, and the ENIs for the failure message.
pub async fn settled<F, Fut>(agent: &Agent, want: usize, point: &str, cloud: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = (usize, bool, String)>,
{
    poll_until(Duration::from_secs(40), Duration::from_millis(200), || async {
        let (enis, all_attached, shown) = cloud().await;
        let status = blocking(|| agent.ctl(&["status"]));
        if enis == want && all_attached && status["enis_total"] == want {
            return Ok(());
        }
        Err(format!(
            "{point}: want {want} ENIs of the node, all attached; the cloud has {shown}; agent {status}"
        ))
    })
    .await;
}

/// Starts `agent` armed to abort at crash point `point`, waits for it to
/// die there (its log must say so), and disarms it: its environment (the
/// cloud's credentials, say) is as before.
pub fn crash_at(agent: &mut Agent, point: &str) {
    let env = agent.env.clone();
    agent.env.extend(crash_env(point));
    agent.spawn();
    agent.wait_crashed();
    let log = agent.log();
    assert!(
        log.contains(&format!("crash point {point} reached")),
        "{point}: crashed elsewhere: {log}"
    );
    agent.env = env;
}

/// Checks the agent, started while the cloud's API is down, says it is
/// degraded and has one ENI free (the one metadata shows attached).
pub fn assert_degraded_with_one_free(agent: &Agent) {
    let status = agent.ctl(&["status"]);
    let why = status["degraded"].as_str().unwrap_or_default().to_string();
    assert!(why.contains("cloud unreachable since"), "{status}");
    assert_eq!(status["enis_free"], 1, "{status}");
}

/// What a node serves with the cloud's API down: c1 in `pod1` gets the ENI
/// metadata shows (`mac`) and reaches the router; c2 in `pod2` is told "try
/// again later" (11). DEL and a second ADD of the same ENI need no cloud.
pub fn serve_through_outage(
    conf: &serde_json::Value,
    pod1: &NamedNetns,
    pod2: &NamedNetns,
    mac: &str,
) {
    let r1 = enim("ADD", "c1", Some(&pod1.path()), "eth0", conf).ok();
    assert_eq!(r1["interfaces"][0]["mac"], mac, "{r1}");
    assert!(pings_router(pod1));
    enim("ADD", "c2", Some(&pod2.path()), "eth0", conf).err(11);
    // The runtime DELs the failed sandbox, as CRI runtimes do: the pod no
    // longer counts as waiting for an ENI.
    enim("DEL", "c2", Some(&pod2.path()), "eth0", conf).ok();
    enim("DEL", "c1", Some(&pod1.path()), "eth0", conf).ok();
    enim("ADD", "c1", Some(&pod1.path()), "eth0", conf).ok();
}

/// Waits (up to 20 s) for the agent to leave its degraded state once the
/// API is back, with one ENI free again.
pub async fn wait_recovered(agent: &Agent) {
    poll_until(
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async {
            let status = blocking(|| agent.ctl(&["status"]));
            if status.get("degraded").is_none() && status["enis_free"] == 1 {
                Ok(())
            } else {
                Err(format!("still degraded or not grown: {status}"))
            }
        },
    )
    .await;
}
