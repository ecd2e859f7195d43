//! The BCE API client: a small client of the ENI OpenAPI
//! (`bcc.<region>.baidubce.com`, `/v1/eni...`) and of BCC's security group
//! listing on the same host (`/v2/securityGroup`): signed with bce-auth-v1,
//! retried with jittered backoff on throttling and server errors, every
//! mutating call carrying a clientToken that stays the same across its
//! retries so BCE can deduplicate them. Its error type is in [`error`],
//! the request and answer bodies in [`types`].

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use enim_core::api_config::ApiConfig;
use enim_core::ratelimit::{RateLimit, TokenBucket};
pub use enim_core::retry::RetryPolicy;
use reqwest::Method;
use serde::Deserialize;

use crate::auth::{self, Credentials, SignInput};

pub mod error;
pub mod types;

pub use error::ApiError;
use types::{AddedIps, Created, ErrorBody, ListPage, Page, SecurityGroupPage, SubnetAnswer};
pub use types::{ApiEni, ApiSubnet, CreateEni, EniQuota, EniStatus, PrivateIp};

/// How long a signature stays valid. BCE rejects requests whose
/// `x-bce-date` is outside this window of its own clock.
const SIGNATURE_TTL_SECS: u32 = 1800;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Addresses one private-IP batch add or delete takes at most (BCE's
/// documented limit).
pub const PRIVATE_IP_BATCH_MAX: usize = 10;

/// This agent's token buckets, one per API class: calls that change
/// something (POST, PUT, DELETE) and reads (GET). Every request, each retry
/// included, takes a token of its class first, so one node cannot spend
/// the account's quota of API calls.
#[derive(Debug)]
pub struct MethodLimits {
    mutating: TokenBucket,
    read: TokenBucket,
}

impl MethodLimits {
    pub fn new(mutating: RateLimit, read: RateLimit) -> Self {
        MethodLimits {
            mutating: TokenBucket::new(mutating),
            read: TokenBucket::new(read),
        }
    }

    fn bucket(&self, method: &Method) -> &TokenBucket {
        if *method == Method::GET {
            &self.read
        } else {
            &self.mutating
        }
    }
}

/// The ENI OpenAPI endpoint of `region`.
pub fn region_endpoint(region: &str) -> String {
    format!("https://bcc.{region}.baidubce.com")
}

/// A fresh idempotency token (ASCII, well under BCE's 64-character limit).
pub fn client_token() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// The two verbs of `PUT /v1/eni/<id>` ([`ApiClient::set_attachment`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attachment {
    Attach,
    Detach,
}

impl Attachment {
    /// Its query parameter.
    fn action(self) -> &'static str {
        match self {
            Attachment::Attach => "attach",
            Attachment::Detach => "detach",
        }
    }
}

#[derive(Clone)]
pub struct ApiClient {
    http: reqwest::Client,
    /// `scheme://host[:port]`, no trailing slash.
    base: String,
    /// The Host header value, exactly as signed.
    host: String,
    creds: Credentials,
    retry: RetryPolicy,
    /// Client-side rate limits; `None`: unlimited.
    limits: Option<Arc<MethodLimits>>,
}

/// One API call as [`ApiClient::call`] sends it on every try: `op` names it
/// in errors.
struct Request<'a> {
    op: &'a str,
    method: Method,
    path: &'a str,
    params: &'a [(String, String)],
    body: Option<String>,
}

impl fmt::Debug for ApiClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiClient")
            .field("base", &self.base)
            .field("creds", &self.creds)
            .field("retry", &self.retry)
            .finish()
    }
}

impl ApiClient {
    /// `endpoint` is `https://bcc.bj.baidubce.com`, `http://127.0.0.1:8080`
    /// or a bare host (HTTPS assumed).
    pub fn new(endpoint: &str, creds: Credentials, retry: RetryPolicy) -> Result<Self, ApiError> {
        let bad = |why: String| ApiError::Endpoint {
            endpoint: endpoint.to_string(),
            why,
        };
        let with_scheme = if endpoint.contains("://") {
            endpoint.to_string()
        } else {
            format!("https://{endpoint}")
        };
        let url = reqwest::Url::parse(&with_scheme).map_err(|e| bad(e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(bad("scheme must be http or https".into()));
        }
        if url.path() != "/" || url.query().is_some() {
            return Err(bad("give scheme, host and port only".into()));
        }
        let host_name = url.host_str().ok_or_else(|| bad("no host".into()))?;
        // What hyper would send: the port only when it is not the default.
        let host = match url.port() {
            Some(p) => format!("{host_name}:{p}"),
            None => host_name.to_string(),
        };
        let base = format!("{}://{host}", url.scheme());
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| bad(e.to_string()))?;
        Ok(ApiClient {
            http,
            base,
            host,
            creds,
            retry,
            limits: None,
        })
    }

    /// A client of `endpoint` that retries and paces its calls as `api`
    /// says, with token buckets of its own (one client per process).
    pub fn configured(
        endpoint: &str,
        creds: Credentials,
        api: &ApiConfig,
    ) -> Result<Self, ApiError> {
        let limits = Arc::new(MethodLimits::new(api.mutating_rate, api.read_rate));
        Ok(ApiClient::new(endpoint, creds, api.retry_policy())?.with_limits(limits))
    }

    /// Every request waits for a token of its class in `limits`.
    pub fn with_limits(mut self, limits: Arc<MethodLimits>) -> Self {
        self.limits = Some(limits);
        self
    }

    /// One API call with retries. Returns the response body.
    async fn call(
        &self,
        op: &str,
        method: Method,
        path: &str,
        params: &[(String, String)],
        body: Option<String>,
    ) -> Result<String, ApiError> {
        let request = Request {
            op,
            method,
            path,
            params,
            body,
        };
        self.retry
            .run(ApiError::is_transient, |_| self.call_once(&request))
            .await
    }

    async fn call_once(&self, request: &Request<'_>) -> Result<String, ApiError> {
        let &Request {
            op,
            ref method,
            path,
            params,
            ref body,
        } = request;
        // A token per request, retries too; the wait is a timer, never a
        // blocked thread.
        if let Some(limits) = &self.limits {
            let waited = limits.bucket(method).acquire().await;
            if !waited.is_zero() {
                tracing::debug!(op, ?waited, "waited for a client-side API token");
            }
        }
        // Signed afresh on every try: a retry after a long backoff must not
        // carry a stale date.
        let date = auth::format_timestamp(SystemTime::now());
        let signed = [
            ("host".to_string(), self.host.clone()),
            (auth::BCE_DATE.to_string(), date.clone()),
        ];
        let authorization = auth::authorization(
            &self.creds,
            &SignInput {
                method: method.as_str(),
                path,
                params,
                headers: &signed,
                timestamp: &date,
                expiration_secs: SIGNATURE_TTL_SECS,
            },
        );
        // The wire query uses the same encoding as the signature; a
        // parameter without a value goes out bare (`?attach`), as BCE's
        // examples show.
        let query = params
            .iter()
            .map(|(k, v)| {
                if v.is_empty() {
                    auth::uri_encode(k)
                } else {
                    format!("{}={}", auth::uri_encode(k), auth::uri_encode(v))
                }
            })
            .collect::<Vec<_>>()
            .join("&");
        let mut url = format!("{}{}", self.base, auth::uri_encode_path(path));
        if !query.is_empty() {
            url.push('?');
            url.push_str(&query);
        }
        let mut req = self
            .http
            .request(method.clone(), &url)
            .header(reqwest::header::HOST, &self.host)
            .header(auth::BCE_DATE, &date)
            .header(reqwest::header::AUTHORIZATION, authorization);
        if let Some(b) = body {
            req = req
                .header(
                    reqwest::header::CONTENT_TYPE,
                    "application/json;charset=UTF-8",
                )
                .body(b.clone());
        }
        let transport = |source| ApiError::Transport {
            op: op.to_string(),
            source,
        };
        let resp = req.send().await.map_err(transport)?;
        let status = resp.status();
        let header_request_id = resp
            .headers()
            .get("x-bce-request-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let text = resp.text().await.map_err(transport)?;
        if status.is_success() {
            return Ok(text);
        }
        let parsed: ErrorBody = serde_json::from_str(&text).unwrap_or_default();
        Err(ApiError::Http {
            op: op.to_string(),
            status: status.as_u16(),
            code: if parsed.code.is_empty() {
                status
                    .canonical_reason()
                    .unwrap_or("error")
                    .replace(' ', "")
            } else {
                parsed.code
            },
            message: if parsed.message.is_empty() {
                text.chars().take(200).collect()
            } else {
                parsed.message
            },
            request_id: if parsed.request_id.is_empty() {
                header_request_id
            } else {
                parsed.request_id
            },
        })
    }

    fn decode<T: for<'de> Deserialize<'de>>(op: &str, body: &str) -> Result<T, ApiError> {
        serde_json::from_str(body).map_err(|e| ApiError::Decode {
            op: op.to_string(),
            why: e.to_string(),
        })
    }

    /// Every item of a marker-paged listing at `path` asked with `params`,
    /// `page_size` (`maxKeys`) at a time.
    async fn list_all<P: Page>(
        &self,
        op: &str,
        path: &str,
        params: &[(String, String)],
        page_size: u32,
    ) -> Result<Vec<P::Item>, ApiError> {
        let mut out = Vec::new();
        let mut marker: Option<String> = None;
        // A server that keeps answering "truncated" with the same marker
        // must not spin us forever.
        for _ in 0..10_000 {
            let mut page_params = params.to_vec();
            page_params.push(("maxKeys".to_string(), page_size.to_string()));
            if let Some(m) = &marker {
                page_params.push(("marker".to_string(), m.clone()));
            }
            let body = self.call(op, Method::GET, path, &page_params, None).await?;
            let (items, is_truncated, next_marker) = Self::decode::<P>(op, &body)?.into_parts();
            out.extend(items);
            match (is_truncated, next_marker) {
                (true, Some(next)) if !next.is_empty() && Some(&next) != marker.as_ref() => {
                    marker = Some(next)
                }
                (true, _) => {
                    return Err(ApiError::Decode {
                        op: op.to_string(),
                        why: "isTruncated without a new nextMarker".into(),
                    })
                }
                (false, _) => return Ok(out),
            }
        }
        Err(ApiError::Decode {
            op: op.to_string(),
            why: "too many pages".into(),
        })
    }

    /// Every ENI of `vpc_id` (attached to `instance_id` when given), all
    /// pages followed.
    pub async fn list_enis(
        &self,
        vpc_id: &str,
        instance_id: Option<&str>,
        page_size: u32,
    ) -> Result<Vec<ApiEni>, ApiError> {
        let mut params = vec![("vpcId".to_string(), vpc_id.to_string())];
        if let Some(i) = instance_id {
            params.push(("instanceId".to_string(), i.to_string()));
        }
        self.list_all::<ListPage>("list ENIs", "/v1/eni", &params, page_size)
            .await
    }

    /// The ids of the security groups bound to BCC instance `instance_id`
    /// in `vpc_id` (BCC's groups, which apply to the instance's primary
    /// NIC), all pages followed. A group without an id is an answer enim
    /// cannot use.
    pub async fn instance_security_groups(
        &self,
        instance_id: &str,
        vpc_id: &str,
        page_size: u32,
    ) -> Result<Vec<String>, ApiError> {
        let op = format!("list the security groups of instance {instance_id}");
        // BCE requires vpcId whenever instanceId is given.
        let params = [
            ("instanceId".to_string(), instance_id.to_string()),
            ("vpcId".to_string(), vpc_id.to_string()),
        ];
        let groups = self
            .list_all::<SecurityGroupPage>(&op, "/v2/securityGroup", &params, page_size)
            .await?;
        if groups.iter().any(|g| g.id.trim().is_empty()) {
            return Err(ApiError::Decode {
                op,
                why: "a security group without an id".into(),
            });
        }
        Ok(groups.into_iter().map(|g| g.id).collect())
    }

    pub async fn get_eni(&self, eni_id: &str) -> Result<ApiEni, ApiError> {
        let op = format!("get ENI {eni_id}");
        let body = self
            .call(&op, Method::GET, &format!("/v1/eni/{eni_id}"), &[], None)
            .await?;
        Self::decode(&op, &body)
    }

    pub async fn create_eni(&self, req: &CreateEni<'_>, token: &str) -> Result<String, ApiError> {
        let op = format!("create ENI {}", req.name);
        let body = serde_json::to_string(req).map_err(|e| ApiError::Decode {
            op: op.clone(),
            why: e.to_string(),
        })?;
        let params = [("clientToken".to_string(), token.to_string())];
        let answer = self
            .call(&op, Method::POST, "/v1/eni", &params, Some(body))
            .await?;
        let created: Created = Self::decode(&op, &answer)?;
        Ok(created.eni_id)
    }

    /// Attaches `eni_id` to `instance_id`, or detaches it from there.
    pub async fn set_attachment(
        &self,
        verb: Attachment,
        eni_id: &str,
        instance_id: &str,
        token: &str,
    ) -> Result<(), ApiError> {
        let action = verb.action();
        let op = format!("{action} ENI {eni_id} to/from {instance_id}");
        let params = [
            (action.to_string(), String::new()),
            ("clientToken".to_string(), token.to_string()),
        ];
        let body = serde_json::json!({ "instanceId": instance_id }).to_string();
        self.call(
            &op,
            Method::PUT,
            &format!("/v1/eni/{eni_id}"),
            &params,
            Some(body),
        )
        .await?;
        Ok(())
    }

    pub async fn delete_eni(&self, eni_id: &str, token: &str) -> Result<(), ApiError> {
        let op = format!("delete ENI {eni_id}");
        let params = [("clientToken".to_string(), token.to_string())];
        self.call(
            &op,
            Method::DELETE,
            &format!("/v1/eni/{eni_id}"),
            &params,
            None,
        )
        .await?;
        Ok(())
    }

    /// Renames and redescribes `eni_id` (BCE's `modifyAttribute`).
    pub async fn modify_eni(
        &self,
        eni_id: &str,
        name: &str,
        description: &str,
        token: &str,
    ) -> Result<(), ApiError> {
        let op = format!("modify ENI {eni_id}");
        let params = [
            ("modifyAttribute".to_string(), String::new()),
            ("clientToken".to_string(), token.to_string()),
        ];
        let body = serde_json::json!({ "name": name, "description": description }).to_string();
        let path = format!("/v1/eni/{eni_id}");
        self.call(&op, Method::PUT, &path, &params, Some(body))
            .await?;
        Ok(())
    }

    /// One subnet of the VPC API (its blocks).
    pub async fn get_subnet(&self, subnet_id: &str) -> Result<ApiSubnet, ApiError> {
        let op = format!("get subnet {subnet_id}");
        let path = format!("/v1/subnet/{subnet_id}");
        let body = self.call(&op, Method::GET, &path, &[], None).await?;
        Ok(Self::decode::<SubnetAnswer>(&op, &body)?.subnet)
    }

    pub async fn quota(&self, instance_id: &str) -> Result<EniQuota, ApiError> {
        let op = format!("ENI quota of {instance_id}");
        self.quota_call(&op, "instanceId", instance_id).await
    }

    /// The private-IP quota of one ENI (the same quota call, asked by
    /// `eniId`): `totalQuantity` addresses it may carry, `availableQuantity`
    /// still free.
    pub async fn ip_quota(&self, eni_id: &str) -> Result<EniQuota, ApiError> {
        let op = format!("private-IP quota of ENI {eni_id}");
        self.quota_call(&op, "eniId", eni_id).await
    }

    /// The quota call, asked by `key` (`instanceId` or `eniId`).
    async fn quota_call(&self, op: &str, key: &str, value: &str) -> Result<EniQuota, ApiError> {
        let params = [(key.to_string(), value.to_string())];
        let body = self
            .call(op, Method::GET, "/v1/eni/quota", &params, None)
            .await?;
        Self::decode(op, &body)
    }

    /// Asks BCE for `count` (at most [`PRIVATE_IP_BATCH_MAX`]) new
    /// secondary addresses of one family on `eni_id`; returns what BCE
    /// says it added.
    pub async fn batch_add_private_ips(
        &self,
        eni_id: &str,
        count: usize,
        ipv6: bool,
        token: &str,
    ) -> Result<Vec<String>, ApiError> {
        let family = if ipv6 { "IPv6" } else { "IPv4" };
        let op = format!("add {count} {family} addresses to ENI {eni_id}");
        let body =
            serde_json::json!({ "isIpv6": ipv6, "privateIpAddressCount": count }).to_string();
        let params = [("clientToken".to_string(), token.to_string())];
        let answer = self
            .call(
                &op,
                Method::POST,
                &format!("/v1/eni/{eni_id}/privateIp/batchAdd"),
                &params,
                Some(body),
            )
            .await?;
        let added: AddedIps = Self::decode(&op, &answer)?;
        Ok(added.private_ip_addresses)
    }

    /// Deletes `ips` (at most [`PRIVATE_IP_BATCH_MAX`], secondary only)
    /// from `eni_id`.
    pub async fn batch_del_private_ips(
        &self,
        eni_id: &str,
        ips: &[String],
        token: &str,
    ) -> Result<(), ApiError> {
        let op = format!("delete addresses {ips:?} of ENI {eni_id}");
        let body = serde_json::json!({ "privateIpAddresses": ips }).to_string();
        let params = [("clientToken".to_string(), token.to_string())];
        self.call(
            &op,
            Method::POST,
            &format!("/v1/eni/{eni_id}/privateIp/batchDel"),
            &params,
            Some(body),
        )
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        let creds = Credentials {
            access_key_id: "a".into(),
            secret_access_key: "b".into(),
        };
        let p = RetryPolicy {
            attempts: 1,
            initial: Duration::from_millis(1),
            max: Duration::from_millis(1),
        };
        let c = ApiClient::new("bcc.bj.baidubce.com", creds.clone(), p).unwrap();
        assert_eq!(c.base, "https://bcc.bj.baidubce.com");
        assert_eq!(c.host, "bcc.bj.baidubce.com");
        let c = ApiClient::new("http://127.0.0.1:8080", creds.clone(), p).unwrap();
        assert_eq!(
            (c.base.as_str(), c.host.as_str()),
            ("http://127.0.0.1:8080", "127.0.0.1:8080")
        );
        let c = ApiClient::new("https://h:443/", creds.clone(), p).unwrap();
        assert_eq!(c.host, "h");
        assert!(ApiClient::new("ftp://h", creds.clone(), p).is_err());
        assert!(ApiClient::new("https://h/v1", creds, p).is_err());
    }
}
