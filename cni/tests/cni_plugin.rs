//! The `enim` CNI plugin binary, run as a runtime runs it: env_clear() plus
//! the CNI variables, the config on stdin. No real agent: the agent is
//! absent, hung, or a canned fake on a temp unix socket.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use enim_api::note;
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_enim");

fn conf(socket: &Path) -> String {
    json!({"cniVersion": "1.1.0", "name": "enim-net", "type": "enim", "socket": socket}).to_string()
}

/// Runs the plugin with exactly `vars` in its environment.
fn run(vars: &[(&str, &str)], stdin: impl Into<Vec<u8>>) -> Output {
    let stdin = stdin.into();
    let mut child = Command::new(BIN)
        .env_clear()
        .envs(vars.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn enim");
    let mut pipe = child.stdin.take().unwrap();
    // From a thread: the plugin may stop reading early, and a large stdin
    // must not deadlock against its stdout.
    let writer = thread::spawn(move || match pipe.write_all(&stdin) {
        Err(e) if e.kind() == ErrorKind::BrokenPipe => {}
        r => r.expect("write stdin"),
    });
    let out = child.wait_with_output().expect("wait enim");
    writer.join().unwrap();
    out
}

fn attach_vars(cmd: &str) -> Vec<(&str, &str)> {
    vec![
        ("CNI_COMMAND", cmd),
        ("CNI_CONTAINERID", "0123abcd"),
        ("CNI_NETNS", "/run/netns/test-pod"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=0123abcd;K8S_POD_UID=uid-1",
        ),
    ]
}

fn without<'a>(mut vars: Vec<(&'a str, &'a str)>, name: &str) -> Vec<(&'a str, &'a str)> {
    vars.retain(|(k, _)| *k != name);
    vars
}

fn with<'a>(
    vars: Vec<(&'a str, &'a str)>,
    name: &'a str,
    value: &'a str,
) -> Vec<(&'a str, &'a str)> {
    let mut vars = without(vars, name);
    vars.push((name, value));
    vars
}

/// Asserts the spec's error JSON with `code` and exit status 1; returns it.
fn expect_error(out: &Output, code: u64) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {text:?}; stderr {:?}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(v["code"], code, "{v}");
    assert_eq!(out.status.code(), Some(1), "{v}");
    assert!(v["cniVersion"].is_string(), "{v}");
    assert!(v["msg"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(v["details"].is_string(), "{v}");
    v
}

/// Asserts exit status 0; `what` and stdout tell which run failed.
fn expect_exit_zero(out: &Output, what: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{what}: stdout {stdout:?}");
}

fn expect_silent_success(out: &Output) {
    expect_exit_zero(out, "silent success");
    assert!(
        out.stdout.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&out.stdout)
    );
}

fn nowhere() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("enimd.sock");
    (dir, path)
}

// ---- VERSION ----------------------------------------------------------

#[test]
fn version_needs_only_the_command() {
    let out = run(&[("CNI_COMMAND", "VERSION")], r#"{"cniVersion":"1.0.0"}"#);
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v,
        json!({"cniVersion": "1.0.0", "supportedVersions": ["0.4.0", "1.0.0", "1.1.0"]})
    );

    let out = run(&[("CNI_COMMAND", "VERSION")], "");
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["cniVersion"], "1.1.0");
    assert_eq!(v["supportedVersions"], json!(["0.4.0", "1.0.0", "1.1.0"]));
}

// ---- environment ------------------------------------------------------

#[test]
fn missing_or_unknown_command() {
    let (_d, sock) = nowhere();
    let v = expect_error(
        &run(&without(attach_vars("ADD"), "CNI_COMMAND"), conf(&sock)),
        4,
    );
    assert!(v["msg"].as_str().unwrap().contains("CNI_COMMAND"), "{v}");
    let v = expect_error(
        &run(
            &with(attach_vars("ADD"), "CNI_COMMAND", "FROB"),
            conf(&sock),
        ),
        4,
    );
    assert!(v["msg"].as_str().unwrap().contains("FROB"), "{v}");
}

#[test]
fn missing_required_variables_are_named() {
    let (_d, sock) = nowhere();
    for cmd in ["ADD", "CHECK"] {
        for name in ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"] {
            let v = expect_error(&run(&without(attach_vars(cmd), name), conf(&sock)), 4);
            assert!(
                v["msg"].as_str().unwrap().contains(name),
                "{cmd} {name}: {v}"
            );
        }
    }
    for name in ["CNI_CONTAINERID", "CNI_IFNAME"] {
        let v = expect_error(&run(&without(attach_vars("DEL"), name), conf(&sock)), 4);
        assert!(v["msg"].as_str().unwrap().contains(name), "DEL {name}: {v}");
    }
}

#[test]
fn invalid_variables() {
    let (_d, sock) = nowhere();
    for (name, bad) in [
        ("CNI_CONTAINERID", "-starts-with-dash"),
        ("CNI_CONTAINERID", "has/slash"),
        ("CNI_IFNAME", "much-too-long-name"),
        ("CNI_IFNAME", "a:b"),
        ("CNI_NETNS", "relative/netns"),
    ] {
        let v = expect_error(&run(&with(attach_vars("ADD"), name, bad), conf(&sock)), 4);
        assert!(
            v["msg"].as_str().unwrap().contains(name),
            "{name}={bad}: {v}"
        );
    }
}

#[test]
fn del_needs_no_netns() {
    // It gets past the environment to the socket, which is not there.
    let (_d, sock) = nowhere();
    expect_error(
        &run(
            &without(attach_vars("DEL"), "CNI_NETNS"),
            conf_waiting(&sock, 0.0),
        ),
        11,
    );
}

#[test]
fn cni_args() {
    let (_d, sock) = nowhere();
    let add = |args: &str| {
        run(
            &with(attach_vars("ADD"), "CNI_ARGS", args),
            conf_waiting(&sock, 0.0),
        )
    };

    let v = expect_error(&add("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;FOO=bar"), 4);
    assert!(v["msg"].as_str().unwrap().contains("FOO"), "{v}");
    expect_error(&add("K8S_POD_NAME"), 4);
    expect_error(&add("IgnoreUnknown=0;FOO=bar"), 4);

    // Good args: parsing passes and ADD fails only at the absent agent.
    for good in [
        "IgnoreUnknown=1;FOO=bar;K8S_POD_NAME=p",
        "FOO=bar;IgnoreUnknown=TRUE",
        "IgnoreUnknown=true;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID=x;K8S_POD_UID=u",
        "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID=x;K8S_POD_UID=u",
        "",
    ] {
        expect_error(&add(good), 11);
    }
}

// ---- stdin ------------------------------------------------------------

#[test]
fn bad_stdin() {
    let (_d, sock) = nowhere();
    let add = |stdin: Vec<u8>| run(&attach_vars("ADD"), stdin);

    expect_error(&add(b"this is not json".to_vec()), 6);
    expect_error(&add(br#"{"cniVersion":"1.1.0","name":"n","#.to_vec()), 6);
    expect_error(&add(Vec::new()), 6);
    expect_error(&add(br#"{"name":"n"}"#.to_vec()), 7);
    expect_error(&add(br#"{"cniVersion":"1.1.0"}"#.to_vec()), 7);
    let v = expect_error(&add(br#"{"cniVersion":"0.3.1","name":"n"}"#.to_vec()), 1);
    assert!(v["msg"].as_str().unwrap().contains("0.3.1"), "{v}");
    expect_error(&add(br#"{"cniVersion":"9.9.9","name":"n"}"#.to_vec()), 1);

    // Errors are reported in the version the config asked for.
    let v = expect_error(
        &run(
            &without(attach_vars("ADD"), "CNI_IFNAME"),
            json!({"cniVersion": "0.4.0", "name": "n", "socket": sock}).to_string(),
        ),
        4,
    );
    assert_eq!(v["cniVersion"], "0.4.0");
}

#[test]
fn ten_megabytes_of_stdin() {
    let mut big = br#"{"cniVersion":"1.1.0","name":"n","pad":""#.to_vec();
    big.resize(10 * 1024 * 1024, b'x');
    big.extend_from_slice(b"\"}");
    let start = Instant::now();
    let v = expect_error(&run(&attach_vars("ADD"), big), 6);
    assert!(v["msg"].as_str().unwrap().contains("1 MiB"), "{v}");
    assert!(start.elapsed() < Duration::from_secs(10));
}

// ---- the agent absent or hung -----------------------------------------

/// `conf` with `agentWaitSeconds` (how long ADD, DEL and CHECK wait for
/// an agent that is down or starting).
fn conf_waiting(socket: &Path, secs: f64) -> String {
    json!({"cniVersion": "1.1.0", "name": "enim-net", "type": "enim", "socket": socket, "agentWaitSeconds": secs}).to_string()
}

#[test]
fn dead_agent_is_try_again_at_once_without_a_wait() {
    let (dir, sock) = nowhere();
    let start = Instant::now();
    for cmd in ["ADD", "DEL", "CHECK"] {
        let v = expect_error(&run(&attach_vars(cmd), conf_waiting(&sock, 0.0)), 11);
        assert!(
            v["msg"].as_str().unwrap().contains(sock.to_str().unwrap()),
            "{v}"
        );
    }
    // GC never waits.
    expect_error(&run(&[("CNI_COMMAND", "GC")], conf(&sock)), 11);

    // A socket file nobody listens on: refused.
    let stale = dir.path().join("stale.sock");
    drop(UnixListener::bind(&stale).unwrap());
    expect_error(&run(&attach_vars("ADD"), conf_waiting(&stale, 0.0)), 11);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

/// ADD, DEL and CHECK wait for an agent that is down (a restart, a crash
/// back-off) and succeed once it is back: the runtime never sees it go.
#[test]
fn add_del_check_wait_for_an_agent_that_comes_back() {
    for cmd in ["ADD", "DEL", "CHECK"] {
        let (_d, sock) = nowhere();
        let answer = if cmd == "DEL" {
            json!({})
        } else {
            agent_result()
        };
        let delay = Duration::from_millis(800);
        let late = sock.clone();
        let agent = thread::spawn(move || {
            thread::sleep(delay);
            fake_agent(&late, vec![(200, answer)])
        });
        let start = Instant::now();
        let out = run(&attach_vars(cmd), conf(&sock));
        let took = start.elapsed();
        expect_exit_zero(&out, cmd);
        assert!(
            took >= delay && took < Duration::from_secs(10),
            "{cmd}: {took:?}"
        );
        let rx = agent.join().unwrap();
        let path = format!("/v1/attachments/{}", cmd.to_lowercase());
        expect_next(&rx, "POST", &path);
    }
}

#[test]
fn the_wait_for_the_agent_is_bounded() {
    let (_d, sock) = nowhere();
    let start = Instant::now();
    let v = expect_error(&run(&attach_vars("ADD"), conf_waiting(&sock, 1.0)), 11);
    let took = start.elapsed();
    assert!(v["msg"].as_str().unwrap().contains("waited 1s"), "{v}");
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(4),
        "{took:?}"
    );
}

// ---- STATUS: the network, not the process ------------------------------

/// enimd's note beside `sock`: alive `ago` ago, with `bound` and `serving`,
/// in this boot (or `boot`).
fn write_note(sock: &Path, ago: Duration, bound_secs: u64, serving: Value, boot: Option<&str>) {
    let boot_id = boot.map_or_else(|| note::boot_id().unwrap(), str::to_string);
    let now = note::boot_clock_ms().unwrap();
    let ago_ms = u64::try_from(ago.as_millis()).unwrap();
    let n = json!({
        "boot_id": boot_id,
        "alive_ms": now.saturating_sub(ago_ms),
        "away_bound_secs": bound_secs,
        "serving": serving,
        "pid": 1,
    });
    std::fs::write(note::note_path(sock), n.to_string()).unwrap();
}

/// A note of an agent alive 3 s ago in this boot, serving, that may be
/// away for 600 s.
fn write_recent_available_note(sock: &Path) {
    let available = json!({"state": "available"});
    write_note(sock, Duration::from_secs(3), 600, available, None);
}

fn status(sock: &Path) -> Output {
    run(&[("CNI_COMMAND", "STATUS")], conf(sock))
}

#[test]
fn status_with_agent_down_answers_from_its_note() {
    let (_d, sock) = nowhere();
    let available = json!({"state": "available"});
    // No note: enimd has not served since the node booted.
    let v = expect_error(&status(&sock), 50);
    assert!(
        v["msg"].as_str().unwrap().contains("since the node booted"),
        "{v}"
    );
    assert!(
        v["details"].as_str().unwrap().contains("not reachable"),
        "{v}"
    );

    // enimd was alive a minute ago and judged the network available:
    // available (a restart, a crash loop), and at once.
    write_note(&sock, Duration::from_secs(60), 600, available.clone(), None);
    let start = Instant::now();
    expect_silent_success(&status(&sock));
    assert!(start.elapsed() < Duration::from_secs(2));
    // A socket file with nobody behind it (a killed enimd's): the same.
    drop(UnixListener::bind(&sock).unwrap());
    expect_silent_success(&status(&sock));

    // Away longer than its bound: an agent gone for good.
    write_note(
        &sock,
        Duration::from_secs(601),
        600,
        available.clone(),
        None,
    );
    let v = expect_error(&status(&sock), 50);
    assert!(
        v["msg"].as_str().unwrap().contains("longer than its bound"),
        "{v}"
    );
    // A note of another boot speaks for nothing.
    write_note(&sock, Duration::ZERO, 600, available, Some("another-boot"));
    let v = expect_error(&status(&sock), 50);
    assert!(v["msg"].as_str().unwrap().contains("earlier boot"), "{v}");
    // enimd's last judgement was "unavailable": it stands.
    let broken =
        json!({"state": "unavailable", "reason": "every ENI enim may hand out (2) is quarantined"});
    write_note(&sock, Duration::from_secs(5), 600, broken, None);
    let v = expect_error(&status(&sock), 50);
    assert!(v["msg"].as_str().unwrap().contains("quarantined"), "{v}");
    // A note that is not one.
    std::fs::write(note::note_path(&sock), "{").unwrap();
    let v = expect_error(&status(&sock), 50);
    assert!(v["msg"].as_str().unwrap().contains("cannot be read"), "{v}");
}

#[test]
fn status_of_a_starting_or_hung_agent_answers_from_its_note() {
    let (_d, sock) = nowhere();
    write_recent_available_note(&sock);
    let starting = json!({"version": "0.1.0", "ready": false, "provider": "static", "enis_total": 4, "enis_free": 4, "attachments": 0, "uptime_secs": 1});
    let rx = fake_agent(&sock, vec![(200, starting)]);
    expect_silent_success(&status(&sock));
    expect_next(&rx, "GET", "/v1/status");

    // One that accepts and never answers: STATUS gives it 2 s, not 30.
    let (_d, sock) = nowhere();
    write_recent_available_note(&sock);
    let listener = UnixListener::bind(&sock).unwrap();
    let hold = thread::spawn(move || {
        let (held, _) = listener.accept().unwrap();
        thread::sleep(Duration::from_secs(4));
        drop(held);
    });
    let start = Instant::now();
    expect_silent_success(&status(&sock));
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(4),
        "{took:?}"
    );
    hold.join().unwrap();
}

#[test]
fn hung_agent_times_out() {
    let (_d, sock) = nowhere();
    let listener = UnixListener::bind(&sock).unwrap();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let server = thread::spawn(move || {
        let mut held = Vec::new();
        listener.set_nonblocking(true).unwrap();
        // Accept and never answer, until the test is over.
        while stop_rx.try_recv().is_err() {
            match listener.accept() {
                Ok((s, _)) => held.push(s),
                Err(_) => thread::sleep(Duration::from_millis(10)),
            }
        }
    });
    let config = json!({"cniVersion": "1.1.0", "name": "n", "socket": sock, "timeoutSeconds": 1})
        .to_string();

    let start = Instant::now();
    let v = expect_error(&run(&attach_vars("ADD"), config.clone()), 11);
    let took = start.elapsed();
    assert!(v["msg"].as_str().unwrap().contains("did not answer"), "{v}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "{took:?}"
    );

    let start = Instant::now();
    expect_error(&run(&[("CNI_COMMAND", "STATUS")], config), 50);
    assert!(start.elapsed() < Duration::from_secs(4));

    stop_tx.send(()).unwrap();
    server.join().unwrap();
}

// ---- against a canned fake agent --------------------------------------

/// One request as the fake agent saw it.
struct Seen {
    method: String,
    path: String,
    body: Value,
}

/// The fake agent's next request, which must be `method` `path`.
fn expect_next(rx: &mpsc::Receiver<Seen>, method: &str, path: &str) -> Seen {
    let seen = rx.recv().unwrap();
    assert_eq!((seen.method.as_str(), seen.path.as_str()), (method, path));
    seen
}

/// Serves `answers` in order, one per connection, and reports each request.
fn fake_agent(sock: &Path, answers: Vec<(u16, Value)>) -> mpsc::Receiver<Seen> {
    let listener = UnixListener::bind(sock).unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for (status, answer) in answers {
            let (mut s, _) = listener.accept().unwrap();
            let seen = read_request(&mut s);
            let body = answer.to_string();
            let resp = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            s.write_all(resp.as_bytes()).unwrap();
            tx.send(seen).unwrap();
        }
    });
    rx
}

fn read_request(s: &mut UnixStream) -> Seen {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "plugin closed before a full request");
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        if let httparse::Status::Complete(head) = req.parse(&buf).unwrap() {
            let len: usize = req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .map(|h| std::str::from_utf8(h.value).unwrap().parse().unwrap())
                .expect("Content-Length");
            assert!(req
                .headers
                .iter()
                .any(|h| h.name.eq_ignore_ascii_case("connection") && h.value == b"close"));
            if buf.len() >= head + len {
                let body = if len == 0 {
                    Value::Null
                } else {
                    serde_json::from_slice(&buf[head..head + len]).unwrap()
                };
                return Seen {
                    method: req.method.unwrap().to_string(),
                    path: req.path.unwrap().to_string(),
                    body,
                };
            }
        }
    }
}

/// The pod's interface as the fake agent describes it; the plugin's 1.x
/// result lists it unchanged.
fn pod_interface() -> Value {
    json!({"name": "eth0", "mac": "02:00:00:00:00:0a", "mtu": 9001, "sandbox": "/run/netns/test-pod"})
}

/// The route the fake agent gives the pod; passed through as it is.
fn default_route() -> Value {
    json!({"dst": "0.0.0.0/0", "gw": "10.0.1.1"})
}

fn agent_result() -> Value {
    json!({
        "interface": pod_interface(),
        "ips": [{"address": "10.0.1.5/24", "gateway": "10.0.1.1"}],
        "routes": [default_route()],
        "eni_id": "eni-1"
    })
}

#[test]
fn add_against_fake_agent() {
    let (_d, sock) = nowhere();
    let rx = fake_agent(&sock, vec![(200, agent_result()), (200, agent_result())]);

    let out = run(&attach_vars("ADD"), conf(&sock));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        result,
        json!({
            "cniVersion": "1.1.0",
            "interfaces": [pod_interface()],
            "ips": [{"interface": 0, "address": "10.0.1.5/24", "gateway": "10.0.1.1"}],
            "routes": [default_route()],
            "dns": {}
        })
    );
    let seen = expect_next(&rx, "POST", "/v1/attachments/add");
    assert_eq!(
        seen.body,
        json!({
            "network": "enim-net", "container_id": "0123abcd", "ifname": "eth0",
            "netns": "/run/netns/test-pod",
            "pod": {"namespace": "default", "name": "web-0", "uid": "uid-1"}
        })
    );

    // Chained after another interface plugin, in 0.4.0.
    let config = json!({
        "cniVersion": "0.4.0", "name": "enim-net", "socket": sock,
        "prevResult": {
            "cniVersion": "0.4.0",
            "interfaces": [{"name": "lo", "sandbox": "/run/netns/test-pod"}],
            "ips": [{"version": "4", "interface": 0, "address": "127.0.0.1/8"}],
            "dns": {"nameservers": ["10.0.0.10"]}
        }
    });
    let out = run(&attach_vars("ADD"), config.to_string());
    assert_eq!(out.status.code(), Some(0));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["cniVersion"], "0.4.0");
    assert_eq!(
        result["interfaces"][1],
        json!({"name": "eth0", "mac": "02:00:00:00:00:0a", "sandbox": "/run/netns/test-pod"})
    );
    assert_eq!(
        result["ips"][1],
        json!({"version": "4", "interface": 1, "address": "10.0.1.5/24", "gateway": "10.0.1.1"})
    );
    assert_eq!(result["dns"], json!({"nameservers": ["10.0.0.10"]}));
}

#[test]
fn agent_errors_pass_through() {
    let (_d, sock) = nowhere();
    let _rx = fake_agent(
        &sock,
        vec![(
            409,
            json!({"code": 100, "msg": "eth0 exists in the pod", "details": "/run/netns/test-pod"}),
        )],
    );
    let v = expect_error(&run(&attach_vars("ADD"), conf(&sock)), 100);
    assert_eq!(v["msg"], "eth0 exists in the pod");
    assert_eq!(v["details"], "/run/netns/test-pod");
    assert_eq!(v["cniVersion"], "1.1.0");
}

#[test]
fn del_check_gc_status_against_fake_agent() {
    let (_d, sock) = nowhere();
    let ready = json!({"version": "0.1.0", "ready": true, "provider": "static", "enis_total": 4, "enis_free": 2, "attachments": 2, "uptime_secs": 5});
    let mut not_ready = ready.clone();
    not_ready["ready"] = json!(false);
    // A full node is available (its ADDs say "try again later"); a node
    // whose provider offers nothing at all is not.
    let mut exhausted = ready.clone();
    exhausted["enis_free"] = json!(0);
    let mut empty = exhausted.clone();
    empty["enis_total"] = json!(0);
    let report = json!({"collected": [], "too_young": 0, "orphans_released": [], "normalised": [], "errors": []});
    let rx = fake_agent(
        &sock,
        vec![
            (200, json!({})),
            (200, agent_result()),
            (200, agent_result()),
            (200, report),
            (200, ready),
            (200, not_ready),
            (200, exhausted),
            (200, empty),
        ],
    );

    // DEL ignores prevResult and prints nothing.
    let del_conf = json!({"cniVersion": "1.1.0", "name": "enim-net", "socket": sock, "prevResult": {"interfaces": "junk"}});
    expect_silent_success(&run(
        &without(attach_vars("DEL"), "CNI_NETNS"),
        del_conf.to_string(),
    ));
    let seen = expect_next(&rx, "POST", "/v1/attachments/del");
    assert_eq!(seen.body["netns"], "");
    assert_eq!(seen.body["container_id"], "0123abcd");

    // CHECK with the chain's final result: its MTU is the one to hold.
    let check_conf = json!({
        "cniVersion": "1.1.0", "name": "enim-net", "socket": sock,
        "prevResult": {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0", "mtu": 1400, "sandbox": "/run/netns/test-pod"}]}
    });
    expect_silent_success(&run(&attach_vars("CHECK"), check_conf.to_string()));
    let seen = expect_next(&rx, "POST", "/v1/attachments/check");
    assert_eq!(seen.body["expected_mtu"], json!({"exactly": 1400}));

    // CHECK whose prevResult lacks our interface fails.
    let check_conf = json!({
        "cniVersion": "1.1.0", "name": "enim-net", "socket": sock,
        "prevResult": {"cniVersion": "1.1.0", "interfaces": [{"name": "net1"}]}
    });
    let v = expect_error(&run(&attach_vars("CHECK"), check_conf.to_string()), 103);
    assert!(v["msg"].as_str().unwrap().contains("eth0"), "{v}");
    assert_eq!(rx.recv().unwrap().body["expected_mtu"], "skip");

    // GC forwards the valid attachments for this network.
    let gc_conf = json!({
        "cniVersion": "1.1.0", "name": "enim-net", "socket": sock,
        "cni.dev/valid-attachments": [{"containerID": "0123abcd", "ifname": "eth0"}]
    });
    expect_silent_success(&run(
        &[("CNI_COMMAND", "GC"), ("CNI_PATH", "/opt/cni/bin")],
        gc_conf.to_string(),
    ));
    let seen = expect_next(&rx, "POST", "/v1/gc");
    assert_eq!(
        seen.body,
        json!({"network": "enim-net", "valid_attachments": [{"containerID": "0123abcd", "ifname": "eth0"}]})
    );

    // STATUS: ready, then starting (with no note of this boot: not
    // available), then full (available), then empty.
    expect_silent_success(&run(&[("CNI_COMMAND", "STATUS")], conf(&sock)));
    expect_next(&rx, "GET", "/v1/status");
    let v = expect_error(&run(&[("CNI_COMMAND", "STATUS")], conf(&sock)), 50);
    assert!(
        v["msg"].as_str().unwrap().contains("since the node booted"),
        "{v}"
    );
    assert!(v["details"].as_str().unwrap().contains("starting"), "{v}");
    expect_silent_success(&run(&[("CNI_COMMAND", "STATUS")], conf(&sock)));
    let v = expect_error(&run(&[("CNI_COMMAND", "STATUS")], conf(&sock)), 50);
    assert!(v["msg"].as_str().unwrap().contains("no ENI at all"), "{v}");
}

/// A ready enimd's own judgement of the network is what STATUS says: an
/// enimd that finds every ENI quarantined is not available; one whose
/// pool is making the node's first ENI is (its ADDs wait for it).
#[test]
fn status_passes_a_ready_agents_judgement_on() {
    let (_d, sock) = nowhere();
    let ready = json!({"version": "0.1.0", "ready": true, "provider": "static", "enis_total": 2, "enis_free": 0, "attachments": 0, "uptime_secs": 5});
    let mut quarantined = ready.clone();
    quarantined["serving"] = json!({"state": "unavailable", "reason": "every ENI enim may hand out (2) is quarantined: its device is not on the node"});
    let mut growing = ready.clone();
    growing["enis_total"] = json!(0);
    growing["serving"] = json!({"state": "available"});
    let rx = fake_agent(&sock, vec![(200, quarantined), (200, growing)]);
    let v = expect_error(&status(&sock), 50);
    assert!(v["msg"].as_str().unwrap().contains("is quarantined"), "{v}");
    assert_eq!(v["details"], "provider static");
    expect_silent_success(&status(&sock));
    assert_eq!(rx.iter().take(2).count(), 2);
}
