//! A small synchronous HTTP/1.1 client for the agent's unix socket. One
//! request per connection (`Connection: close`), every step bounded by one
//! deadline, so a dead or hung agent costs at most the configured timeout.

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, UnixAddr};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::CniError;
use crate::api::{code, ApiError};

/// Bounds what a broken agent can make us buffer.
const MAX_RESPONSE: usize = 8 * 1024 * 1024;
const MAX_HEADERS: usize = 64;

pub struct Client {
    socket: PathBuf,
    timeout: Duration,
}

/// A response's status and (de-chunked) body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

/// How the body of a response is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

#[derive(Debug)]
struct Head {
    status: u16,
    len: usize,
    framing: Framing,
}

impl Client {
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> Self {
        Client {
            socket: socket.into(),
            timeout,
        }
    }

    pub fn post<B: Serialize, R: DeserializeOwned>(
        &self,
        route: &str,
        body: &B,
    ) -> Result<R, CniError> {
        let resp = self.round_trip("POST", route, &self.encode(body)?)?;
        decode_ok(resp)
    }

    /// POST whose answer carries nothing we need (DEL's `{}`).
    pub fn post_ignore<B: Serialize>(&self, route: &str, body: &B) -> Result<(), CniError> {
        let resp = self.round_trip("POST", route, &self.encode(body)?)?;
        check_status(&resp)
    }

    pub fn get<R: DeserializeOwned>(&self, route: &str) -> Result<R, CniError> {
        decode_ok(self.round_trip("GET", route, &[])?)
    }

    fn encode<B: Serialize>(&self, body: &B) -> Result<Vec<u8>, CniError> {
        serde_json::to_vec(body).map_err(|e| {
            CniError::Agent(ApiError::new(
                code::INTERNAL,
                format!("failed to encode the request: {e}"),
            ))
        })
    }

    /// Sends one request and reads its response, within the timeout.
    pub fn round_trip(&self, method: &str, route: &str, body: &[u8]) -> Result<Response, CniError> {
        let deadline = Instant::now() + self.timeout;
        let mut stream = self.connect()?;

        let mut req = format!(
            "{method} {route} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: enim-cni/{}\r\n\
             Accept: application/json\r\nConnection: close\r\nContent-Length: {}\r\n",
            env!("CARGO_PKG_VERSION"),
            body.len()
        )
        .into_bytes();
        if !body.is_empty() {
            req.extend_from_slice(b"Content-Type: application/json\r\n");
        }
        req.extend_from_slice(b"\r\n");
        req.extend_from_slice(body);

        stream
            .set_write_timeout(Some(self.remaining(deadline)?))
            .and_then(|()| stream.write_all(&req))
            .map_err(|e| self.io_error("sending the request", e))?;
        // The write half stays open: some servers take a half-close as the
        // client going away and drop the answer.

        let mut buf = Vec::with_capacity(4096);
        let head = loop {
            if let Some(head) = parse_head(&buf)? {
                if (100..200).contains(&head.status) {
                    // An interim answer (100 Continue): the real one follows.
                    buf.drain(..head.len);
                    continue;
                }
                break head;
            }
            if !self.read_more(&mut stream, &mut buf, deadline)? {
                return Err(self.cut_short());
            }
        };
        buf.drain(..head.len);

        let body = match head.framing {
            Framing::Length(n) => {
                if n > MAX_RESPONSE {
                    return Err(too_large());
                }
                while buf.len() < n {
                    if !self.read_more(&mut stream, &mut buf, deadline)? {
                        return Err(self.cut_short());
                    }
                }
                buf.truncate(n);
                buf
            }
            Framing::UntilClose => {
                while self.read_more(&mut stream, &mut buf, deadline)? {}
                buf
            }
            Framing::Chunked => loop {
                if let Some(body) = dechunk(&buf)? {
                    break body;
                }
                if !self.read_more(&mut stream, &mut buf, deadline)? {
                    return Err(self.cut_short());
                }
            },
        };
        Ok(Response {
            status: head.status,
            body,
        })
    }

    /// Connects with SO_SNDTIMEO set first: a blocking unix connect waits
    /// that long when the listener's backlog is full (a wedged agent),
    /// instead of forever.
    fn connect(&self) -> Result<UnixStream, CniError> {
        let addr = UnixAddr::new(self.socket.as_path()).map_err(|e| {
            CniError::InvalidConfig(format!(
                "socket path {} is not usable: {e}",
                self.socket.display()
            ))
        })?;
        let unreachable = |e: Errno| {
            if e == Errno::EAGAIN {
                CniError::try_again(
                    format!(
                        "enimd at {} did not accept the connection within {:?}",
                        self.socket.display(),
                        self.timeout
                    ),
                    e.desc(),
                )
            } else {
                CniError::try_again(
                    format!("enimd is not reachable at {}", self.socket.display()),
                    format!("connect: {}", io::Error::from(e)),
                )
            }
        };
        let fd = socket::socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(unreachable)?;
        let stream = UnixStream::from(fd);
        stream
            .set_write_timeout(Some(self.timeout))
            .map_err(|e| self.io_error("setting the socket timeout", e))?;
        socket::connect(stream.as_raw_fd(), &addr).map_err(unreachable)?;
        Ok(stream)
    }

    fn remaining(&self, deadline: Instant) -> Result<Duration, CniError> {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| self.timed_out())
    }

    /// Reads what is there into `buf`; false at end of stream.
    fn read_more(
        &self,
        stream: &mut UnixStream,
        buf: &mut Vec<u8>,
        deadline: Instant,
    ) -> Result<bool, CniError> {
        if buf.len() > MAX_RESPONSE {
            return Err(too_large());
        }
        let mut chunk = [0u8; 16 * 1024];
        loop {
            stream
                .set_read_timeout(Some(self.remaining(deadline)?))
                .map_err(|e| self.io_error("setting the socket timeout", e))?;
            match stream.read(&mut chunk) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.io_error("reading the answer", e)),
            }
        }
    }

    fn timed_out(&self) -> CniError {
        CniError::try_again(
            format!(
                "enimd at {} did not answer within {:?}",
                self.socket.display(),
                self.timeout
            ),
            "",
        )
    }

    fn cut_short(&self) -> CniError {
        CniError::try_again(
            format!(
                "enimd at {} closed the connection before a complete answer",
                self.socket.display()
            ),
            "",
        )
    }

    fn io_error(&self, what: &str, e: io::Error) -> CniError {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => self.timed_out(),
            _ => CniError::try_again(
                format!("{what} to/from enimd at {} failed", self.socket.display()),
                e,
            ),
        }
    }
}

fn too_large() -> CniError {
    CniError::decode(
        format!("enimd's answer is larger than {MAX_RESPONSE} bytes"),
        "",
    )
}

/// The status line and headers, once all of them are in `buf`.
fn parse_head(buf: &[u8]) -> Result<Option<Head>, CniError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_RESPONSE => return Err(too_large()),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(CniError::decode("enimd sent a malformed HTTP answer", e)),
    };
    let status = resp.code.unwrap_or(0);
    let mut framing = Framing::UntilClose;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            let v = String::from_utf8_lossy(h.value);
            if v.to_ascii_lowercase().contains("chunked") {
                framing = Framing::Chunked;
            }
        } else if h.name.eq_ignore_ascii_case("content-length") && framing != Framing::Chunked {
            let n = std::str::from_utf8(h.value)
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .ok_or_else(|| {
                    CniError::decode(
                        "enimd sent an invalid Content-Length",
                        String::from_utf8_lossy(h.value),
                    )
                })?;
            framing = Framing::Length(n);
        }
    }
    Ok(Some(Head {
        status,
        len,
        framing,
    }))
}

/// Decodes a chunked body; `None` while it is incomplete.
fn dechunk(mut data: &[u8]) -> Result<Option<Vec<u8>>, CniError> {
    let bad = |why: &str| CniError::decode("enimd sent a malformed chunked body", why);
    let mut body = Vec::new();
    loop {
        let (used, size) = match httparse::parse_chunk_size(data) {
            Ok(httparse::Status::Complete(x)) => x,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(_) => return Err(bad("bad chunk size")),
        };
        data = &data[used..];
        if size == 0 {
            // The last chunk: trailers (which we ignore) end at an empty line.
            if data.starts_with(b"\r\n") || data.windows(4).any(|w| w == b"\r\n\r\n") {
                return Ok(Some(body));
            }
            return Ok(None);
        }
        let size = usize::try_from(size)
            .ok()
            .filter(|s| *s <= MAX_RESPONSE)
            .ok_or_else(too_large)?;
        if data.len() < size + 2 {
            return Ok(None);
        }
        if &data[size..size + 2] != b"\r\n" {
            return Err(bad("chunk not followed by CRLF"));
        }
        body.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

/// Non-2xx answers carry an [`ApiError`] whose code is already a CNI code.
fn check_status(resp: &Response) -> Result<(), CniError> {
    if (200..300).contains(&resp.status) {
        return Ok(());
    }
    if let Ok(e) = serde_json::from_slice::<ApiError>(&resp.body) {
        return Err(CniError::Agent(e));
    }
    let body = String::from_utf8_lossy(&resp.body[..resp.body.len().min(1024)]).into_owned();
    let msg = format!("enimd answered HTTP {} without an error body", resp.status);
    Err(match resp.status {
        // Proxy-ish "not now" statuses are worth a retry.
        502..=504 => CniError::try_again(msg, body),
        _ => CniError::Agent(ApiError::new(code::INTERNAL, msg).with_details(body)),
    })
}

fn decode_ok<R: DeserializeOwned>(resp: Response) -> Result<R, CniError> {
    check_status(&resp)?;
    serde_json::from_slice(&resp.body).map_err(|e| {
        CniError::decode(
            format!("failed to decode enimd's answer (HTTP {})", resp.status),
            e,
        )
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;
    use std::path::Path;
    use std::sync::mpsc;
    use std::thread;

    use super::*;
    use crate::api::Status;

    /// A request as the test server saw it.
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

    fn read_request(s: &mut UnixStream) -> Seen {
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

    /// Serves one connection with `answer` (written in pieces to exercise
    /// partial reads) and reports the request it saw.
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

    const STATUS: &str = r#"{"version":"0.1.0","ready":true,"provider":"static","enis_total":4,"enis_free":3,"attachments":1,"uptime_secs":9}"#;

    #[test]
    fn get_with_content_length() {
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{STATUS}",
            STATUS.len()
        );
        let (_d, path, rx) = serve_once(answer);
        let s: Status = client(&path).get(crate::api::ROUTE_STATUS).unwrap();
        assert_eq!(s.enis_free, 3);
        let seen = rx.recv().unwrap();
        assert_eq!(seen.method, "GET");
        assert_eq!(seen.path, "/v1/status");
        assert_eq!(seen.header("connection"), Some("close"));
        assert_eq!(seen.header("content-length"), Some("0"));
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
        let sent: serde_json::Value = serde_json::from_slice(&seen.body).unwrap();
        assert_eq!(sent, body);
    }

    #[test]
    fn chunked_and_until_close() {
        let (_d, path, _rx) = serve_once(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\na;ext=1\r\n 12345678}\r\n0\r\n\r\n",
        );
        let v: serde_json::Value = client(&path).post("/x", &()).unwrap();
        assert_eq!(v, serde_json::json!({"a": 12345678}));

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
        assert_eq!(
            e,
            CniError::Agent(ApiError::new(3, "no such attachment").with_details("x"))
        );
    }

    #[test]
    fn odd_answers() {
        let (_d, path, _rx) = serve_once(b"HTTP/1.1 500 Oops\r\nContent-Length: 4\r\n\r\nboom");
        let e = client(&path).get::<Status>("/x").unwrap_err();
        assert_eq!(e.code(), code::INTERNAL);
        assert_eq!(e.details(), "boom");

        let (_d, path, _rx) = serve_once(b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n");
        assert_eq!(client(&path).get::<Status>("/x").unwrap_err().code(), 11);

        let (_d, path, _rx) = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nnah");
        assert_eq!(client(&path).get::<Status>("/x").unwrap_err().code(), 6);

        let (_d, path, _rx) = serve_once(b"SMTP ready\r\n\r\n");
        assert_eq!(client(&path).get::<Status>("/x").unwrap_err().code(), 6);

        let (_d, path, _rx) = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n");
        assert_eq!(client(&path).get::<Status>("/x").unwrap_err().code(), 6);

        // Truncated body, truncated head, nothing at all: the agent died
        // mid-answer, which is worth a retry.
        for cut in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"a\""[..],
            b"HTTP/1.1 200 OK\r\nContent-Le",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\"",
            b"",
        ] {
            let (_d, path, _rx) = serve_once(cut);
            let e = client(&path).get::<Status>("/x").unwrap_err();
            assert_eq!(e.code(), 11, "{cut:?}: {e}");
        }
    }

    #[test]
    fn dead_agent_is_try_again_at_once() {
        let dir = tempfile::tempdir().unwrap();
        // Nothing at the path.
        let start = Instant::now();
        let e = client(&dir.path().join("none.sock"))
            .get::<Status>("/x")
            .unwrap_err();
        assert_eq!(e.code(), 11);
        assert!(e.to_string().contains("not reachable"), "{e}");
        // A socket file with no listener behind it: refused.
        let path = dir.path().join("stale.sock");
        drop(UnixListener::bind(&path).unwrap());
        let e = client(&path).get::<Status>("/x").unwrap_err();
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
        let start = Instant::now();
        let e = Client::new(&path, Duration::from_secs(1))
            .get::<Status>("/x")
            .unwrap_err();
        let took = start.elapsed();
        assert_eq!(e.code(), 11);
        assert!(e.to_string().contains("did not answer within 1s"), "{e}");
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(3),
            "{took:?}"
        );
        drop(tx);
        server.join().unwrap();
    }

    #[test]
    fn wedged_agent_connect_times_out() {
        // A listener that never accepts, with the smallest backlog: once it
        // is full a blocking connect would wait forever without SO_SNDTIMEO.
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

        let c = Client::new(&path, Duration::from_millis(300));
        let mut held = Vec::new();
        let start = Instant::now();
        let err = loop {
            match c.connect() {
                Ok(s) => held.push(s),
                Err(e) => break e,
            }
            assert!(held.len() < 64, "backlog never filled");
        };
        assert_eq!(err.code(), 11);
        assert!(err.to_string().contains("did not accept"), "{err}");
        assert!(start.elapsed() < Duration::from_secs(3));
    }

    #[test]
    fn long_socket_path_is_a_config_error() {
        let long = format!("/tmp/{}", "x".repeat(200));
        assert_eq!(
            client(Path::new(&long))
                .get::<Status>("/x")
                .unwrap_err()
                .code(),
            7
        );
    }

    #[test]
    fn dechunk_pieces() {
        assert_eq!(dechunk(b"").unwrap(), None);
        assert_eq!(dechunk(b"3\r\nabc").unwrap(), None);
        assert_eq!(dechunk(b"3\r\nabc\r\n0\r\n").unwrap(), None);
        assert_eq!(
            dechunk(b"3\r\nabc\r\n0\r\n\r\n").unwrap(),
            Some(b"abc".to_vec())
        );
        assert_eq!(
            dechunk(b"3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n").unwrap(),
            Some(b"abc".to_vec())
        );
        assert_eq!(dechunk(b"3\r\nabcd\r\n").unwrap_err().code(), 6);
        assert_eq!(dechunk(b"zz\r\n").unwrap_err().code(), 6);
    }
}
