//! The AWS Query protocol: form-encoded POSTs signed with SigV4, XML
//! replies, retried per [`RetryPolicy`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use enim_core::pacing::Pacing;
use enim_core::ratelimit::{RateLimit, TokenBucket};
pub use enim_core::retry::RetryPolicy;

use super::error::{classify, Ec2Error};
use crate::credentials::CredentialsProvider;

const CONTENT_TYPE: &str = "application/x-www-form-urlencoded; charset=utf-8";

/// This agent's token buckets, one per API class: mutating actions and
/// describe (read-only) actions, as EC2 throttles them apart. Every call
/// through a client, every retry included, takes a token of its class
/// first, so one node cannot spend the account's buckets.
#[derive(Debug)]
pub struct ActionLimits {
    mutating: TokenBucket,
    describe: TokenBucket,
}

impl ActionLimits {
    pub fn new(mutating: RateLimit, describe: RateLimit) -> Self {
        ActionLimits {
            mutating: TokenBucket::new(mutating),
            describe: TokenBucket::new(describe),
        }
    }

    /// The class of `action`: EC2's read-only actions are named
    /// Describe*, Get* and List*; everything else changes something.
    pub fn is_describe(action: &str) -> bool {
        ["Describe", "Get", "List"]
            .iter()
            .any(|p| action.starts_with(p))
    }

    fn bucket(&self, action: &str) -> &TokenBucket {
        if Self::is_describe(action) {
            &self.describe
        } else {
            &self.mutating
        }
    }
}

/// Where an AWS endpoint is, by region (`*.amazonaws.com.cn` in China).
pub fn default_endpoint(service: &str, region: &str) -> String {
    let suffix = if region.starts_with("cn-") {
        "amazonaws.com.cn"
    } else {
        "amazonaws.com"
    };
    format!("https://{service}.{region}.{suffix}/")
}

/// A Query-protocol client for one service (EC2, or IAM in tests).
pub struct QueryClient {
    http: reqwest::Client,
    endpoint: String,
    region: String,
    service: String,
    version: String,
    creds: Arc<CredentialsProvider>,
    retry: RetryPolicy,
    /// Client-side rate limits; `None`: unlimited (the test rig's admin).
    limits: Option<Arc<ActionLimits>>,
    /// Pacing by throttle replies, per action; `None`: none.
    pacing: Option<Arc<Pacing>>,
}

impl QueryClient {
    pub fn new(
        endpoint: &str,
        region: &str,
        service: &str,
        version: &str,
        creds: Arc<CredentialsProvider>,
        retry: RetryPolicy,
    ) -> Result<QueryClient, Ec2Error> {
        let mut endpoint = endpoint.to_string();
        if !endpoint.ends_with('/') {
            endpoint.push('/');
        }
        let request_err = |detail: String| Ec2Error::Request {
            action: "(client setup)".into(),
            detail,
        };
        let uri = endpoint
            .parse::<http::Uri>()
            .map_err(|e| request_err(format!("endpoint {endpoint:?}: {e}")))?;
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30));
        // HTTPS_PROXY may be how a node reaches EC2, but a proxy can never
        // reach this host's loopback (local endpoints, tests).
        if uri.host().is_some_and(is_loopback) {
            builder = builder.no_proxy();
        }
        let http = builder
            .build()
            .map_err(|e| request_err(format!("building the HTTP client: {e}")))?;
        Ok(QueryClient {
            http,
            endpoint,
            region: region.into(),
            service: service.into(),
            version: version.into(),
            creds,
            retry,
            limits: None,
            pacing: None,
        })
    }

    /// Every request waits for a token of its class in `limits` (shared
    /// with other clients holding the same `Arc`).
    pub fn with_limits(mut self, limits: Arc<ActionLimits>) -> Self {
        self.limits = Some(limits);
        self
    }

    /// Every request waits for its action's slot in `pacing`, which every
    /// throttled and successful reply adjusts.
    pub fn with_pacing(mut self, pacing: Arc<Pacing>) -> Self {
        self.pacing = Some(pacing);
        self
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Calls `action` with `params` and returns the XML reply, retrying
    /// throttling and server errors per the retry policy.
    pub async fn call(
        &self,
        action: &str,
        params: &[(String, String)],
    ) -> Result<String, Ec2Error> {
        let mut body = format!(
            "Action={}&Version={}",
            form_encode(action),
            form_encode(&self.version)
        );
        for (k, v) in params {
            body.push('&');
            body.push_str(&form_encode(k));
            body.push('=');
            body.push_str(&form_encode(v));
        }
        let (body, refreshed) = (&body, &AtomicBool::new(false));
        self.retry
            .run(Ec2Error::retryable, |attempt| async move {
                let mut sent = self.send_once(action, body).await;
                if let Err(e) = &sent {
                    // Rotated role credentials: fetch the new set, once per
                    // call, and try again at once (not counted as a retry).
                    if e.expired_credentials() && !refreshed.swap(true, Ordering::Relaxed) {
                        tracing::info!(action, error = %e, "EC2 credentials expired; refreshing");
                        self.creds.invalidate().await;
                        sent = self.send_once(action, body).await;
                    }
                }
                sent.map_err(|mut e| {
                    e.set_attempts(attempt);
                    e
                })
            })
            .await
    }

    async fn send_once(&self, action: &str, body: &str) -> Result<String, Ec2Error> {
        let Some(pacing) = &self.pacing else {
            return self.send_unpaced(action, body).await;
        };
        let waited = pacing.wait(action).await;
        if !waited.is_zero() {
            tracing::debug!(action, ?waited, "paced after throttle replies");
        }
        let sent = self.send_unpaced(action, body).await;
        match &sent {
            Ok(_) => pacing.answered(action),
            Err(Ec2Error::Throttled { .. }) => pacing.throttled(action),
            Err(_) => {}
        }
        sent
    }

    async fn send_unpaced(&self, action: &str, body: &str) -> Result<String, Ec2Error> {
        // Every request goes out with a token, retries too: a retry spends
        // the account's bucket like any call. The wait is a timer, never a
        // blocked thread.
        if let Some(limits) = &self.limits {
            let waited = limits.bucket(action).acquire().await;
            if !waited.is_zero() {
                tracing::debug!(action, ?waited, "waited for a client-side API token");
            }
        }
        let request_err = |detail: String| Ec2Error::Request {
            action: action.into(),
            detail,
        };
        let creds = self
            .creds
            .get()
            .await
            .map_err(|source| Ec2Error::Credentials {
                action: action.into(),
                source,
            })?;
        let identity: Identity = creds.into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name(&self.service)
            .time(SystemTime::now())
            .settings(SigningSettings::default())
            .build()
            .map_err(|e| request_err(format!("signing parameters: {e}")))?
            .into();
        let headers = [("content-type", CONTENT_TYPE)];
        let signable = SignableRequest::new(
            "POST",
            self.endpoint.as_str(),
            headers.iter().copied(),
            SignableBody::Bytes(body.as_bytes()),
        )
        .map_err(|e| request_err(format!("signing: {e}")))?;
        let (instructions, _signature) = sign(signable, &params)
            .map_err(|e| request_err(format!("signing: {e}")))?
            .into_parts();
        let mut request = http::Request::builder()
            .method("POST")
            .uri(&self.endpoint)
            .header("content-type", CONTENT_TYPE)
            .body(body.to_string())
            .map_err(|e| request_err(format!("building the request: {e}")))?;
        instructions.apply_to_request_http1x(&mut request);
        let request = reqwest::Request::try_from(request)
            .map_err(|e| request_err(format!("building the request: {e}")))?;

        let resp = match self.http.execute(request).await {
            Ok(r) => r,
            // Connection refused/reset, timeouts: the endpoint may be back
            // in a moment.
            Err(e) => {
                return Err(Ec2Error::Unavailable {
                    action: action.into(),
                    detail: format!("{}: {}", self.endpoint, enim_core::with_causes(&e)),
                    attempts: 1,
                })
            }
        };
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| Ec2Error::Unavailable {
            action: action.into(),
            detail: format!("reading the reply: {}", enim_core::with_causes(&e)),
            attempts: 1,
        })?;
        if (200..300).contains(&status) {
            return Ok(text);
        }
        Err(classify(action, status, &text))
    }
}

fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Form encoding with only the RFC 3986 unreserved characters left as
/// they are (and space as `+`): the strictest common reading, so a server
/// that re-encodes the parsed form before checking the signature (moto
/// does) arrives at the same bytes.
fn form_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_are_classed() {
        for a in [
            "DescribeNetworkInterfaces",
            "DescribeInstanceTypes",
            "GetConsoleOutput",
            "ListUsers",
        ] {
            assert!(ActionLimits::is_describe(a), "{a}");
        }
        for a in [
            "CreateNetworkInterface",
            "AttachNetworkInterface",
            "ModifyNetworkInterfaceAttribute",
            "DetachNetworkInterface",
            "DeleteNetworkInterface",
        ] {
            assert!(!ActionLimits::is_describe(a), "{a}");
        }
    }

    #[test]
    fn endpoints_by_region() {
        assert_eq!(
            default_endpoint("ec2", "eu-west-1"),
            "https://ec2.eu-west-1.amazonaws.com/"
        );
        assert_eq!(
            default_endpoint("ec2", "cn-north-1"),
            "https://ec2.cn-north-1.amazonaws.com.cn/"
        );
    }

    #[test]
    fn loopback_hosts() {
        for h in ["127.0.0.1", "localhost", "[::1]", "127.1.2.3"] {
            assert!(is_loopback(h), "{h}");
        }
        for h in ["ec2.us-east-1.amazonaws.com", "10.0.0.1", "[2600::1]"] {
            assert!(!is_loopback(h), "{h}");
        }
    }

    #[test]
    fn form_encoding_keeps_only_unreserved() {
        assert_eq!(form_encode("aZ09-_.~"), "aZ09-_.~");
        assert_eq!(form_encode("a b*c:d/e"), "a+b%2Ac%3Ad%2Fe");
        assert_eq!(form_encode("{\"x\":[1]}"), "%7B%22x%22%3A%5B1%5D%7D");
        assert_eq!(form_encode("é"), "%C3%A9");
    }
}
