//! The one client of the agent's API, shared by the `enim` plugin,
//! `enimctl` and the bench. A synchronous surface over hyper's HTTP/1.1
//! client connection on the unix socket: one request per connection
//! (`Connection: close`), driven by a current-thread tokio runtime the
//! client starts on its first call. Every step (connect, send, read the
//! body) is bounded by one deadline, so a dead or hung agent costs at most
//! the configured timeout, and the answer by [`MAX_RESPONSE`] bytes.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use futures::future::{self, Either};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::client::conn::http1;
use hyper::header::{ACCEPT, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, HOST, USER_AGENT};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::net::UnixStream;
use tokio::time::Instant;

use super::ApiError;

/// Bounds what a broken agent can make us buffer.
pub const MAX_RESPONSE: usize = 8 * 1024 * 1024;

/// What can go wrong talking to the agent.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket path cannot be a unix socket address (too long, NUL).
    #[error("socket path {} is not usable: {reason}", socket.display())]
    BadSocket { socket: PathBuf, reason: String },
    /// Nothing listens at the socket: missing file, connection refused.
    #[error("enimd is not reachable at {}", socket.display())]
    Unreachable {
        socket: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The listener's backlog stayed full (a wedged agent).
    #[error(
        "enimd at {} did not accept the connection within {timeout:?}",
        socket.display()
    )]
    NotAccepting { socket: PathBuf, timeout: Duration },
    /// No complete answer within the timeout.
    #[error("enimd at {} did not answer within {timeout:?}", socket.display())]
    TimedOut { socket: PathBuf, timeout: Duration },
    /// The agent went away mid-exchange (it died or restarted).
    #[error(
        "enimd at {} closed the connection before a complete answer",
        socket.display()
    )]
    CutShort { socket: PathBuf, details: String },
    /// Any other I/O failure of the exchange (reset, broken pipe...).
    #[error("{what} to/from enimd at {} failed", socket.display())]
    Io {
        socket: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// The client's own I/O runtime could not start (out of descriptors).
    #[error("could not start the client's I/O runtime")]
    Runtime(#[source] io::Error),
    /// The agent refused with its error body; its code is a CNI code.
    #[error("{error}")]
    Api { status: u16, error: ApiError },
    /// A non-2xx answer without an [`ApiError`] body.
    #[error("enimd answered HTTP {status} without an error body")]
    Status { status: u16, body: String },
    /// Not HTTP, or a 2xx body that is not the JSON we expect.
    #[error("{msg}")]
    Malformed { msg: String, details: String },
    /// The answer is larger than [`MAX_RESPONSE`].
    #[error("enimd's answer is larger than {MAX_RESPONSE} bytes")]
    TooLarge,
    /// The request body could not be serialised.
    #[error("failed to encode the request: {0}")]
    Encode(#[source] serde_json::Error),
}

impl ClientError {
    /// True when the agent is down, hung or went away: worth a retry.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Unreachable { .. }
            | ClientError::NotAccepting { .. }
            | ClientError::TimedOut { .. }
            | ClientError::CutShort { .. }
            | ClientError::Io { .. }
            | ClientError::Runtime(_) => true,
            // Proxy-ish "not now" statuses.
            ClientError::Status { status, .. } => (502..=504).contains(status),
            _ => false,
        }
    }
}

pub struct Client {
    socket: PathBuf,
    timeout: Duration,
    /// Started on the first call, so building a client costs nothing.
    runtime: OnceLock<tokio::runtime::Runtime>,
}

/// A response's status and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Client {
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> Self {
        Client {
            socket: socket.into(),
            timeout,
            runtime: OnceLock::new(),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn post<B: Serialize, R: DeserializeOwned>(
        &self,
        route: &str,
        body: &B,
    ) -> Result<R, ClientError> {
        let body = serde_json::to_vec(body).map_err(ClientError::Encode)?;
        decode_ok(self.round_trip(Method::POST, route, body)?)
    }

    /// POST whose answer carries nothing we need (DEL's `{}`).
    pub fn post_ignore<B: Serialize>(&self, route: &str, body: &B) -> Result<(), ClientError> {
        let body = serde_json::to_vec(body).map_err(ClientError::Encode)?;
        check_status(&self.round_trip(Method::POST, route, body)?)
    }

    pub fn get<R: DeserializeOwned>(&self, route: &str) -> Result<R, ClientError> {
        decode_ok(self.round_trip(Method::GET, route, Vec::new())?)
    }

    /// Sends one request and reads its whole answer, within the timeout.
    pub fn round_trip(
        &self,
        method: Method,
        route: &str,
        body: Vec<u8>,
    ) -> Result<Response, ClientError> {
        // Checked here, not by connect, to tell a bad config from a dead agent.
        std::os::unix::net::SocketAddr::from_pathname(&self.socket).map_err(|e| {
            ClientError::BadSocket {
                socket: self.socket.clone(),
                reason: e.to_string(),
            }
        })?;
        let req = self.request(method, route, body)?;
        self.block_on(async {
            let deadline = Instant::now() + self.timeout;
            match tokio::time::timeout_at(deadline, self.exchange(req, deadline)).await {
                Ok(r) => r,
                Err(_) => Err(self.timed_out()),
            }
        })
    }

    fn block_on<T>(
        &self,
        fut: impl Future<Output = Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        if self.runtime.get().is_none() {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .enable_time()
                .build()
                .map_err(ClientError::Runtime)?;
            // Another thread may have won the race; either runtime will do.
            let _ = self.runtime.set(rt);
        }
        let rt = self.runtime.get().expect("set above");
        rt.block_on(fut)
    }

    fn request(
        &self,
        method: Method,
        route: &str,
        body: Vec<u8>,
    ) -> Result<Request<Full<Bytes>>, ClientError> {
        let mut req = Request::builder()
            .method(method)
            .uri(route)
            .header(HOST, "localhost")
            .header(USER_AGENT, concat!("enim-cni/", env!("CARGO_PKG_VERSION")))
            .header(ACCEPT, "application/json")
            // One request per connection: nothing to pool in a short-lived
            // process, and the agent sees the end of each exchange.
            .header(CONNECTION, "close")
            // Sent even when 0: hyper leaves it out of a bodiless GET.
            .header(CONTENT_LENGTH, body.len());
        if !body.is_empty() {
            req = req.header(CONTENT_TYPE, "application/json");
        }
        req.body(Full::new(Bytes::from(body)))
            .map_err(|e| ClientError::Malformed {
                msg: format!("invalid request for route {route:?}"),
                details: e.to_string(),
            })
    }

    async fn exchange(
        &self,
        req: Request<Full<Bytes>>,
        deadline: Instant,
    ) -> Result<Response, ClientError> {
        let stream = self.connect(deadline).await?;
        let (mut sender, conn) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| self.hyper_error(e))?;
        let talk = async move {
            let resp = sender
                .send_request(req)
                .await
                .map_err(|e| self.hyper_error(e))?;
            let status = resp.status().as_u16();
            // A declared length over the limit fails before reading a byte.
            let declared = resp
                .headers()
                .get(CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok());
            if declared.is_some_and(|n| n > MAX_RESPONSE as u64) {
                return Err(ClientError::TooLarge);
            }
            let body = Limited::new(resp.into_body(), MAX_RESPONSE)
                .collect()
                .await
                .map_err(|e| self.body_error(e))?
                .to_bytes()
                .to_vec();
            Ok(Response { status, body })
        };
        // The connection is driven here rather than spawned, so nothing of
        // this exchange outlives the call on the client's runtime.
        match future::select(std::pin::pin!(talk), Box::pin(conn)).await {
            Either::Left((r, _conn)) => r,
            // Done: `talk` has all it needs to finish.
            Either::Right((Ok(()), talk)) => talk.await,
            // hyper hands a failure to the waiting request or body; if it
            // did not, the connection's own error says what happened.
            Either::Right((Err(e), talk)) => match talk.await {
                Ok(r) => Ok(r),
                Err(ClientError::TooLarge) => Err(ClientError::TooLarge),
                Err(_) => Err(self.hyper_error(e)),
            },
        }
    }

    /// Connects, retrying while the listener's backlog is full (EAGAIN on
    /// a non-blocking unix connect) until the deadline.
    async fn connect(&self, deadline: Instant) -> Result<UnixStream, ClientError> {
        let mut backoff = Duration::from_millis(2);
        loop {
            match UnixStream::connect(&self.socket).await {
                Ok(s) => return Ok(s),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() + backoff >= deadline {
                        return Err(ClientError::NotAccepting {
                            socket: self.socket.clone(),
                            timeout: self.timeout,
                        });
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(50));
                }
                Err(e) => {
                    return Err(ClientError::Unreachable {
                        socket: self.socket.clone(),
                        source: e,
                    })
                }
            }
        }
    }

    fn timed_out(&self) -> ClientError {
        ClientError::TimedOut {
            socket: self.socket.clone(),
            timeout: self.timeout,
        }
    }

    fn cut_short(&self, details: impl ToString) -> ClientError {
        ClientError::CutShort {
            socket: self.socket.clone(),
            details: details.to_string(),
        }
    }

    fn hyper_error(&self, e: hyper::Error) -> ClientError {
        if e.is_incomplete_message() {
            return self.cut_short(&e);
        }
        if e.is_parse_too_large() {
            return ClientError::TooLarge;
        }
        if e.is_parse() || e.is_parse_status() {
            return ClientError::Malformed {
                msg: "enimd sent a malformed HTTP answer".into(),
                details: e.to_string(),
            };
        }
        match io_cause(&e) {
            Some(io) => self.io_error(io),
            None => self.cut_short(&e),
        }
    }

    /// The body's errors: the size limit, or the connection's.
    fn body_error(&self, e: Box<dyn std::error::Error + Send + Sync>) -> ClientError {
        if e.is::<http_body_util::LengthLimitError>() {
            return ClientError::TooLarge;
        }
        match e.downcast::<hyper::Error>() {
            Ok(e) => self.hyper_error(*e),
            Err(e) => self.cut_short(e),
        }
    }

    fn io_error(&self, e: &io::Error) -> ClientError {
        match e.kind() {
            // The agent died mid-answer.
            io::ErrorKind::UnexpectedEof => self.cut_short(e),
            // hyper's word for bad framing (chunk sizes, CRLFs).
            io::ErrorKind::InvalidData | io::ErrorKind::InvalidInput => ClientError::Malformed {
                msg: "enimd sent a malformed HTTP answer".into(),
                details: e.to_string(),
            },
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => self.timed_out(),
            _ => ClientError::Io {
                socket: self.socket.clone(),
                what: "exchanging a request",
                source: io::Error::new(e.kind(), e.to_string()),
            },
        }
    }
}

/// The I/O error under a hyper error, if any.
fn io_cause(e: &hyper::Error) -> Option<&io::Error> {
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<io::Error>() {
            return Some(io);
        }
        cause = c.source();
    }
    None
}

/// Non-2xx answers carry an [`ApiError`] whose code is already a CNI code.
fn check_status(resp: &Response) -> Result<(), ClientError> {
    if (200..300).contains(&resp.status) {
        return Ok(());
    }
    if let Ok(error) = serde_json::from_slice::<ApiError>(&resp.body) {
        return Err(ClientError::Api {
            status: resp.status,
            error,
        });
    }
    Err(ClientError::Status {
        status: resp.status,
        body: String::from_utf8_lossy(&resp.body[..resp.body.len().min(1024)]).into_owned(),
    })
}

fn decode_ok<R: DeserializeOwned>(resp: Response) -> Result<R, ClientError> {
    check_status(&resp)?;
    serde_json::from_slice(&resp.body).map_err(|e| ClientError::Malformed {
        msg: format!("failed to decode enimd's answer (HTTP {})", resp.status),
        details: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::{UnixListener, UnixStream as StdStream};
    use std::sync::mpsc;
    use std::thread;
    use std::time::Instant as StdInstant;

    use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, UnixAddr};

    use super::*;
    use crate::api::{code, Status, ROUTE_STATUS};
    use crate::cni::CniError;

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
        assert_eq!(CniError::from(e), CniError::Agent(want));
    }

    #[test]
    fn odd_answers() {
        let (_d, path, _rx) = serve_once(b"HTTP/1.1 500 Oops\r\nContent-Length: 4\r\n\r\nboom");
        let e = client(&path).get::<Status>("/x").unwrap_err();
        assert!(matches!(&e, ClientError::Status { status: 500, body } if body == "boom"));
        let e = CniError::from(e);
        assert_eq!(e.code(), code::INTERNAL);
        assert_eq!(e.details(), "boom");

        let (_d, path, _rx) = serve_once(b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n");
        let e = client(&path).get::<Status>("/x").unwrap_err();
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
            let (_d, path, _rx) = serve_once(bad);
            let e = client(&path).get::<Status>("/x").unwrap_err();
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
            let (_d, path, _rx) = serve_once(cut);
            let e = client(&path).get::<Status>("/x").unwrap_err();
            assert!(matches!(e, ClientError::CutShort { .. }), "{cut:?}: {e:?}");
            assert!(e.to_string().contains("closed the connection"), "{e}");
            assert_eq!(cni_code(e), 11, "{cut:?}");
        }
    }

    #[test]
    fn oversized_answers_are_refused() {
        // A declared length over the limit fails before any of it is read.
        let (_d, path, _rx) = serve_once(format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{{",
            MAX_RESPONSE + 1
        ));
        let e = client(&path).get::<Status>("/x").unwrap_err();
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
            let (_d, path, _rx) = serve_once(answer);
            let e = client(&path).get::<Status>("/x").unwrap_err();
            assert!(matches!(e, ClientError::TooLarge), "{e:?}");
        }

        // A head that never ends is bounded too.
        let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
        while head.len() <= MAX_RESPONSE {
            head.extend_from_slice(b"X-Pad: 0123456789012345678901234567890123456789\r\n");
        }
        let (_d, path, _rx) = serve_once(head);
        let e = client(&path).get::<Status>("/x").unwrap_err();
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
        let start = StdInstant::now();
        let e = Client::new(&path, Duration::from_secs(1))
            .get::<Status>("/x")
            .unwrap_err();
        let took = start.elapsed();
        assert!(matches!(e, ClientError::TimedOut { .. }), "{e:?}");
        assert!(e.to_string().contains("did not answer within 1s"), "{e}");
        assert_eq!(cni_code(e), 11);
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(3),
            "{took:?}"
        );
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
        let start = StdInstant::now();
        let e = Client::new(&path, Duration::from_millis(500))
            .get::<Status>("/x")
            .unwrap_err();
        assert!(matches!(e, ClientError::TimedOut { .. }), "{e:?}");
        assert!(start.elapsed() < Duration::from_secs(2));
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

        let start = StdInstant::now();
        let e = Client::new(&path, Duration::from_millis(300))
            .get::<Status>("/x")
            .unwrap_err();
        let took = start.elapsed();
        assert!(matches!(e, ClientError::NotAccepting { .. }), "{e:?}");
        assert!(e.to_string().contains("did not accept"), "{e}");
        assert_eq!(cni_code(e), 11);
        assert!(
            took >= Duration::from_millis(200) && took < Duration::from_secs(2),
            "{took:?}"
        );
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
}
