//! The BCC instance metadata service (`http://169.254.169.254/1.0/meta-data/`).
//!
//! Every path enim reads is in [`paths`]. The layout follows Baidu's own CNI
//! (baiducloud-cce-cni-driver, `pkg/bce/metadata`): listings are one entry
//! per line with a trailing `/`, leaves are plain text. What Baidu does not
//! document (and enim therefore does not rely on):
//! - a per-MAC ENI id: ids come from the ENI OpenAPI, matched by MAC;
//! - a per-MAC "primary" flag: the primary interface is the one carrying the
//!   instance's `local-ipv4`;
//! - the exact vocabulary of `ip_type`: Baidu's CNI reads `primary` /
//!   `secondary` (the ENI's primary private IP); `ipv4` / `ipv6` is accepted
//!   too, and the family is always taken from the address itself.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use enim_core::{Eni, MacAddr};
use ipnet::{Ipv4Net, Ipv6Net};

/// The metadata paths, relative to the base URL, in one place.
pub mod paths {
    pub const INSTANCE_ID: &str = "instance-shortid";
    pub const REGION: &str = "region";
    pub const VPC_ID: &str = "vpc-id";
    pub const SUBNET_ID: &str = "subnet-id";
    pub const LOCAL_IPV4: &str = "local-ipv4";
    pub const MACS: &str = "network/interfaces/macs";

    pub fn fixed_ips(mac: &str) -> String {
        format!("{MACS}/{mac}/fixed_ips")
    }
    pub fn gateway(mac: &str, ip: &str) -> String {
        format!("{MACS}/{mac}/fixed_ips/{ip}/gateway")
    }
    pub fn mask(mac: &str, ip: &str) -> String {
        format!("{MACS}/{mac}/fixed_ips/{ip}/mask")
    }
    pub fn ip_type(mac: &str, ip: &str) -> String {
        format!("{MACS}/{mac}/fixed_ips/{ip}/ip_type")
    }
}

pub const DEFAULT_BASE: &str = "http://169.254.169.254/1.0/meta-data/";

#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    #[error("metadata {path}: {source}")]
    Transport {
        path: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("metadata {path}: HTTP {status}")]
    Status { path: String, status: u16 },
    #[error("metadata {path}: empty answer")]
    Empty { path: String },
    #[error("metadata {path}: cannot parse {value:?}: {why}")]
    Parse {
        path: String,
        value: String,
        why: String,
    },
}

impl MetadataError {
    /// Whether asking again may help: the service is local, so transport
    /// errors, 5xx and 404 (a just-attached interface not yet published)
    /// all count as "not yet".
    pub fn is_transient(&self) -> bool {
        match self {
            MetadataError::Transport { .. } | MetadataError::Empty { .. } => true,
            MetadataError::Status { status, .. } => *status >= 500 || *status == 404,
            MetadataError::Parse { .. } => false,
        }
    }
}

/// One interface as metadata describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaInterface {
    pub mac: MacAddr,
    pub ipv4: Ipv4Net,
    pub gateway4: Ipv4Addr,
    pub ipv6: Option<Ipv6Net>,
    pub gateway6: Option<Ipv6Addr>,
    /// Every fixed IP of the interface, primary and secondary.
    pub all_ips: Vec<IpAddr>,
}

impl MetaInterface {
    /// The ENI `id` as metadata shows it (owner none, MTU the device's).
    pub fn to_eni(&self, id: &str) -> Eni {
        Eni {
            id: id.to_string(),
            mac: self.mac,
            ipv4: self.ipv4,
            gateway4: self.gateway4,
            ipv6: self.ipv6,
            gateway6: self.gateway6,
            mtu: None,
            owner: None,
            device_index: None,
            secondary_ips: self
                .all_ips
                .iter()
                .filter(|ip| {
                    **ip != IpAddr::V4(self.ipv4.addr())
                        && self.ipv6.is_none_or(|own| **ip != IpAddr::V6(own.addr()))
                })
                .copied()
                .collect(),
            placement: Default::default(),
        }
    }
}

#[derive(Clone)]
pub struct MetadataClient {
    http: reqwest::Client,
    base: String,
}

impl MetadataClient {
    pub fn new(base: &str) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(3))
            .connect_timeout(Duration::from_secs(1))
            // The service is link-local; a proxy must never see it.
            .no_proxy()
            .build()?;
        let mut base = base.to_string();
        if !base.ends_with('/') {
            base.push('/');
        }
        Ok(MetadataClient { http, base })
    }

    async fn get(&self, path: &str) -> Result<String, MetadataError> {
        let url = format!("{}{}", self.base, path);
        let transport = |source| MetadataError::Transport {
            path: path.to_string(),
            source,
        };
        let resp = self.http.get(&url).send().await.map_err(transport)?;
        let status = resp.status();
        if !status.is_success() {
            return Err(MetadataError::Status {
                path: path.to_string(),
                status: status.as_u16(),
            });
        }
        let body = resp.text().await.map_err(transport)?;
        let body = body.trim().to_string();
        if body.is_empty() {
            // Baidu's CNI treats an empty answer as "not implemented yet".
            return Err(MetadataError::Empty {
                path: path.to_string(),
            });
        }
        Ok(body)
    }

    async fn list(&self, path: &str) -> Result<Vec<String>, MetadataError> {
        let body = self.get(path).await?;
        Ok(body
            .lines()
            .map(|l| l.trim().trim_end_matches('/').to_string())
            .filter(|l| !l.is_empty())
            .collect())
    }

    pub async fn instance_id(&self) -> Result<String, MetadataError> {
        self.get(paths::INSTANCE_ID).await
    }

    pub async fn region(&self) -> Result<String, MetadataError> {
        self.get(paths::REGION).await
    }

    pub async fn vpc_id(&self) -> Result<String, MetadataError> {
        self.get(paths::VPC_ID).await
    }

    pub async fn subnet_id(&self) -> Result<String, MetadataError> {
        self.get(paths::SUBNET_ID).await
    }

    pub async fn local_ipv4(&self) -> Result<Ipv4Addr, MetadataError> {
        let v = self.get(paths::LOCAL_IPV4).await?;
        v.parse()
            .map_err(|e: std::net::AddrParseError| MetadataError::Parse {
                path: paths::LOCAL_IPV4.into(),
                value: v,
                why: e.to_string(),
            })
    }

    /// The MACs as metadata spells them (used verbatim in sub-paths).
    pub async fn macs(&self) -> Result<Vec<String>, MetadataError> {
        self.list(paths::MACS).await
    }

    /// One interface's addresses. Its primary IPv4 is the fixed IP typed
    /// `primary` (else the first IPv4); IPv6, where present, is the first
    /// IPv6 fixed IP.
    pub async fn interface(&self, mac: &str) -> Result<MetaInterface, MetadataError> {
        let parse_err = |path: String, value: &str, why: String| MetadataError::Parse {
            path,
            value: value.to_string(),
            why,
        };
        let parsed_mac: MacAddr = mac.parse().map_err(|e: enim_core::MacParseError| {
            parse_err(paths::MACS.into(), mac, e.to_string())
        })?;
        let ips_path = paths::fixed_ips(mac);
        let mut v4: Vec<(Ipv4Addr, bool)> = Vec::new();
        let mut v6: Vec<Ipv6Addr> = Vec::new();
        let mut all_ips = Vec::new();
        for raw in self.list(&ips_path).await? {
            let ip: IpAddr = raw.parse().map_err(|e: std::net::AddrParseError| {
                parse_err(ips_path.clone(), &raw, e.to_string())
            })?;
            all_ips.push(ip);
            match ip {
                IpAddr::V4(a) => {
                    let primary = match self.get(&paths::ip_type(mac, &raw)).await {
                        Ok(t) => t.eq_ignore_ascii_case("primary"),
                        // Without ip_type only the hint is lost: the first
                        // IPv4 is taken instead.
                        Err(MetadataError::Status { .. } | MetadataError::Empty { .. }) => false,
                        Err(e) => return Err(e),
                    };
                    v4.push((a, primary));
                }
                IpAddr::V6(a) => v6.push(a),
            }
        }
        let ipv4 = v4
            .iter()
            .find(|(_, p)| *p)
            .or_else(|| v4.first())
            .map(|(a, _)| *a)
            .ok_or_else(|| MetadataError::Empty {
                path: format!("{ips_path} (no IPv4 address)"),
            })?;
        let v4s = ipv4.to_string();
        let prefix4 = self.prefix(mac, &v4s, 32).await?;
        let ipv4 = Ipv4Net::new(ipv4, prefix4)
            .map_err(|e| parse_err(paths::mask(mac, &v4s), &prefix4.to_string(), e.to_string()))?;
        let gw_path = paths::gateway(mac, &v4s);
        let gw = self.get(&gw_path).await?;
        let gateway4: Ipv4Addr = gw.parse().map_err(|e: std::net::AddrParseError| {
            parse_err(gw_path.clone(), &gw, e.to_string())
        })?;

        let (mut ipv6, mut gateway6) = (None, None);
        if let Some(a) = v6.first() {
            let s = a.to_string();
            let prefix6 = self.prefix(mac, &s, 128).await?;
            ipv6 = Some(Ipv6Net::new(*a, prefix6).map_err(|e| {
                parse_err(paths::mask(mac, &s), &prefix6.to_string(), e.to_string())
            })?);
            let gw_path = paths::gateway(mac, &s);
            let gw = self.get(&gw_path).await?;
            gateway6 = Some(gw.parse().map_err(|e: std::net::AddrParseError| {
                parse_err(gw_path.clone(), &gw, e.to_string())
            })?);
        }
        Ok(MetaInterface {
            mac: parsed_mac,
            ipv4,
            gateway4,
            ipv6,
            gateway6,
            all_ips,
        })
    }

    async fn prefix(&self, mac: &str, ip: &str, max: u8) -> Result<u8, MetadataError> {
        let path = paths::mask(mac, ip);
        let raw = self.get(&path).await?;
        parse_mask(&raw, max).ok_or_else(|| MetadataError::Parse {
            path,
            value: raw,
            why: "expected a prefix length or a contiguous netmask".into(),
        })
    }
}

/// A mask as `24`, `/24`, `255.255.255.0` or `ffff:ffff:ffff:ffff::`.
pub fn parse_mask(raw: &str, max: u8) -> Option<u8> {
    let raw = raw.trim().trim_start_matches('/');
    if let Ok(n) = raw.parse::<u8>() {
        return (n <= max).then_some(n);
    }
    let (bits, width) = match raw.parse::<IpAddr>().ok()? {
        IpAddr::V4(m) => (u128::from(u32::from(m)) << 96, 32),
        IpAddr::V6(m) => (u128::from(m), 128),
    };
    if width != u32::from(max) {
        return None;
    }
    let ones = bits.leading_ones();
    // Contiguous: nothing set after the leading ones.
    // At most 128 leading ones: always a u8.
    (bits.checked_shl(ones).unwrap_or(0) == 0)
        .then(|| u8::try_from(ones).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks() {
        assert_eq!(parse_mask("24", 32), Some(24));
        assert_eq!(parse_mask("/20", 32), Some(20));
        assert_eq!(parse_mask("255.255.255.0", 32), Some(24));
        assert_eq!(parse_mask("255.255.240.0", 32), Some(20));
        assert_eq!(parse_mask("255.255.255.255", 32), Some(32));
        assert_eq!(parse_mask("0.0.0.0", 32), Some(0));
        assert_eq!(parse_mask("64", 128), Some(64));
        assert_eq!(parse_mask("ffff:ffff:ffff:ffff::", 128), Some(64));
        assert_eq!(parse_mask("255.0.255.0", 32), None);
        assert_eq!(parse_mask("33", 32), None);
        assert_eq!(parse_mask("ffff::", 32), None);
        assert_eq!(parse_mask("nonsense", 32), None);
    }
}
