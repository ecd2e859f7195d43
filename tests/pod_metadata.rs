//! The instance metadata service from a pod, against the real kernel: the
//! sandbox's gateway namespace (the "VPC") holds the metadata addresses and
//! a TCP server on them; a pod on an ENI (primary mode) or on an ENI's
//! secondary address (secondary mode) is refused them by default, and
//! reaches them when its namespace opts in.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use enim::engine::{Driver, Engine};
use enim::netlink::rtnl::RtnlPlumbing;
use enim::primary::PrimaryDriver;
use enim::secondary::{SecondaryConfig, SecondaryDriver};
use enim::store::checkpoint::Checkpoint;
use enim::support::metadata::MetadataConfig;
use enim_api::GcRequest;
use enim_core::EniOwner;
use enim_provider_static::StaticProvider;

const V4: &str = "169.254.169.254";
const V6: &str = "fd00:ec2::254";

/// A TCP server on both metadata addresses in the gateway namespace,
/// answering each connection with "imds"; killed on drop.
struct Metadata(Child);

impl Metadata {
    fn serve(sb: &Sandbox) -> Metadata {
        sb.gateway
            .ip(&["addr", "add", &format!("{V4}/32"), "dev", "lo"]);
        sb.gateway.ip(&[
            "-6",
            "addr",
            "add",
            &format!("{V6}/128"),
            "dev",
            "lo",
            "nodad",
        ]);
        let script = format!(
            "import socket, threading\n\
             def serve(family, addr):\n\
             \x20   s = socket.socket(family)\n\
             \x20   s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
             \x20   s.bind((addr, 80)); s.listen(16)\n\
             \x20   while True:\n\
             \x20       c, _ = s.accept(); c.sendall(b'imds'); c.close()\n\
             threading.Thread(target=serve, args=(socket.AF_INET6, '{V6}'), daemon=True).start()\n\
             serve(socket.AF_INET, '{V4}')\n"
        );
        let child = Command::new("ip")
            .args(["netns", "exec", &sb.gateway.name, "python3", "-c", &script])
            .stdin(Stdio::null())
            .spawn()
            .expect("python3");
        Metadata(child)
    }
}

impl Drop for Metadata {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What a connect from `pod` to `addr`:80 gives: Ok(what the server
/// said) or Err(the error). Retried while the server is not listening yet
/// (connection refused), at most 5 s.
fn fetch(pod: &NamedNetns, addr: &str) -> Result<String, String> {
    let script = format!(
        "import socket, sys\n\
         try:\n\
         \x20   s = socket.create_connection(('{addr}', 80), timeout=3)\n\
         \x20   print(s.recv(16).decode())\n\
         except OSError as e:\n\
         \x20   print(type(e).__name__, e.errno, e); sys.exit(1)\n"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let out = Command::new("ip")
            .args(["netns", "exec", &pod.name, "python3", "-c", &script])
            .output()
            .expect("python3");
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if out.status.success() {
            return Ok(text);
        }
        if !text.contains("ConnectionRefused") || std::time::Instant::now() > deadline {
            return Err(text);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An owner in pod namespace `namespace`.
fn owner_in(cid: &str, namespace: &str) -> EniOwner {
    let mut o = owner(cid, "eth0");
    o.pod.namespace = namespace.into();
    o
}

fn agents_may() -> MetadataConfig {
    MetadataConfig {
        allowed_namespaces: vec!["agents".into()],
        ..MetadataConfig::default()
    }
}

/// Refused: at once, by the pod's own route (EACCES), not a timeout.
fn assert_refused(got: Result<String, String>, what: &str) {
    let err = got.expect_err(&format!("{what}: the pod reached the metadata service"));
    assert!(
        err.contains("PermissionError") && err.contains(" 13 "),
        "{what}: refused, but not by the prohibit route: {err}"
    );
}

/// ADDs c1 in namespace default: the pod's network works (the ENI's
/// gateway answers), only metadata is refused, over IPv4 and IPv6 alike.
/// Returns the pod's netns.
async fn add_refused_pod<D: Driver>(mgr: &Engine<D>) -> NamedNetns {
    let pod = NamedNetns::new("pod");
    mgr.add(&owner_in("c1", "default"), &pod.path())
        .await
        .expect("ADD");
    assert!(pod.exec_ok(&["ping", "-c", "1", "-W", "2", "10.77.0.1"]));
    assert_refused(fetch(&pod, V4), "IPv4");
    assert_refused(fetch(&pod, V6), "IPv6");
    pod
}

/// ADDs c2 in the opted-in namespace: it reaches the metadata service over
/// IPv4 and IPv6. Then DELs both pods.
async fn add_opted_in_pod_then_del_both<D: Driver>(mgr: &Engine<D>) {
    let agent = NamedNetns::new("agent");
    mgr.add(&owner_in("c2", "agents"), &agent.path())
        .await
        .expect("ADD in the opted-in namespace");
    assert_eq!(fetch(&agent, V4).as_deref(), Ok("imds"));
    assert_eq!(fetch(&agent, V6).as_deref(), Ok("imds"));

    mgr.del(&owner_in("c1", "default")).await.expect("DEL");
    mgr.del(&owner_in("c2", "agents")).await.expect("DEL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_mode_pods_are_refused_metadata_unless_their_namespace_opts_in() {
    require_kernel!();
    let sb = Sandbox::new(2);
    let _imds = Metadata::serve(&sb);
    let dir = tempfile::tempdir().unwrap();
    let provider = Arc::new(StaticProvider::new(sb.enis.clone()).unwrap());
    let plumbing = Arc::new(RtnlPlumbing::new(Some(&sb.host.path())).await.unwrap());
    let checkpoint = Arc::new(Checkpoint::open(&dir.path().join("cp.json"), false).unwrap());
    let driver = PrimaryDriver::new(provider, plumbing, checkpoint.clone(), Default::default())
        .with_pod_metadata(agents_may());
    let mgr = Engine::new(driver, checkpoint);

    let pod = add_refused_pod(&mgr).await;
    let routes = pod.ip(&["route", "show", "type", "prohibit"]);
    assert!(routes.contains(V4), "{routes}");

    add_opted_in_pod_then_del_both(&mgr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secondary_mode_pods_are_refused_metadata_unless_their_namespace_opts_in() {
    require_kernel!();
    let sb = Sandbox::new(1);
    let _imds = Metadata::serve(&sb);
    let enis = sb.enis_with_secondaries(&[2], true);
    let dir = tempfile::tempdir().unwrap();
    let provider = Arc::new(StaticProvider::new(enis).unwrap());
    let checkpoint = Arc::new(Checkpoint::open(&dir.path().join("cp.json"), false).unwrap());
    let config = SecondaryConfig {
        cooldown: Duration::ZERO,
        ..SecondaryConfig::default()
    };
    let host: &Path = &sb.host.path();
    let driver = SecondaryDriver::over_host(
        config,
        Some(host),
        provider,
        checkpoint.clone(),
        Default::default(),
    )
    .await
    .unwrap()
    .with_pod_metadata(agents_may());
    let mgr = Engine::new(driver, checkpoint);
    mgr.recover().await.expect("recover");
    let report = mgr.gc(&GcRequest::default(), Duration::from_secs(30)).await;
    assert!(report.errors.is_empty(), "startup GC: {report:?}");

    let _pod = add_refused_pod(&mgr).await;

    add_opted_in_pod_then_del_both(&mgr).await;
}
