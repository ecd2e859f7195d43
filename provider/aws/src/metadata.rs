//! Instance metadata (IMDSv2): who this instance is and which network
//! interfaces it has, as the hypervisor sees them.
//!
//! Every GET carries a session token from `PUT /latest/api/token`; a 401
//! means the token expired and is fetched again once. Right after an attach,
//! metadata can lag: a MAC may be listed before its fields exist, so the
//! per-interface reads are retried on 404 or an empty reply, within a bound.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;
use std::time::{Duration, Instant};

use enim_core::retry::{retry, Backoff, Poll};
use enim_core::{Eni, MacAddr};
use ipnet::{Ipv4Net, Ipv6Net};
use tokio::sync::Mutex;

const TOKEN_TTL_SECS: u64 = 21_600;
/// Refresh the token this long before it expires, so a GET never races it.
const TOKEN_SLACK: Duration = Duration::from_secs(60);
/// IMDS is a local link: a short timeout finds a blocked path (hop limit,
/// disabled endpoint) quickly instead of hanging the agent.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Transport failures against IMDS are retried this many times in all...
const TRANSPORT_ATTEMPTS: u32 = 3;
/// ...after 100 ms, then 200 ms (jittered).
const TRANSPORT_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_millis(200));
/// Polls of an interface metadata lags: 50 ms doubling to 1 s (jittered).
pub const SETTLE_BACKOFF: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));

#[derive(Debug, thiserror::Error)]
pub enum ImdsError {
    #[error("instance metadata at {endpoint} unreachable ({what}): {source}")]
    Unreachable {
        endpoint: String,
        what: String,
        #[source]
        source: reqwest::Error,
    },
    #[error(
        "instance metadata at {endpoint} refused a session token (HTTP {status}): \
         is IMDS disabled, or the PUT response hop limit too low for this network namespace?"
    )]
    Token { endpoint: String, status: u16 },
    #[error("instance metadata {path}: not found")]
    NotFound { path: String },
    #[error("instance metadata {path}: HTTP {status}")]
    Status { path: String, status: u16 },
    #[error("instance metadata {path}: unexpected value {value:?}: {reason}")]
    Invalid {
        path: String,
        value: String,
        reason: String,
    },
    #[error("instance metadata: interface {mac} not visible after {waited:?}: {last}")]
    Lagging {
        mac: MacAddr,
        waited: Duration,
        last: Box<ImdsError>,
    },
}

impl ImdsError {
    /// Metadata that is missing or blank may still appear (attach lag).
    fn is_lag(&self) -> bool {
        match self {
            ImdsError::NotFound { .. } => true,
            ImdsError::Invalid { value, .. } => value.trim().is_empty(),
            _ => false,
        }
    }
}

/// One network interface as instance metadata shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceInfo {
    pub mac: MacAddr,
    pub interface_id: String,
    pub device_number: u32,
    pub network_card: u32,
    /// Primary address first.
    pub ipv4s: Vec<Ipv4Addr>,
    pub subnet_v4: Ipv4Net,
    pub ipv6s: Vec<Ipv6Addr>,
    pub subnet_v6: Option<Ipv6Net>,
    pub subnet_id: String,
}

impl InterfaceInfo {
    /// The instance's own interface (device 0 on card 0): never a pod's.
    pub fn is_primary(&self) -> bool {
        self.device_number == 0 && self.network_card == 0
    }

    /// The interface as an [`Eni`]: the primary address with the subnet's
    /// prefix length, and the VPC router (the subnet's first address + 1)
    /// as gateway.
    pub fn to_eni(&self, mtu: Option<u32>) -> Eni {
        let ip4 = self.ipv4s[0];
        let ipv6 = self.subnet_v6.and_then(|net| {
            let addr = self.ipv6s.iter().find(|a| net.contains(*a))?;
            Some((
                Ipv6Net::new(*addr, net.prefix_len()).expect("prefix from a parsed net"),
                ipv6_gateway(net),
            ))
        });
        Eni {
            id: self.interface_id.clone(),
            mac: self.mac,
            ipv4: Ipv4Net::new(ip4, self.subnet_v4.prefix_len()).expect("prefix from a parsed net"),
            gateway4: ipv4_gateway(self.subnet_v4),
            ipv6: ipv6.map(|(net, _)| net),
            gateway6: ipv6.map(|(_, gw)| gw),
            mtu,
            owner: None,
            device_index: Some(self.device_number),
            // Every address but the interface's own: the first IPv4 and
            // the IPv6 address taken as its own above.
            secondary_ips: self.ipv4s[1..]
                .iter()
                .map(|ip| IpAddr::V4(*ip))
                .chain(
                    self.ipv6s
                        .iter()
                        .filter(|ip| ipv6.is_none_or(|(own, _)| own.addr() != **ip))
                        .map(|ip| IpAddr::V6(*ip)),
                )
                .collect(),
            placement: Default::default(),
        }
    }
}

/// The VPC router: the subnet's network address + 1.
pub fn ipv4_gateway(subnet: Ipv4Net) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(subnet.network()).wrapping_add(1))
}

/// The IPv6 router, likewise the subnet prefix + 1.
pub fn ipv6_gateway(subnet: Ipv6Net) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(subnet.network()).wrapping_add(1))
}

/// Role credentials as IMDS serves them.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RoleCredentials {
    #[serde(default)]
    pub code: Option<String>,
    pub access_key_id: String,
    pub secret_access_key: String,
    #[serde(default)]
    pub token: Option<String>,
    /// RFC 3339.
    #[serde(default)]
    pub expiration: Option<String>,
}

/// An IMDSv2 client.
pub struct Imds {
    http: reqwest::Client,
    endpoint: String,
    token: Mutex<Option<(String, Instant)>>,
}

impl Imds {
    /// `endpoint` is the scheme and authority, e.g. `http://169.254.169.254`.
    pub fn new(endpoint: &str) -> Result<Imds, ImdsError> {
        let endpoint = endpoint.trim_end_matches('/').to_string();
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            // A proxy from the environment must never see metadata traffic.
            .no_proxy()
            .build()
            .map_err(|source| ImdsError::Unreachable {
                endpoint: endpoint.clone(),
                what: "building the HTTP client".into(),
                source,
            })?;
        Ok(Imds {
            http,
            endpoint,
            token: Mutex::new(None),
        })
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    async fn token(&self, force: bool) -> Result<String, ImdsError> {
        let mut cached = self.token.lock().await;
        if let Some((token, expires)) = cached.as_ref() {
            if !force && Instant::now() + TOKEN_SLACK < *expires {
                return Ok(token.clone());
            }
        }
        let url = format!("{}/latest/api/token", self.endpoint);
        let resp = self
            .send(|| {
                self.http
                    .put(&url)
                    .header("X-aws-ec2-metadata-token-ttl-seconds", TOKEN_TTL_SECS)
            })
            .await
            .map_err(|source| ImdsError::Unreachable {
                endpoint: self.endpoint.clone(),
                what: "PUT /latest/api/token".into(),
                source,
            })?;
        let status = resp.status();
        if !status.is_success() {
            return Err(ImdsError::Token {
                endpoint: self.endpoint.clone(),
                status: status.as_u16(),
            });
        }
        let token = resp
            .text()
            .await
            .map_err(|source| ImdsError::Unreachable {
                endpoint: self.endpoint.clone(),
                what: "reading the session token".into(),
                source,
            })?
            .trim()
            .to_string();
        *cached = Some((
            token.clone(),
            Instant::now() + Duration::from_secs(TOKEN_TTL_SECS),
        ));
        Ok(token)
    }

    /// Sends a request, retrying transport failures a few times: IMDS is
    /// local, and a refused or reset connection under load is common.
    async fn send(
        &self,
        request: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, reqwest::Error> {
        retry(
            &TRANSPORT_BACKOFF,
            TRANSPORT_ATTEMPTS,
            |_| true,
            |_| request().send(),
        )
        .await
    }

    /// GET `/latest/<path>`.
    pub async fn get(&self, path: &str) -> Result<String, ImdsError> {
        let url = format!("{}/latest/{}", self.endpoint, path);
        let mut token = self.token(false).await?;
        let mut refreshed = false;
        loop {
            let resp = self
                .send(|| {
                    self.http
                        .get(&url)
                        .header("X-aws-ec2-metadata-token", &token)
                })
                .await
                .map_err(|source| ImdsError::Unreachable {
                    endpoint: self.endpoint.clone(),
                    what: format!("GET {path}"),
                    source,
                })?;
            match resp.status().as_u16() {
                200 => {
                    return resp.text().await.map_err(|source| ImdsError::Unreachable {
                        endpoint: self.endpoint.clone(),
                        what: format!("reading {path}"),
                        source,
                    })
                }
                // The token expired (or IMDS restarted): one fresh token.
                401 if !refreshed => {
                    token = self.token(true).await?;
                    refreshed = true;
                }
                404 => return Err(ImdsError::NotFound { path: path.into() }),
                status => {
                    return Err(ImdsError::Status {
                        path: path.into(),
                        status,
                    })
                }
            }
        }
    }

    /// GET a single non-empty value.
    async fn value(&self, path: &str) -> Result<String, ImdsError> {
        let v = self.get(path).await?;
        let v = v.trim();
        if v.is_empty() {
            return Err(invalid(path, v, "empty"));
        }
        Ok(v.to_string())
    }

    /// GET a value that may be absent (404).
    async fn optional(&self, path: &str) -> Result<Option<String>, ImdsError> {
        match self.get(path).await {
            Ok(v) => Ok(Some(v)),
            Err(ImdsError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn instance_id(&self) -> Result<String, ImdsError> {
        self.value("meta-data/instance-id").await
    }

    pub async fn region(&self) -> Result<String, ImdsError> {
        self.value("meta-data/placement/region").await
    }

    /// The security groups of the interface with `mac`, one id a line;
    /// none when the key is absent.
    pub async fn security_groups(&self, mac: MacAddr) -> Result<Vec<String>, ImdsError> {
        let path = format!("meta-data/network/interfaces/macs/{mac}/security-group-ids");
        Ok(self
            .optional(&path)
            .await?
            .unwrap_or_default()
            .lines()
            .map(str::trim)
            .filter(|g| !g.is_empty())
            .map(str::to_string)
            .collect())
    }

    pub async fn instance_type(&self) -> Result<String, ImdsError> {
        self.value("meta-data/instance-type").await
    }

    /// The MACs of every attached interface.
    pub async fn macs(&self) -> Result<Vec<MacAddr>, ImdsError> {
        let path = "meta-data/network/interfaces/macs/";
        let body = match self.get(path).await {
            Ok(b) => b,
            // No interface listed at all: only possible mid-boot.
            Err(ImdsError::NotFound { .. }) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        body.lines()
            .map(|l| l.trim().trim_end_matches('/'))
            .filter(|l| !l.is_empty())
            .map(|l| {
                l.parse::<MacAddr>()
                    .map_err(|e| invalid(path, l, &e.to_string()))
            })
            .collect()
    }

    /// One interface's metadata, read once (no lag retry).
    pub async fn interface(&self, mac: MacAddr) -> Result<InterfaceInfo, ImdsError> {
        let base = format!("meta-data/network/interfaces/macs/{mac}");
        let p = |leaf: &str| format!("{base}/{leaf}");

        let interface_id = self.value(&p("interface-id")).await?;
        let device_number =
            parse_value(&p("device-number"), &self.value(&p("device-number")).await?)?;
        // `network-card` on current instances, `network-card-index` on
        // older ones; neither means the only card, 0.
        let network_card = match self.optional(&p("network-card")).await? {
            Some(v) => Some(v),
            None => self.optional(&p("network-card-index")).await?,
        };
        let network_card = match network_card {
            Some(v) if !v.trim().is_empty() => parse_value(&p("network-card"), &v)?,
            _ => 0,
        };

        let ipv4_path = p("local-ipv4s");
        let ipv4s: Vec<Ipv4Addr> = parse_lines(&ipv4_path, &self.value(&ipv4_path).await?)?;
        let subnet_path = p("subnet-ipv4-cidr-block");
        let subnet_v4: Ipv4Net = parse_value(&subnet_path, &self.value(&subnet_path).await?)?;

        let ipv6_path = p("ipv6s");
        let ipv6s = match self.optional(&ipv6_path).await? {
            None => Vec::new(),
            Some(body) => parse_lines::<Ipv6Addr>(&ipv6_path, &body)?,
        };
        let subnet_v6 = if ipv6s.is_empty() {
            None
        } else {
            let path = p("subnet-ipv6-cidr-blocks");
            let body = self.optional(&path).await?.unwrap_or_default();
            let nets: Vec<Ipv6Net> = parse_lines(&path, &body)?;
            // A subnet can have several blocks: take the one holding the
            // interface's address.
            nets.into_iter()
                .find(|n| ipv6s.iter().any(|a| n.contains(a)))
        };
        let subnet_id = self.value(&p("subnet-id")).await?;

        Ok(InterfaceInfo {
            mac,
            interface_id,
            device_number,
            network_card,
            ipv4s,
            subnet_v4: subnet_v4.trunc(),
            ipv6s,
            subnet_v6: subnet_v6.map(|n| n.trunc()),
            subnet_id,
        })
    }

    /// One interface's metadata, retried while it is missing or blank
    /// (metadata lags an attach), for at most `wait`. With `expect_id`, a
    /// different interface id under that MAC also counts as lag.
    pub async fn interface_settled(
        &self,
        mac: MacAddr,
        expect_id: Option<&str>,
        wait: Duration,
    ) -> Result<InterfaceInfo, ImdsError> {
        let mut poll = Poll::within(&SETTLE_BACKOFF, wait);
        loop {
            let listed = self.macs().await?.contains(&mac);
            let err = if listed {
                match self.interface(mac).await {
                    Ok(info) if expect_id.is_none_or(|id| id == info.interface_id) => {
                        return Ok(info)
                    }
                    Ok(info) => ImdsError::Invalid {
                        path: format!("meta-data/network/interfaces/macs/{mac}/interface-id"),
                        value: info.interface_id,
                        reason: format!("expected {}", expect_id.unwrap_or_default()),
                    },
                    Err(e) if e.is_lag() => e,
                    Err(e) => return Err(e),
                }
            } else {
                ImdsError::NotFound {
                    path: format!("meta-data/network/interfaces/macs/ (MAC {mac})"),
                }
            };
            tracing::debug!(%mac, error = %err, "interface not in instance metadata yet");
            if !poll.wait().await {
                return Err(ImdsError::Lagging {
                    mac,
                    waited: poll.elapsed(),
                    last: Box::new(err),
                });
            }
        }
    }

    /// Every interface attached now. One whose fields are not readable yet
    /// (an attach in progress) is retried for up to `wait`, then left out;
    /// with no `wait`, left out at once.
    pub async fn interfaces(&self, wait: Duration) -> Result<Vec<InterfaceInfo>, ImdsError> {
        let mut out = Vec::new();
        for mac in self.macs().await? {
            match self.interface(mac).await {
                Ok(info) => out.push(info),
                Err(e) if e.is_lag() && wait.is_zero() => {}
                Err(e) if e.is_lag() => match self.interface_settled(mac, None, wait).await {
                    Ok(info) => out.push(info),
                    Err(e) => {
                        tracing::warn!(%mac, error = %e, "skipping an interface instance metadata does not fully show");
                    }
                },
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Credentials of the instance's IAM role, if it has one.
    pub async fn role_credentials(&self) -> Result<Option<RoleCredentials>, ImdsError> {
        let list = "meta-data/iam/security-credentials/";
        let Some(roles) = self.optional(list).await? else {
            return Ok(None);
        };
        let Some(role) = roles.lines().map(str::trim).find(|l| !l.is_empty()) else {
            return Ok(None);
        };
        let path = format!("{list}{role}");
        let body = self.get(&path).await?;
        let creds: RoleCredentials = serde_json::from_str(&body)
            .map_err(|e| invalid(&path, "<credentials>", &e.to_string()))?;
        if let Some(code) = creds.code.as_deref().filter(|c| *c != "Success") {
            return Err(invalid(&path, code, "role credentials not available"));
        }
        Ok(Some(creds))
    }
}

fn invalid(path: &str, value: &str, reason: &str) -> ImdsError {
    ImdsError::Invalid {
        path: path.into(),
        value: value.into(),
        reason: reason.into(),
    }
}

/// The value at `path`, parsed (surrounding white space ignored).
fn parse_value<T>(path: &str, v: &str) -> Result<T, ImdsError>
where
    T: FromStr,
    T::Err: fmt::Display,
{
    v.trim()
        .parse()
        .map_err(|e: T::Err| invalid(path, v, &e.to_string()))
}

/// The value at `path` as a list, one item a line (blank lines skipped).
fn parse_lines<T>(path: &str, body: &str) -> Result<Vec<T>, ImdsError>
where
    T: FromStr,
    T::Err: fmt::Display,
{
    body.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| parse_value(path, l))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateways_are_the_subnet_plus_one() {
        assert_eq!(
            ipv4_gateway("10.0.1.0/24".parse().unwrap()),
            Ipv4Addr::new(10, 0, 1, 1)
        );
        assert_eq!(
            ipv4_gateway("172.31.32.0/20".parse().unwrap()),
            Ipv4Addr::new(172, 31, 32, 1)
        );
        assert_eq!(
            ipv6_gateway("2600:1f18:abc:de00::/64".parse().unwrap()),
            "2600:1f18:abc:de00::1".parse::<Ipv6Addr>().unwrap()
        );
    }

    #[test]
    fn eni_from_metadata() {
        let info = InterfaceInfo {
            mac: "02:00:00:aa:bb:cc".parse().unwrap(),
            interface_id: "eni-1".into(),
            device_number: 1,
            network_card: 0,
            ipv4s: vec![Ipv4Addr::new(10, 0, 1, 7), Ipv4Addr::new(10, 0, 1, 9)],
            subnet_v4: "10.0.1.0/24".parse().unwrap(),
            ipv6s: vec!["2600:1f18::5".parse().unwrap()],
            subnet_v6: Some("2600:1f18::/64".parse().unwrap()),
            subnet_id: "subnet-1".into(),
        };
        assert!(!info.is_primary());
        let eni = info.to_eni(Some(9001));
        assert_eq!(eni.ipv4, "10.0.1.7/24".parse().unwrap());
        assert_eq!(eni.gateway4, Ipv4Addr::new(10, 0, 1, 1));
        assert_eq!(eni.ipv6, Some("2600:1f18::5/64".parse().unwrap()));
        assert_eq!(eni.gateway6, Some("2600:1f18::1".parse().unwrap()));
        assert_eq!(eni.mtu, Some(9001));

        let v4_only = InterfaceInfo {
            ipv6s: vec![],
            subnet_v6: None,
            device_number: 0,
            ..info
        };
        assert!(v4_only.is_primary());
        let eni = v4_only.to_eni(None);
        assert_eq!(eni.ipv6, None);
        assert_eq!(eni.gateway6, None);
    }
}
