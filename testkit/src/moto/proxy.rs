//! A fault-injecting proxy in front of moto.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::{text, Fake};

#[derive(Debug, Clone)]
struct Fault {
    action: String,
    remaining: usize,
    status: u16,
    /// Empty: a bare (non-XML) error page.
    code: String,
}

/// A cloud-wide fault: every call answers it while it lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Outage {
    #[default]
    None,
    /// 503 `Unavailable`: the API is down.
    Unavailable,
    /// 503 `RequestLimitExceeded`: the account's calls are throttled.
    Throttled,
}

impl Outage {
    /// The EC2 error code it answers with, if any.
    fn code(self) -> Option<&'static str> {
        match self {
            Outage::None => None,
            Outage::Unavailable => Some("Unavailable"),
            Outage::Throttled => Some("RequestLimitExceeded"),
        }
    }
}

/// Public only as [`Fake`]'s parameter: its fields stay private.
pub struct ProxyState {
    /// While not `None`, every call answers it.
    outage: Mutex<Outage>,
    upstream: String,
    http: reqwest::Client,
    faults: Mutex<Vec<Fault>>,
    /// Each call's action, whether it was faulted, and when it came.
    calls: Mutex<Vec<(String, bool, std::time::Instant)>>,
    /// Actions whose calls wait, unanswered, until released.
    held: tokio::sync::watch::Sender<std::collections::BTreeSet<String>>,
}

/// Forwards to moto byte for byte (the Host header included, so
/// signatures still verify), except for injected faults.
pub type FaultProxy = Fake<ProxyState>;

impl Fake<ProxyState> {
    pub async fn start(upstream: &str) -> FaultProxy {
        Fake::serve(ProxyState::new(upstream), proxy_handler).await
    }

    /// As [`FaultProxy::start`], on `listener` (bound where the caller
    /// chose: the VPC simulator's namespace, for a cluster's operator).
    pub fn start_on(listener: tokio::net::TcpListener, upstream: &str) -> FaultProxy {
        Fake::serve_on(listener, ProxyState::new(upstream), proxy_handler)
    }

    /// The next `times` calls of `action` fail with `status` and `code`
    /// (an EC2 error document; empty `code`: a bare error page).
    pub fn inject(&self, action: &str, times: usize, status: u16, code: &str) {
        self.state.faults.lock().unwrap().push(Fault {
            action: action.into(),
            remaining: times,
            status,
            code: code.into(),
        });
    }

    /// Starts (`true`) or ends an outage of the whole API: meanwhile every
    /// call answers 503 with the EC2 error code `Unavailable`.
    pub fn set_down(&self, down: bool) {
        self.set_outage(if down {
            Outage::Unavailable
        } else {
            Outage::None
        });
    }

    /// Starts, changes or (with [`Outage::None`]) ends a cloud-wide fault.
    pub fn set_outage(&self, outage: Outage) {
        *self.state.outage.lock().unwrap() = outage;
    }

    /// Holds (`true`) or releases calls of `action`: while held, each call
    /// is counted and then waits unanswered, as a cloud that hangs would.
    pub fn hold(&self, action: &str, held: bool) {
        self.state.held.send_modify(|h| {
            if held {
                h.insert(action.into());
            } else {
                h.remove(action);
            }
        });
    }

    /// Calls of `action` so far (faulted ones included).
    pub fn calls(&self, action: &str) -> usize {
        self.state
            .calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(a, _, _)| a == action)
            .count()
    }

    /// The actions of the calls that came after `since`, in order.
    pub fn calls_since(&self, since: std::time::Instant) -> Vec<String> {
        self.state
            .calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, _, at)| *at > since)
            .map(|(a, _, _)| a.clone())
            .collect()
    }

    /// Calls answered with a fault, of any action.
    pub fn faulted_total(&self) -> usize {
        self.state
            .calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, f, _)| *f)
            .count()
    }

    /// Calls of `action` answered with an injected fault.
    pub fn faulted(&self, action: &str) -> usize {
        self.state
            .calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(a, f, _)| a == action && *f)
            .count()
    }
}

impl ProxyState {
    fn new(upstream: &str) -> ProxyState {
        ProxyState {
            outage: Mutex::new(Outage::None),
            upstream: upstream.trim_end_matches('/').into(),
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
            faults: Mutex::new(Vec::new()),
            calls: Mutex::new(Vec::new()),
            held: tokio::sync::watch::Sender::new(Default::default()),
        }
    }
}

async fn proxy_handler(State(st): State<Arc<ProxyState>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    let action = form_urlencoded::parse(&body)
        .find(|(k, _)| k == "Action")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    let outage = st.outage.lock().unwrap().code().map(|code| Fault {
        action: action.clone(),
        remaining: 0,
        status: 503,
        code: code.into(),
    });
    let fault = outage.or_else(|| {
        let mut faults = st.faults.lock().unwrap();
        let f = faults
            .iter_mut()
            .find(|f| f.action == action && f.remaining > 0)
            .map(|f| {
                f.remaining -= 1;
                f.clone()
            });
        faults.retain(|f| f.remaining > 0);
        f
    });
    st.calls
        .lock()
        .unwrap()
        .push((action.clone(), fault.is_some(), std::time::Instant::now()));
    let mut held = st.held.subscribe();
    // Err only if the sender is gone, which the state outlives.
    let _ = held.wait_for(|h| !h.contains(&action)).await;
    if let Some(f) = fault {
        let status = StatusCode::from_u16(f.status).unwrap();
        if f.code.is_empty() {
            return text(status, "<html><body>Service Unavailable</body></html>");
        }
        let xml = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{}</Code>\
             <Message>injected by the test proxy</Message></Error></Errors><RequestID>fault</RequestID></Response>",
            f.code
        );
        return (status, [("content-type", "text/xml")], xml).into_response();
    }
    let url = format!(
        "{}{}",
        st.upstream,
        parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/")
    );
    let mut up = st.http.request(parts.method.clone(), url);
    for (k, v) in parts.headers.iter() {
        if k == "content-length" || k == "connection" || k == "transfer-encoding" {
            continue;
        }
        up = up.header(k, v);
    }
    let resp = match up.body(body).send().await {
        Ok(r) => r,
        Err(e) => return text(StatusCode::BAD_GATEWAY, e.to_string()),
    };
    let status = StatusCode::from_u16(resp.status().as_u16()).unwrap();
    let ctype = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("text/xml")
        .to_string();
    let bytes = resp.bytes().await.unwrap_or_default();
    Response::builder()
        .status(status)
        .header("content-type", ctype)
        .body(Body::from(bytes))
        .unwrap()
}
