//! A small client of the AWS Query protocol (EC2 API version 2016-11-15):
//! form-encoded POSTs signed with SigV4, XML replies.
//!
//! Throttling and server-side failures are retried with jittered exponential
//! backoff, within a bound; everything else is returned at once as a typed
//! [`Ec2Error`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use enim_provider::retry::{retry, Backoff};
use enim_provider::ProviderError;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::credentials::{CredentialsError, CredentialsProvider};

pub const EC2_API_VERSION: &str = "2016-11-15";
const CONTENT_TYPE: &str = "application/x-www-form-urlencoded; charset=utf-8";
/// DescribeNetworkInterfaces page size (the API allows 5 to 1000).
const PAGE_SIZE: &str = "1000";
/// A runaway NextToken chain is a bug on one side; stop rather than spin.
const MAX_PAGES: usize = 1000;

/// Error codes AWS uses for request-rate throttling.
const THROTTLING_CODES: &[&str] = &[
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottled",
    "RequestThrottledException",
    "TooManyRequestsException",
    "SlowDown",
];

/// Error codes of a server-side failure worth retrying.
const SERVER_CODES: &[&str] = &[
    "InternalError",
    "InternalFailure",
    "ServiceUnavailable",
    "Unavailable",
];

/// Credential problems, each with the likely cause.
fn auth_hint(code: &str) -> Option<&'static str> {
    Some(match code {
        "AuthFailure" => {
            "AWS could not validate the credentials: check the access key id and \
             secret access key (or the instance role)"
        }
        "SignatureDoesNotMatch" => {
            "the request signature does not match: the secret access key is wrong"
        }
        "InvalidClientTokenId" | "UnrecognizedClientException" | "InvalidAccessKeyId" => {
            "the access key id is not known to AWS"
        }
        "IncompleteSignature"
        | "MissingAuthenticationToken"
        | "MissingAuthenticationTokenException" => "the request was not signed correctly",
        "ExpiredToken" | "ExpiredTokenException" | "RequestExpired" | "RequestTimeTooSkewed" => {
            "the credentials or the request timestamp expired: check the session \
             token and the node's clock"
        }
        _ => return None,
    })
}

#[derive(Debug, thiserror::Error)]
pub enum Ec2Error {
    #[error("EC2 {action}: throttled ({code}) after {attempts} attempts: {message}")]
    Throttled {
        action: String,
        code: String,
        message: String,
        attempts: u32,
    },
    #[error("EC2 {action}: unavailable after {attempts} attempts: {detail}")]
    Unavailable {
        action: String,
        detail: String,
        attempts: u32,
    },
    #[error(
        "EC2 {action}: AttachmentLimitExceeded: the instance has no free interface slot: {message}"
    )]
    AttachmentLimitExceeded { action: String, message: String },
    #[error("EC2 {action}: authentication failed ({code}): {hint}: {message}")]
    Auth {
        action: String,
        code: String,
        hint: &'static str,
        message: String,
    },
    #[error(
        "EC2 {action}: not authorized ({code}): the IAM policy must allow ec2:{action}: {message}"
    )]
    Unauthorized {
        action: String,
        code: String,
        message: String,
    },
    #[error("EC2 {action}: {code} (HTTP {status}): {message}")]
    Api {
        action: String,
        status: u16,
        code: String,
        message: String,
    },
    #[error("EC2 {action}: {source}")]
    Credentials {
        action: String,
        #[source]
        source: CredentialsError,
    },
    #[error("EC2 {action}: unreadable response: {detail}")]
    Decode { action: String, detail: String },
    #[error("EC2 {action}: {detail}")]
    Request { action: String, detail: String },
}

impl Ec2Error {
    /// The AWS error code, where AWS sent one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Ec2Error::Throttled { code, .. }
            | Ec2Error::Auth { code, .. }
            | Ec2Error::Unauthorized { code, .. }
            | Ec2Error::Api { code, .. } => Some(code),
            Ec2Error::AttachmentLimitExceeded { .. } => Some("AttachmentLimitExceeded"),
            _ => None,
        }
    }

    /// A `*.NotFound` code: the resource is gone.
    pub fn is_not_found(&self) -> bool {
        self.code().is_some_and(|c| c.ends_with(".NotFound"))
    }

    fn retryable(&self) -> bool {
        matches!(
            self,
            Ec2Error::Throttled { .. } | Ec2Error::Unavailable { .. }
        )
    }

    fn expired_credentials(&self) -> bool {
        matches!(self, Ec2Error::Auth { code, .. } if code.starts_with("ExpiredToken"))
    }

    fn set_attempts(&mut self, n: u32) {
        if let Ec2Error::Throttled { attempts, .. } | Ec2Error::Unavailable { attempts, .. } = self
        {
            *attempts = n;
        }
    }
}

impl Ec2Error {
    /// Which [`ProviderError`] this becomes, so callers that add context
    /// keep the kind (and so `is_transient`).
    pub fn provider_kind(&self) -> fn(String) -> ProviderError {
        match self {
            Ec2Error::Throttled { .. } => ProviderError::Throttled,
            // The slot may free up (another interface detaches): worth a
            // later retry, which the pool does with backoff.
            Ec2Error::Unavailable { .. }
            | Ec2Error::AttachmentLimitExceeded { .. }
            | Ec2Error::Decode { .. }
            | Ec2Error::Request { .. } => ProviderError::Unavailable,
            Ec2Error::Credentials { source, .. } => match source {
                CredentialsError::Imds(_) => ProviderError::Unavailable,
                _ => ProviderError::Config,
            },
            Ec2Error::Api { status, .. } if *status >= 500 => ProviderError::Unavailable,
            // Bad credentials, missing permissions, invalid parameters:
            // retrying does not help until someone fixes the setup.
            Ec2Error::Auth { .. } | Ec2Error::Unauthorized { .. } | Ec2Error::Api { .. } => {
                ProviderError::Config
            }
        }
    }
}

impl From<Ec2Error> for ProviderError {
    fn from(e: Ec2Error) -> Self {
        (e.provider_kind())(e.to_string())
    }
}

/// Bounded retries with jittered exponential backoff (see
/// [`enim_provider::retry`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub attempts: u32,
    pub initial: Duration,
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            initial: Duration::from_millis(200),
            max: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// `initial` doubling to `max`, each wait drawn from the upper half of
    /// its step ("equal jitter"), so many nodes throttled together do not
    /// retry in lockstep.
    pub fn backoff(&self) -> Backoff {
        Backoff::new(self.initial, self.max)
    }

    /// The wait after failed attempt `n` (1-based).
    pub fn delay(&self, n: u32) -> Duration {
        self.backoff().delay(n.saturating_sub(1))
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
        })
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
        retry(
            &self.retry.backoff(),
            self.retry.attempts,
            Ec2Error::retryable,
            |attempt| async move {
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
            },
        )
        .await
    }

    async fn send_once(&self, action: &str, body: &str) -> Result<String, Ec2Error> {
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
                    detail: format!("{}: {}", self.endpoint, error_chain(&e)),
                    attempts: 1,
                })
            }
        };
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| Ec2Error::Unavailable {
            action: action.into(),
            detail: format!("reading the reply: {}", error_chain(&e)),
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

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[derive(Deserialize)]
struct XmlErrorResponse {
    // EC2: <Response><Errors><Error>…; IAM and others: <ErrorResponse><Error>…
    #[serde(rename = "Errors", default)]
    errors: Option<XmlErrors>,
    #[serde(rename = "Error", default)]
    error: Option<XmlError>,
}

#[derive(Deserialize)]
struct XmlErrors {
    #[serde(rename = "Error", default)]
    error: Vec<XmlError>,
}

#[derive(Deserialize)]
struct XmlError {
    #[serde(rename = "Code")]
    code: String,
    #[serde(rename = "Message", default)]
    message: String,
}

/// Turns an error reply into a typed error.
pub fn classify(action: &str, status: u16, body: &str) -> Ec2Error {
    let parsed = quick_xml::de::from_str::<XmlErrorResponse>(body)
        .ok()
        .and_then(|r| {
            r.errors
                .and_then(|e| e.error.into_iter().next())
                .or(r.error)
        });
    let action = action.to_string();
    let Some(XmlError { code, message }) = parsed else {
        let snippet: String = body.chars().take(200).collect();
        let detail = format!("HTTP {status}: {snippet}");
        return match status {
            429 => Ec2Error::Throttled {
                action,
                code: "HTTP 429".into(),
                message: snippet,
                attempts: 1,
            },
            s if s >= 500 => Ec2Error::Unavailable {
                action,
                detail,
                attempts: 1,
            },
            _ => Ec2Error::Api {
                action,
                status,
                code: format!("HTTP {status}"),
                message: snippet,
            },
        };
    };
    if THROTTLING_CODES.contains(&code.as_str()) {
        return Ec2Error::Throttled {
            action,
            code,
            message,
            attempts: 1,
        };
    }
    if code == "AttachmentLimitExceeded" {
        return Ec2Error::AttachmentLimitExceeded { action, message };
    }
    if let Some(hint) = auth_hint(&code) {
        return Ec2Error::Auth {
            action,
            code,
            hint,
            message,
        };
    }
    if code == "UnauthorizedOperation" || code == "AccessDenied" || code == "AccessDeniedException"
    {
        return Ec2Error::Unauthorized {
            action,
            code,
            message,
        };
    }
    if status >= 500 || SERVER_CODES.contains(&code.as_str()) {
        return Ec2Error::Unavailable {
            action,
            detail: format!("{code} (HTTP {status}): {message}"),
            attempts: 1,
        };
    }
    Ec2Error::Api {
        action,
        status,
        code,
        message,
    }
}

fn decode<T: DeserializeOwned>(action: &str, xml: &str) -> Result<T, Ec2Error> {
    quick_xml::de::from_str(xml).map_err(|e| Ec2Error::Decode {
        action: action.into(),
        detail: e.to_string(),
    })
}

/// A list as EC2 serialises it: `<fooSet><item>…</item>…</fooSet>`.
#[derive(Debug, Clone, Deserialize)]
pub struct Items<T> {
    #[serde(rename = "item", default = "Vec::new")]
    pub item: Vec<T>,
}

impl<T> Default for Items<T> {
    fn default() -> Self {
        Items { item: Vec::new() }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tag {
    pub key: String,
    #[serde(default)]
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    #[serde(default)]
    pub attachment_id: Option<String>,
    #[serde(default)]
    pub instance_id: Option<String>,
    #[serde(default)]
    pub device_index: Option<u32>,
    #[serde(default)]
    pub network_card_index: Option<u32>,
    /// attaching | attached | detaching | detached
    #[serde(default)]
    pub status: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ipv6Item {
    pub ipv6_address: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkInterface {
    pub network_interface_id: String,
    #[serde(default)]
    pub mac_address: String,
    /// available | attaching | in-use | detaching
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub private_ip_address: Option<String>,
    #[serde(default)]
    pub subnet_id: String,
    #[serde(default)]
    pub attachment: Option<Attachment>,
    #[serde(default)]
    pub tag_set: Items<Tag>,
    #[serde(default)]
    pub ipv6_addresses_set: Items<Ipv6Item>,
}

impl NetworkInterface {
    pub fn tag(&self, key: &str) -> Option<&str> {
        self.tag_set
            .item
            .iter()
            .find(|t| t.key == key)
            .map(|t| t.value.as_str())
    }

    /// The instance it is attached (or attaching) to.
    pub fn attached_instance(&self) -> Option<&str> {
        let a = self.attachment.as_ref()?;
        match a.status.as_str() {
            "attaching" | "attached" | "" => a.instance_id.as_deref(),
            _ => None,
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DescribeNetworkInterfacesResponse {
    #[serde(default)]
    network_interface_set: Items<NetworkInterface>,
    #[serde(default)]
    next_token: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateNetworkInterfaceResponse {
    network_interface: NetworkInterface,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AttachNetworkInterfaceResponse {
    attachment_id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DescribeInstanceTypesResponse {
    #[serde(default)]
    instance_type_set: Items<InstanceTypeInfo>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct InstanceTypeInfo {
    instance_type: String,
    network_info: NetworkInfo,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NetworkInfo {
    maximum_network_interfaces: u32,
    #[serde(default)]
    network_cards: Items<NetworkCard>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NetworkCard {
    network_card_index: u32,
    maximum_network_interfaces: u32,
}

/// What CreateNetworkInterface should make.
#[derive(Debug, Clone, Default)]
pub struct CreateEni<'a> {
    pub subnet_id: &'a str,
    pub security_group_ids: &'a [String],
    pub description: &'a str,
    /// Idempotency: a retried create with the same token returns the same
    /// ENI instead of making a second one.
    pub client_token: &'a str,
    pub tags: &'a [(String, String)],
    pub ipv6_address_count: u32,
}

/// The EC2 operations enim uses.
pub struct Ec2Client {
    query: QueryClient,
}

impl Ec2Client {
    pub fn new(
        endpoint: &str,
        region: &str,
        creds: Arc<CredentialsProvider>,
        retry: RetryPolicy,
    ) -> Result<Ec2Client, Ec2Error> {
        Ok(Ec2Client {
            query: QueryClient::new(endpoint, region, "ec2", EC2_API_VERSION, creds, retry)?,
        })
    }

    pub fn query(&self) -> &QueryClient {
        &self.query
    }

    /// DescribeNetworkInterfaces with `Filter.N` filters, every page.
    pub async fn describe_network_interfaces(
        &self,
        filters: &[(&str, &[&str])],
    ) -> Result<Vec<NetworkInterface>, Ec2Error> {
        const ACTION: &str = "DescribeNetworkInterfaces";
        let mut params = filter_params(filters);
        params.push(("MaxResults".into(), PAGE_SIZE.into()));
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut p = params.clone();
            if let Some(t) = &token {
                p.push(("NextToken".into(), t.clone()));
            }
            let page: DescribeNetworkInterfacesResponse =
                decode(ACTION, &self.query.call(ACTION, &p).await?)?;
            out.extend(page.network_interface_set.item);
            match page.next_token.filter(|t| !t.is_empty()) {
                Some(next) if token.as_ref() == Some(&next) => {
                    return Err(Ec2Error::Decode {
                        action: ACTION.into(),
                        detail: "the same NextToken came back twice".into(),
                    })
                }
                Some(next) => token = Some(next),
                None => return Ok(out),
            }
        }
        Err(Ec2Error::Decode {
            action: ACTION.into(),
            detail: format!("more than {MAX_PAGES} pages"),
        })
    }

    /// One interface by id; `None` when it does not exist.
    pub async fn describe_network_interface(
        &self,
        id: &str,
    ) -> Result<Option<NetworkInterface>, Ec2Error> {
        const ACTION: &str = "DescribeNetworkInterfaces";
        let params = vec![("NetworkInterfaceId.1".to_string(), id.to_string())];
        match self.query.call(ACTION, &params).await {
            Ok(xml) => {
                let r: DescribeNetworkInterfacesResponse = decode(ACTION, &xml)?;
                Ok(r.network_interface_set
                    .item
                    .into_iter()
                    .find(|n| n.network_interface_id == id))
            }
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn create_network_interface(
        &self,
        req: &CreateEni<'_>,
    ) -> Result<NetworkInterface, Ec2Error> {
        const ACTION: &str = "CreateNetworkInterface";
        let mut p: Vec<(String, String)> = vec![
            ("SubnetId".into(), req.subnet_id.into()),
            ("Description".into(), req.description.into()),
            ("ClientToken".into(), req.client_token.into()),
        ];
        for (i, sg) in req.security_group_ids.iter().enumerate() {
            p.push((format!("SecurityGroupId.{}", i + 1), sg.clone()));
        }
        if req.ipv6_address_count > 0 {
            p.push((
                "Ipv6AddressCount".into(),
                req.ipv6_address_count.to_string(),
            ));
        }
        if !req.tags.is_empty() {
            p.push((
                "TagSpecification.1.ResourceType".into(),
                "network-interface".into(),
            ));
            for (i, (k, v)) in req.tags.iter().enumerate() {
                p.push((format!("TagSpecification.1.Tag.{}.Key", i + 1), k.clone()));
                p.push((format!("TagSpecification.1.Tag.{}.Value", i + 1), v.clone()));
            }
        }
        let r: CreateNetworkInterfaceResponse =
            decode(ACTION, &self.query.call(ACTION, &p).await?)?;
        Ok(r.network_interface)
    }

    /// Returns the attachment id.
    pub async fn attach_network_interface(
        &self,
        eni_id: &str,
        instance_id: &str,
        device_index: u32,
        network_card_index: u32,
    ) -> Result<String, Ec2Error> {
        const ACTION: &str = "AttachNetworkInterface";
        let p = vec![
            ("NetworkInterfaceId".into(), eni_id.into()),
            ("InstanceId".into(), instance_id.into()),
            ("DeviceIndex".into(), device_index.to_string()),
            ("NetworkCardIndex".into(), network_card_index.to_string()),
        ];
        let r: AttachNetworkInterfaceResponse =
            decode(ACTION, &self.query.call(ACTION, &p).await?)?;
        Ok(r.attachment_id)
    }

    /// Marks the attachment delete-on-termination, so the ENI goes with the
    /// instance instead of leaking when the node is terminated.
    pub async fn set_delete_on_termination(
        &self,
        eni_id: &str,
        attachment_id: &str,
    ) -> Result<(), Ec2Error> {
        const ACTION: &str = "ModifyNetworkInterfaceAttribute";
        let p = vec![
            ("NetworkInterfaceId".into(), eni_id.into()),
            ("Attachment.AttachmentId".into(), attachment_id.into()),
            ("Attachment.DeleteOnTermination".into(), "true".into()),
        ];
        self.query.call(ACTION, &p).await.map(drop)
    }

    pub async fn detach_network_interface(&self, attachment_id: &str) -> Result<(), Ec2Error> {
        const ACTION: &str = "DetachNetworkInterface";
        let p = vec![("AttachmentId".into(), attachment_id.into())];
        self.query.call(ACTION, &p).await.map(drop)
    }

    pub async fn delete_network_interface(&self, eni_id: &str) -> Result<(), Ec2Error> {
        const ACTION: &str = "DeleteNetworkInterface";
        let p = vec![("NetworkInterfaceId".into(), eni_id.into())];
        self.query.call(ACTION, &p).await.map(drop)
    }

    /// How many interfaces `instance_type` takes on network card 0 (where
    /// enim attaches), the primary included.
    pub async fn max_interfaces(&self, instance_type: &str) -> Result<usize, Ec2Error> {
        const ACTION: &str = "DescribeInstanceTypes";
        let p = vec![("InstanceType.1".into(), instance_type.into())];
        let r: DescribeInstanceTypesResponse = decode(ACTION, &self.query.call(ACTION, &p).await?)?;
        let info = r
            .instance_type_set
            .item
            .into_iter()
            .find(|t| t.instance_type == instance_type)
            .ok_or_else(|| Ec2Error::Decode {
                action: ACTION.into(),
                detail: format!("no instance type {instance_type} in the reply"),
            })?;
        // Multi-card instances split the total between cards.
        let card0 = info
            .network_info
            .network_cards
            .item
            .iter()
            .find(|c| c.network_card_index == 0)
            .map(|c| c.maximum_network_interfaces);
        Ok(card0.unwrap_or(info.network_info.maximum_network_interfaces) as usize)
    }
}

fn filter_params(filters: &[(&str, &[&str])]) -> Vec<(String, String)> {
    let mut p = Vec::new();
    for (i, (name, values)) in filters.iter().enumerate() {
        p.push((format!("Filter.{}.Name", i + 1), name.to_string()));
        for (j, v) in values.iter().enumerate() {
            p.push((format!("Filter.{}.Value.{}", i + 1, j + 1), v.to_string()));
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ec2_errors_are_typed() {
        let body = r#"<?xml version="1.0" encoding="UTF-8"?>
<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors><RequestID>r-1</RequestID></Response>"#;
        let e = classify("AttachNetworkInterface", 503, body);
        assert!(
            matches!(e, Ec2Error::Throttled { ref code, .. } if code == "RequestLimitExceeded")
        );
        assert!(e.retryable());
        assert!(ProviderError::from(e).is_transient());

        let body = "<Response><Errors><Error><Code>AttachmentLimitExceeded</Code>\
                    <Message>Interface count 5 exceeds the limit for m5.large</Message></Error></Errors></Response>";
        let e = classify("AttachNetworkInterface", 400, body);
        assert!(
            matches!(e, Ec2Error::AttachmentLimitExceeded { .. }),
            "{e:?}"
        );
        assert!(!e.retryable());
        assert!(e.to_string().contains("exceeds the limit"));

        for code in [
            "AuthFailure",
            "SignatureDoesNotMatch",
            "InvalidClientTokenId",
        ] {
            let body = format!(
                "<Response><Errors><Error><Code>{code}</Code><Message>nope</Message></Error></Errors></Response>"
            );
            let e = classify("DescribeNetworkInterfaces", 401, &body);
            assert!(matches!(e, Ec2Error::Auth { .. }), "{code}: {e:?}");
            assert!(!e.retryable());
            let p = ProviderError::from(e);
            assert!(!p.is_transient());
            assert!(p.to_string().contains(code), "{p}");
        }

        let body = "<Response><Errors><Error><Code>UnauthorizedOperation</Code>\
                    <Message>You are not authorized</Message></Error></Errors></Response>";
        let e = classify("CreateNetworkInterface", 403, body);
        assert!(e.to_string().contains("ec2:CreateNetworkInterface"), "{e}");

        let body = "<Response><Errors><Error><Code>InvalidNetworkInterfaceID.NotFound</Code>\
                    <Message>gone</Message></Error></Errors></Response>";
        assert!(classify("DeleteNetworkInterface", 400, body).is_not_found());

        // IAM-style envelope.
        let body = "<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code>\
                    <Message>Rate exceeded</Message></Error></ErrorResponse>";
        assert!(matches!(
            classify("ListUsers", 400, body),
            Ec2Error::Throttled { .. }
        ));

        // No XML: the status decides.
        assert!(classify("X", 502, "<html>Bad gateway</html>").retryable());
        assert!(classify("X", 429, "").retryable());
        assert!(!classify("X", 400, "garbage").retryable());
        assert!(classify("X", 500, "<Response><Errors><Error><Code>InternalError</Code><Message>m</Message></Error></Errors></Response>").retryable());
    }

    #[test]
    fn network_interface_xml() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeNetworkInterfacesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
 <requestId>r</requestId>
 <networkInterfaceSet>
  <item>
   <networkInterfaceId>eni-0a</networkInterfaceId>
   <subnetId>subnet-1</subnetId>
   <description/>
   <status>in-use</status>
   <macAddress>02:00:00:aa:bb:cc</macAddress>
   <privateIpAddress>10.0.1.5</privateIpAddress>
   <groupSet><item><groupId>sg-1</groupId><groupName>default</groupName></item></groupSet>
   <attachment>
     <attachmentId>eni-attach-1</attachmentId><instanceId>i-1</instanceId>
     <deviceIndex>2</deviceIndex><networkCardIndex>0</networkCardIndex><status>attached</status>
   </attachment>
   <tagSet><item><key>enim.io/node</key><value>i-1</value></item><item><key>empty</key><value/></item></tagSet>
   <ipv6AddressesSet><item><ipv6Address>2600::5</ipv6Address></item></ipv6AddressesSet>
  </item>
  <item><networkInterfaceId>eni-0b</networkInterfaceId><status>available</status><tagSet/><ipv6AddressesSet/></item>
 </networkInterfaceSet>
 <nextToken>tok</nextToken>
</DescribeNetworkInterfacesResponse>"#;
        let r: DescribeNetworkInterfacesResponse = decode("D", xml).unwrap();
        assert_eq!(r.next_token.as_deref(), Some("tok"));
        let [a, b] = &r.network_interface_set.item[..] else {
            panic!("two items expected");
        };
        assert_eq!(a.network_interface_id, "eni-0a");
        assert_eq!(a.tag("enim.io/node"), Some("i-1"));
        assert_eq!(a.tag("empty"), Some(""));
        assert_eq!(a.attached_instance(), Some("i-1"));
        let att = a.attachment.as_ref().unwrap();
        assert_eq!(att.device_index, Some(2));
        assert_eq!(att.attachment_id.as_deref(), Some("eni-attach-1"));
        assert_eq!(a.ipv6_addresses_set.item[0].ipv6_address, "2600::5");
        assert_eq!(b.attachment, None);
        assert_eq!(b.attached_instance(), None);
        assert!(b.tag_set.item.is_empty());
    }

    #[test]
    fn instance_type_limit_per_card() {
        let xml = "<DescribeInstanceTypesResponse><instanceTypeSet><item>\
            <instanceType>p5.48xlarge</instanceType><networkInfo>\
            <maximumNetworkInterfaces>64</maximumNetworkInterfaces>\
            <networkCards><item><networkCardIndex>0</networkCardIndex><maximumNetworkInterfaces>2</maximumNetworkInterfaces></item>\
            <item><networkCardIndex>1</networkCardIndex><maximumNetworkInterfaces>2</maximumNetworkInterfaces></item></networkCards>\
            </networkInfo></item></instanceTypeSet></DescribeInstanceTypesResponse>";
        let r: DescribeInstanceTypesResponse = decode("D", xml).unwrap();
        let info = &r.instance_type_set.item[0];
        assert_eq!(info.network_info.maximum_network_interfaces, 64);
        assert_eq!(
            info.network_info.network_cards.item[1].maximum_network_interfaces,
            2
        );
    }

    #[test]
    fn backoff_is_bounded_and_jittered() {
        let p = RetryPolicy {
            attempts: 5,
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        for _ in 0..100 {
            let d1 = p.delay(1);
            assert!(d1 >= Duration::from_millis(50) && d1 <= Duration::from_millis(100));
            let d3 = p.delay(3);
            assert!(d3 >= Duration::from_millis(200) && d3 <= Duration::from_millis(400));
            let d40 = p.delay(40);
            assert!(d40 >= Duration::from_millis(500) && d40 <= Duration::from_secs(1));
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

    #[test]
    fn filters_encode() {
        let p = filter_params(&[("tag:enim.io/node", &["i-1"]), ("status", &["a", "b"])]);
        assert_eq!(
            p,
            vec![
                ("Filter.1.Name".into(), "tag:enim.io/node".into()),
                ("Filter.1.Value.1".into(), "i-1".into()),
                ("Filter.2.Name".into(), "status".into()),
                ("Filter.2.Value.1".into(), "a".into()),
                ("Filter.2.Value.2".into(), "b".into()),
            ]
        );
    }
}
