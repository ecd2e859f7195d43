//! The API client as the plugin sees it, against stub agents on a unix
//! socket (dead, hung, slow, chunked, oversized and erroring ones): what
//! each answer is as a `ClientError`, and as the CNI error the plugin
//! prints. Here, not beside the client, because the plugin's mapping is
//! half of what is checked.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream as StdStream};
use std::sync::mpsc;
use std::thread;
use std::time::Instant as StdInstant;

use enim_api::client::MAX_RESPONSE;
use enim_api::{code, ApiError, Client, ClientError, Status, ROUTE_STATUS};
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, UnixAddr};

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::CniError;

/// A request as the stub agent saw it.
#[derive(Debug)]
struct Seen {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn read_request(s: &mut StdStream) -> Seen {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        if let httparse::Status::Complete(n) = req.parse(&buf).unwrap() {
            let headers: Vec<(String, String)> = req
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_string(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect();
            let len: usize = headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                .map(|(_, v)| v.parse().unwrap())
                .unwrap_or(0);
            let (method, path) = (
                req.method.unwrap().to_string(),
                req.path.unwrap().to_string(),
            );
            while buf.len() < n + len {
                let k = s.read(&mut chunk).unwrap();
                assert!(k > 0, "client closed early");
                buf.extend_from_slice(&chunk[..k]);
            }
            return Seen {
                method,
                path,
                headers,
                body: buf[n..n + len].to_vec(),
            };
        }
        let k = s.read(&mut chunk).unwrap();
        assert!(k > 0, "client closed early");
        buf.extend_from_slice(&chunk[..k]);
    }
}

/// A stub agent serving one connection with `answer` (written in small
/// pieces to exercise partial reads); reports the request it saw.
fn serve_once(
    answer: impl AsRef<[u8]> + Send + 'static,
) -> (tempfile::TempDir, PathBuf, mpsc::Receiver<Seen>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let seen = read_request(&mut s);
        for piece in answer.as_ref().chunks(7) {
            if s.write_all(piece).is_err() {
                break;
            }
        }
        let _ = tx.send(seen);
    });
    (dir, path, rx)
}

fn client(path: &Path) -> Client {
    Client::new(path, Duration::from_secs(5))
}

/// The error of a GET that the stub agent answers with `answer`.
fn get_err(answer: impl AsRef<[u8]> + Send + 'static) -> ClientError {
    let (_d, path, _rx) = serve_once(answer);
    // These cases judge the error, not the time: a debug build on a loaded
    // machine took over 5 s to read the 9 MiB answers.
    Client::new(&path, Duration::from_secs(60))
        .get::<Status>("/x")
        .unwrap_err()
}

/// A GET with `timeout` that must fail: its error and how long it took.
fn timed_get(path: &Path, timeout: Duration) -> (ClientError, Duration) {
    let start = StdInstant::now();
    let e = Client::new(path, timeout).get::<Status>("/x").unwrap_err();
    (e, start.elapsed())
}

fn assert_took(took: Duration, at_least: Duration, under: Duration) {
    assert!(took >= at_least && took < under, "{took:?}");
}

/// The CNI code the plugin turns `e` into.
fn cni_code(e: ClientError) -> u32 {
    CniError::from(e).code()
}

const STATUS: &str = r#"{"version":"0.1.0","ready":true,"provider":"static","enis_total":4,"enis_free":3,"attachments":1,"uptime_secs":9}"#;

#[test]
fn get_with_content_length() {
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{STATUS}",
        STATUS.len()
    );
    let (_d, path, rx) = serve_once(answer);
    let s: Status = client(&path).get(ROUTE_STATUS).unwrap();
    assert_eq!(s.enis_free, 3);
    let seen = rx.recv().unwrap();
    assert_eq!(seen.method, "GET");
    assert_eq!(seen.path, "/v1/status");
    assert_eq!(seen.header("connection"), Some("close"));
    assert_eq!(seen.header("content-length"), Some("0"));
    assert_eq!(seen.header("host"), Some("localhost"));
    assert_eq!(seen.header("accept"), Some("application/json"));
    assert!(seen.header("user-agent").unwrap().starts_with("enim-cni/"));
}

#[test]
fn post_sends_json() {
    let (_d, path, rx) = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}");
    let body = serde_json::json!({"network": "n", "container_id": "c"});
    client(&path)
        .post_ignore("/v1/attachments/del", &body)
        .unwrap();
    let seen = rx.recv().unwrap();
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.path, "/v1/attachments/del");
    assert_eq!(seen.header("content-type"), Some("application/json"));
    assert_eq!(seen.header("transfer-encoding"), None);
    let sent: serde_json::Value = serde_json::from_slice(&seen.body).unwrap();
    assert_eq!(sent, body);
}

#[test]
fn one_client_many_calls() {
    let c = client(Path::new("/nonexistent/x.sock"));
    for _ in 0..3 {
        assert!(matches!(
            c.get::<Status>("/x").unwrap_err(),
            ClientError::Unreachable { .. }
        ));
    }
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{STATUS}",
        STATUS.len()
    );
    let (_d, path, _rx) = serve_once(answer.clone());
    let c = client(&path);
    c.get::<Status>("/x").unwrap();
    // The agent served one connection: the next one is refused.
    assert!(matches!(
        c.get::<Status>("/x").unwrap_err(),
        ClientError::Unreachable { .. }
    ));
}

#[test]
fn chunked_until_close_and_interim() {
    let (_d, path, _rx) = serve_once(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\na;ext=1\r\n 12345678}\r\n0\r\n\r\n",
    );
    let v: serde_json::Value = client(&path).post("/x", &()).unwrap();
    assert_eq!(v, serde_json::json!({"a": 12345678}));

    // Trailers after the last chunk are ignored.
    let (_d, path, _rx) = serve_once(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n[1]\r\n0\r\nX-T: 1\r\n\r\n",
    );
    let v: Vec<u32> = client(&path).get("/x").unwrap();
    assert_eq!(v, vec![1]);

    let (_d, path, _rx) = serve_once(b"HTTP/1.1 200 OK\r\n\r\n[1,2,3]");
    let v: Vec<u32> = client(&path).get("/x").unwrap();
    assert_eq!(v, vec![1, 2, 3]);

    let (_d, path, _rx) = serve_once(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ntrue",
    );
    let v: bool = client(&path).get("/x").unwrap();
    assert!(v);
}

#[test]
fn api_error_passes_through() {
    let body = r#"{"code":3,"msg":"no such attachment","details":"x"}"#;
    let (_d, path, _rx) = serve_once(format!(
        "HTTP/1.1 404 Not Found\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ));
    let e = client(&path).post_ignore("/x", &()).unwrap_err();
    let want = ApiError::new(3, "no such attachment").with_details("x");
    assert!(
        matches!(&e, ClientError::Api { status: 404, error } if *error == want),
        "{e:?}"
    );
    assert_eq!(CniError::from(e), CniError::from(want));
}

#[test]
fn odd_answers() {
    let e = get_err(b"HTTP/1.1 500 Oops\r\nContent-Length: 4\r\n\r\nboom");
    assert!(matches!(&e, ClientError::Status { status: 500, body } if body == "boom"));
    let e = CniError::from(e);
    assert_eq!(e.code(), code::INTERNAL);
    assert_eq!(e.details(), "boom");

    let e = get_err(b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n");
    assert!(e.is_transient());
    assert_eq!(cni_code(e), 11);

    // Well-framed but not the JSON asked for; not HTTP; a bad length; a
    // bad chunk size; a chunk not followed by CRLF: malformed, code 6.
    for bad in [
        &b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nnah"[..],
        b"SMTP ready\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcd\r\n0\r\n\r\n",
    ] {
        let e = get_err(bad);
        assert!(matches!(e, ClientError::Malformed { .. }), "{bad:?}: {e:?}");
        assert_eq!(cni_code(e), 6, "{bad:?}");
    }

    // Truncated body, truncated head, nothing at all: the agent died
    // mid-answer, which is worth a retry.
    for cut in [
        &b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"a\""[..],
        b"HTTP/1.1 200 OK\r\nContent-Le",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\"",
        b"",
    ] {
        let e = get_err(cut);
        assert!(matches!(e, ClientError::CutShort { .. }), "{cut:?}: {e:?}");
        assert!(e.to_string().contains("closed the connection"), "{e}");
        assert_eq!(cni_code(e), 11, "{cut:?}");
    }
}

#[test]
fn oversized_answers_are_refused() {
    // A declared length over the limit fails before any of it is read.
    let e = get_err(format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{{",
        MAX_RESPONSE + 1
    ));
    assert!(matches!(e, ClientError::TooLarge), "{e:?}");
    assert_eq!(cni_code(e), 6);

    // Chunked or close-delimited bodies that keep coming are cut off at
    // the limit, not buffered to the end.
    let mut chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    let piece = vec![b' '; 1024 * 1024];
    for _ in 0..9 {
        chunked.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        chunked.extend_from_slice(&piece);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let mut close = b"HTTP/1.1 200 OK\r\n\r\n".to_vec();
    close.extend(std::iter::repeat_n(b' ', MAX_RESPONSE + 1));
    for answer in [chunked, close] {
        let e = get_err(answer);
        assert!(matches!(e, ClientError::TooLarge), "{e:?}");
    }

    // A head that never ends is bounded too.
    let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
    while head.len() <= MAX_RESPONSE {
        head.extend_from_slice(b"X-Pad: 0123456789012345678901234567890123456789\r\n");
    }
    let e = get_err(head);
    assert!(matches!(e, ClientError::TooLarge), "{e:?}");
}

#[test]
fn dead_agent_is_try_again_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let start = StdInstant::now();
    // Nothing at the path.
    let e = client(&dir.path().join("none.sock"))
        .get::<Status>("/x")
        .unwrap_err();
    assert!(matches!(e, ClientError::Unreachable { .. }), "{e:?}");
    assert!(e.to_string().contains("not reachable"), "{e}");
    assert_eq!(cni_code(e), 11);
    // A socket file with no listener behind it: refused.
    let path = dir.path().join("stale.sock");
    drop(UnixListener::bind(&path).unwrap());
    let e = CniError::from(client(&path).get::<Status>("/x").unwrap_err());
    assert_eq!(e.code(), 11);
    assert!(e.details().contains("refused"), "{e:?}");
    assert!(start.elapsed() < Duration::from_secs(1));
}

#[test]
fn hung_agent_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hung.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let (tx, rx) = mpsc::channel::<()>();
    let server = thread::spawn(move || {
        let (_s, _) = listener.accept().unwrap();
        // Hold the connection open, never answering, until the test ends.
        let _ = rx.recv();
    });
    let (e, took) = timed_get(&path, Duration::from_secs(1));
    assert!(matches!(e, ClientError::TimedOut { .. }), "{e:?}");
    assert!(e.to_string().contains("did not answer within 1s"), "{e}");
    assert_eq!(cni_code(e), 11);
    assert_took(took, Duration::from_millis(900), Duration::from_secs(3));
    drop(tx);
    server.join().unwrap();
}

#[test]
fn slow_trickle_is_bounded_by_one_deadline() {
    // Each piece comes well within the timeout, the whole answer not:
    // the deadline covers the exchange, not each read.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("slow.sock");
    let listener = UnixListener::bind(&path).unwrap();
    thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        read_request(&mut s);
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{STATUS}",
            STATUS.len()
        );
        for b in answer.as_bytes() {
            if s.write_all(&[*b]).is_err() {
                break;
            }
            thread::sleep(Duration::from_millis(100));
        }
    });
    let (e, took) = timed_get(&path, Duration::from_millis(500));
    assert!(matches!(e, ClientError::TimedOut { .. }), "{e:?}");
    assert!(took < Duration::from_secs(2));
}

#[test]
fn wedged_agent_connect_times_out() {
    // A listener that never accepts, with the smallest backlog: once it
    // is full, connects must give up at the deadline.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wedged.sock");
    let fd = socket::socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    socket::bind(fd.as_raw_fd(), &UnixAddr::new(&path).unwrap()).unwrap();
    socket::listen(&fd, socket::Backlog::new(0).unwrap()).unwrap();

    let mut held = Vec::new();
    loop {
        match StdStream::connect(&path) {
            Ok(s) if held.len() < 64 => {
                s.set_nonblocking(true).unwrap();
                held.push(s)
            }
            _ => break,
        }
        // The std connect blocks once the backlog is full, so probe
        // with the client (which does not) before each new one.
        let probe = Client::new(&path, Duration::from_millis(50));
        if matches!(
            probe.get::<Status>("/x"),
            Err(ClientError::NotAccepting { .. })
        ) {
            break;
        }
    }
    assert!(held.len() < 64, "backlog never filled");

    let (e, took) = timed_get(&path, Duration::from_millis(300));
    assert!(matches!(e, ClientError::NotAccepting { .. }), "{e:?}");
    assert!(e.to_string().contains("did not accept"), "{e}");
    assert_eq!(cni_code(e), 11);
    assert_took(took, Duration::from_millis(200), Duration::from_secs(2));
}

#[test]
fn long_socket_path_is_a_config_error() {
    let long = format!("/tmp/{}", "x".repeat(200));
    let e = client(Path::new(&long)).get::<Status>("/x").unwrap_err();
    assert!(matches!(e, ClientError::BadSocket { .. }), "{e:?}");
    assert_eq!(cni_code(e), 7);
}

#[test]
fn encode_failure_is_typed() {
    // A map with non-string keys cannot be JSON.
    let body: std::collections::HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
    let e = client(Path::new("/nonexistent/x.sock"))
        .post_ignore("/x", &body)
        .unwrap_err();
    assert!(matches!(e, ClientError::Encode(_)), "{e:?}");
    assert_eq!(cni_code(e), code::INTERNAL);
}

// ---- waiting for an agent that is down or starting --------------------

/// An HTTP answer with a JSON body.
fn answer(status: u16, body: &str) -> String {
    format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// A stub agent that binds `path` only after `delay` (a real unix socket
/// appearing, as enimd's does when it is back), then serves `answers` in
/// order, one connection each, and reports each request's path.
fn agent_after(
    path: &Path,
    delay: Duration,
    answers: Vec<String>,
) -> (thread::JoinHandle<()>, mpsc::Receiver<String>) {
    let path = path.to_path_buf();
    let (tx, rx) = mpsc::channel();
    let server = thread::spawn(move || {
        thread::sleep(delay);
        let listener = UnixListener::bind(&path).unwrap();
        for a in answers {
            let (mut s, _) = listener.accept().unwrap();
            let seen = read_request(&mut s);
            s.write_all(a.as_bytes()).unwrap();
            let _ = tx.send(seen.path);
        }
    });
    (server, rx)
}

const ATTACHED: &str = r#"{"interface":{"name":"eth0","mac":"02:00:00:00:00:0a","mtu":9001,"sandbox":"/run/netns/p"},"ips":[{"address":"10.0.1.5/24","gateway":"10.0.1.1"}],"routes":[],"eni_id":"eni-1"}"#;

/// The plugin's own run, as a runtime execs it, with `agentWaitSeconds`.
fn plugin(command: &str, socket: &Path, wait_secs: f64) -> (serde_json::Value, i32, Duration) {
    let conf = serde_json::json!({
        "cniVersion": "1.1.0", "name": "n", "socket": socket, "agentWaitSeconds": wait_secs
    })
    .to_string();
    let vars: std::collections::HashMap<&str, &str> = [
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", "c1"),
        ("CNI_NETNS", "/run/netns/p"),
        ("CNI_IFNAME", "eth0"),
    ]
    .into();
    let start = StdInstant::now();
    let out = crate::execute(
        &|k| vars.get(k).map(std::ffi::OsString::from),
        std::io::Cursor::new(conf.into_bytes()),
    );
    let v = out
        .stdout
        .map(|s| serde_json::from_str(&s).unwrap())
        .unwrap_or(serde_json::Value::Null);
    (v, out.exit_code, start.elapsed())
}

#[test]
fn add_del_check_wait_for_an_agent_that_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("enimd.sock");
    let delay = Duration::from_millis(700);
    let (server, rx) = agent_after(&sock, delay, vec![answer(200, ATTACHED)]);
    let (v, rc, took) = plugin("ADD", &sock, 10.0);
    assert_eq!(rc, 0, "{v}");
    assert_eq!(v["ips"][0]["address"], "10.0.1.5/24");
    assert_took(took, delay, Duration::from_secs(5));
    assert_eq!(rx.recv().unwrap(), "/v1/attachments/add");
    server.join().unwrap();

    // DEL and CHECK wait the same way.
    std::fs::remove_file(&sock).unwrap();
    let (server, rx) = agent_after(&sock, delay, vec![answer(200, "{}")]);
    let (v, rc, took) = plugin("DEL", &sock, 10.0);
    assert_eq!((rc, v), (0, serde_json::Value::Null));
    assert_took(took, delay, Duration::from_secs(5));
    assert_eq!(rx.recv().unwrap(), "/v1/attachments/del");
    server.join().unwrap();
    std::fs::remove_file(&sock).unwrap();
    let (server, rx) = agent_after(&sock, delay, vec![answer(200, ATTACHED)]);
    let (v, rc, took) = plugin("CHECK", &sock, 10.0);
    assert_eq!(rc, 0, "{v}");
    assert_took(took, delay, Duration::from_secs(5));
    assert_eq!(rx.recv().unwrap(), "/v1/attachments/check");
    server.join().unwrap();
}

#[test]
fn the_wait_is_bounded_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("enimd.sock");
    // Nobody comes within the wait: "try again later" once it is over.
    let (v, rc, took) = plugin("ADD", &sock, 0.4);
    assert_eq!((v["code"].as_u64(), rc), (Some(11), 1), "{v}");
    let msg = v["msg"].as_str().unwrap();
    assert!(
        msg.contains("not reachable") && msg.contains("waited 400ms"),
        "{msg}"
    );
    assert_took(took, Duration::from_millis(400), Duration::from_secs(2));
    // A socket file with nobody behind it (a killed enimd's) is waited for too.
    drop(UnixListener::bind(&sock).unwrap());
    let (v, _, took) = plugin("DEL", &sock, 0.3);
    assert_eq!(v["code"], 11, "{v}");
    assert_took(took, Duration::from_millis(300), Duration::from_secs(2));
    // agentWaitSeconds 0: at once, as before.
    let (v, _, took) = plugin("CHECK", &sock, 0.0);
    assert_eq!(v["code"], 11, "{v}");
    assert!(!v["msg"].as_str().unwrap().contains("waited"), "{v}");
    assert!(took < Duration::from_millis(300), "{took:?}");
}

#[test]
fn a_starting_agent_is_waited_for_and_other_refusals_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("enimd.sock");
    // enimd's startup_wait ran out: its "still restoring" is retried.
    let starting = serde_json::to_string(
        &ApiError::new(code::TRY_AGAIN_LATER, "restoring").with_details(enim_api::STARTING),
    )
    .unwrap();
    let (server, rx) = agent_after(
        &sock,
        Duration::ZERO,
        vec![answer(503, &starting), answer(200, ATTACHED)],
    );
    let (v, rc, _) = plugin("ADD", &sock, 10.0);
    assert_eq!(rc, 0, "{v}");
    assert_eq!(rx.iter().take(2).count(), 2);
    server.join().unwrap();

    // Any other answer is final, "no free ENI" included: one request.
    std::fs::remove_file(&sock).unwrap();
    let full = r#"{"code":11,"msg":"no free ENI"}"#;
    let (server, rx) = agent_after(&sock, Duration::ZERO, vec![answer(503, full)]);
    let (v, _, took) = plugin("ADD", &sock, 10.0);
    assert_eq!(
        (v["code"].as_u64(), v["msg"].as_str()),
        (Some(11), Some("no free ENI"))
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
    server.join().unwrap();
    assert_eq!(rx.iter().count(), 1);
}

#[test]
fn an_agent_that_dies_mid_add_is_asked_again_once_back() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("enimd.sock");
    let path = sock.clone();
    let (tx, rx) = mpsc::channel();
    let server = thread::spawn(move || {
        // The first enimd reads the ADD and dies without answering.
        let first = UnixListener::bind(&path).unwrap();
        let (mut s, _) = first.accept().unwrap();
        tx.send(read_request(&mut s).path).unwrap();
        drop(s);
        drop(first);
        std::fs::remove_file(&path).unwrap();
        // Its successor comes up a moment later and answers.
        thread::sleep(Duration::from_millis(300));
        let second = UnixListener::bind(&path).unwrap();
        let (mut s, _) = second.accept().unwrap();
        tx.send(read_request(&mut s).path).unwrap();
        s.write_all(answer(200, ATTACHED).as_bytes()).unwrap();
    });
    let (v, rc, _) = plugin("ADD", &sock, 10.0);
    assert_eq!(rc, 0, "{v}");
    server.join().unwrap();
    let paths: Vec<String> = rx.iter().collect();
    assert_eq!(paths, ["/v1/attachments/add", "/v1/attachments/add"]);
}

#[test]
fn gc_and_status_answer_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("enimd.sock");
    for command in ["GC", "STATUS"] {
        let (v, rc, took) = plugin(command, &sock, 30.0);
        assert_eq!(rc, 1, "{command}: {v}");
        assert!(took < Duration::from_secs(1), "{command}: {took:?}");
    }
}
