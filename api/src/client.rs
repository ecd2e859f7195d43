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

use crate::{ApiError, DeviceList, ROUTE_DEVICES};

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

    /// The device plugin's list (`GET /v1/devices`).
    pub fn devices(&self) -> Result<DeviceList, ClientError> {
        self.get(ROUTE_DEVICES)
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
