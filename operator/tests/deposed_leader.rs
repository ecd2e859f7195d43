//! The leader cut off from the API server, but not from the cloud, while
//! the follower (which still reaches the API server) takes over: the old
//! leader makes no cloud call past its leader deadline (its Lease's last
//! renewal + the lease duration − half the grace), though its lease
//! manager still says "leader"; the new leader converges, reaps a leak
//! exactly once, and nothing is leaked or made twice.
//!
//! Each replica has its own way in: op-a reaches the API server through a
//! relay the test can cut and moto through a proxy of its own, so every
//! EC2 call op-a makes is counted apart from op-b's.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use common::*;
use enim_provider::cloud::{TAG_CLUSTER, TAG_CREATED_AT};
use enim_provider_aws::{TAG_MANAGED, TAG_NODE};
use enim_testkit::moto::FaultProxy;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A TCP relay on loopback to the API server. Cut, it drops every
/// connection and holds new ones unanswered (a partition, not a refusal);
/// restored, it drops the held ones and relays again.
struct Relay {
    addr: SocketAddr,
    cut: Arc<watch::Sender<bool>>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(upstream: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(watch::Sender::new(false));
        let state = cut.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut down, _)) = listener.accept().await {
                let mut cut = state.subscribe();
                tokio::spawn(async move {
                    if *cut.borrow_and_update() {
                        // Held, unanswered, until restored.
                        let _ = cut.wait_for(|c| !*c).await;
                        return;
                    }
                    let Ok(mut up) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut down, &mut up) => {}
                        _ = cut.wait_for(|c| *c) => {}
                    }
                });
            }
        });
        Relay { addr, cut, task }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The instant of wall-clock time `t` (the API server and the operators
/// share this machine's clock).
fn instant_of(t: SystemTime) -> Instant {
    let now = Instant::now();
    match t.duration_since(SystemTime::now()) {
        Ok(ahead) => now + ahead,
        Err(behind) => now.checked_sub(behind.duration()).unwrap_or(now),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_api_server_stops_calling_the_cloud_at_its_deadline() {
    let Some((_one, rig)) = slotted_rig(false).await else {
        return;
    };
    let instance = rig.env.instance_id.clone();
    // (duration, grace): renewed every 2 s; the deadline falls 2.5 s
    // after a renewal, op-b takes over 3 s after it at the earliest.
    let lease: (u32, u32) = (3, 1);
    let margin = Duration::from_secs(u64::from(lease.1)) / 2;
    let deadline_after_renewal = Duration::from_secs(u64::from(lease.0)) - margin;

    // op-a: its own relay to the API server, its own proxy to moto.
    let server: SocketAddr = rig
        .cp
        .server()
        .trim_start_matches("https://")
        .parse()
        .unwrap();
    let relay = Relay::start(server).await;
    let kubeconfig_a = rig.dir.join("op-a.kubeconfig");
    let text = std::fs::read_to_string(&rig.operator_kubeconfig).unwrap();
    let relayed = text.replace(&rig.cp.server(), &format!("https://{}", relay.addr));
    assert_ne!(text, relayed, "the kubeconfig names the API server");
    std::fs::write(&kubeconfig_a, relayed).unwrap();
    let proxy_a = FaultProxy::start(&rig.env.moto.url).await;
    // Leaks are reaped at every listing, whoever leads.
    let reap = "reap_interval = \"1s\"";
    let config_a = rig.config_at("op-a", TWO, "5m", &proxy_a.url, reap);
    let config_b = rig.config_at("op-b", TWO, "5m", &rig.env.proxy.url, reap);

    let mut a = rig
        .operator_leading(OperatorOpts {
            lease,
            kubeconfig: Some(&kubeconfig_a),
            ..OperatorOpts::new("op-a", &config_a)
        })
        .await;
    let mut b = rig.operator(OperatorOpts {
        lease,
        ..OperatorOpts::new("op-b", &config_b)
    });
    rig.node("node-a", &instance);
    let enis_a = wait_for("op-a converges node-a", Duration::from_secs(30), || {
        rig.converged("node-a", &instance, Some(2))
    })
    .await;
    // op-b's caches fill while it follows.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(rig.leader(), "op-a");
    assert!(b.exited().is_none(), "op-b exited\n{}", b.tail());
    let leading_metrics = match health_addr(&a) {
        Some(addr) => http_get(&addr, "/metrics").await.ok().map(|r| r.1),
        None => None,
    };

    relay.set_cut(true);
    let cut = Instant::now();
    // op-a's last renewal, as stored: its deadline is this + 2.5 s at the
    // latest (earlier if the watch event of that renewal was lost).
    let stored = Api::<Lease>::namespaced(rig.admin.clone(), NS)
        .get("enim-operator")
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(stored.holder_identity.as_deref(), Some("op-a"));
    let renewed = SystemTime::from(stored.renew_time.unwrap().0);
    let deadline = instant_of(renewed + deadline_after_renewal);
    eprintln!(
        "op-a cut off {:?} after its last renewal; its deadline {:?} after the cut",
        renewed.elapsed().unwrap_or_default(),
        deadline.saturating_duration_since(cut)
    );
    rig.wait_leader("op-b").await;
    let took_over = Instant::now();
    eprintln!("op-a cut off → op-b holds the lease: {:?}", cut.elapsed());

    // Temptations for op-a's stale caches: a leak to reap, a node to serve.
    let when = "2020-01-01T00:00:00Z";
    let leak = rig
        .env
        .create_eni_with_tags(&[
            (TAG_MANAGED, "true"),
            (TAG_CLUSTER, CLUSTER),
            (TAG_NODE, &instance),
            (TAG_CREATED_AT, when),
        ])
        .await
        .network_interface_id;
    let other = rig.run_instance().await;
    rig.node("node-b", &other);
    wait_for("op-b converges node-b", Duration::from_secs(30), || {
        rig.converged("node-b", &other, Some(2))
    })
    .await;
    wait_for("op-b reaps the leak", Duration::from_secs(30), || async {
        let left = rig.cluster_enis().await;
        (!left.iter().any(|e| e.network_interface_id == leak))
            .then_some(())
            .ok_or(format!("{leak} still there"))
    })
    .await;
    // op-a's chances to misbehave: 10 s past its cut at least.
    let waited = cut.elapsed();
    if waited < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_secs(10) - waited).await;
    }

    let late = proxy_a.calls_since(deadline);
    let after_takeover = proxy_a.calls_since(took_over).len();
    assert!(
        late.is_empty(),
        "op-a called the cloud {} times after its deadline ({after_takeover} after op-b took over): {late:?}\n{}",
        late.len(),
        a.tail()
    );
    assert!(a.exited().is_none(), "op-a exited\n{}", a.tail());
    assert_eq!(
        rig.env.proxy.calls("DeleteNetworkInterface"),
        1,
        "op-b deletes the leak once, and nothing else"
    );
    assert_eq!(
        rig.converged("node-a", &instance, Some(2)).await.unwrap(),
        enis_a,
        "node-a's ENIs untouched"
    );
    assert_eq!(
        rig.cluster_enis().await.len(),
        4,
        "leaked or duplicated ENIs in moto"
    );
    let out = a.stdout();
    assert!(
        out.contains("leader deadline passed"),
        "op-a never said its deadline passed\n{}",
        a.tail()
    );

    // What op-a's endpoint shows: leading with time left before the cut,
    // not leading with none after, and the miss counted.
    let leading = leading_metrics.expect("op-a's /metrics while leading");
    assert_eq!(
        metric(&leading, "enim_operator_leader"),
        Some(1.0),
        "{leading}"
    );
    let left = metric(&leading, "enim_operator_leader_deadline_seconds").unwrap();
    assert!(
        left > 0.0 && left <= deadline_after_renewal.as_secs_f64(),
        "{leading}"
    );
    let addr = health_addr(&a).unwrap();
    let (_, deposed) = http_get(&addr, "/metrics").await.unwrap();
    assert_eq!(
        metric(&deposed, "enim_operator_leader"),
        Some(0.0),
        "{deposed}"
    );
    assert_eq!(
        metric(&deposed, "enim_operator_leader_deadline_seconds"),
        Some(0.0),
        "{deposed}"
    );
    assert!(
        metric(&deposed, "enim_operator_leader_deadline_misses_total") >= Some(1.0),
        "{deposed}"
    );
    let (_, ready) = http_get(&addr, "/readyz").await.unwrap();
    assert!(ready.contains("leader deadline passed"), "{ready}");
    // No webhook here: said so, and not what readiness waits on.
    assert_eq!(
        metric(&deposed, "enim_operator_webhook_serving"),
        Some(-1.0),
        "{deposed}"
    );
    assert!(!ready.contains("webhook"), "{ready}");

    // Back in touch, op-a learns it follows and stays quiet.
    relay.set_cut(false);
    let back = Instant::now();
    wait_for("op-a follows", Duration::from_secs(40), || async {
        let (_, r) = http_get(&addr, "/readyz").await?;
        r.contains("follower").then_some(()).ok_or(r)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let late = proxy_a.calls_since(deadline);
    assert!(late.is_empty(), "op-a back: {late:?}\n{}", a.tail());
    assert_eq!(rig.leader(), "op-b");
    eprintln!("op-a back in touch → follower: {:?}", back.elapsed());
    b.stop().await;
}
