//! An IMDSv2 stand-in serving an instance's interfaces live from moto:
//! on loopback for one fixed instance, or (the VPC simulator's) on any
//! listener, answering each caller as the instance whose ENI holds the
//! caller's source address, looked up in moto on every request.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use aws_credential_types::Credentials;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;
use enim_provider_aws::client::{Ec2Client, NetworkInterface};

use serde::Deserialize;

use super::{
    not_found, p, text, DescribeSubnetsResponse, Fake, Items, Subnet, INSTANCE_TYPE, REGION,
};

/// How the fake reports an interface's network card.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CardKey {
    /// `network-card` (current instances).
    NetworkCard,
    /// Only the older `network-card-index`.
    LegacyIndex,
    /// Neither: both 404, meaning card 0.
    Missing,
}

/// Whose metadata a request gets.
enum Owner {
    /// Always this instance's (the loopback fake of one node).
    Fixed(String),
    /// The instance whose ENI holds the caller's source address, so one
    /// server answers every node and pod of the VPC simulator.
    BySource,
}

/// Public only as [`Fake`]'s parameter: its fields stay private.
pub struct ImdsState {
    ec2: Ec2Client,
    owner: Owner,
    tokens: Mutex<HashSet<String>>,
    /// Requests that mention a non-primary MAC before it shows up.
    hide_new_for: AtomicUsize,
    views: Mutex<HashMap<String, usize>>,
    hidden_hits: AtomicUsize,
    unauthorized: AtomicUsize,
    card_key: Mutex<CardKey>,
    role: Mutex<Option<(String, Credentials)>>,
    /// The "hypervisor": called once per non-primary MAC when metadata
    /// first shows it, with its device index (e.g. to plug a veth).
    on_new: Mutex<Option<NewInterfaceHook>>,
    plugged: Mutex<HashSet<String>>,
}

pub type NewInterfaceHook = Arc<dyn Fn(&str, u32) + Send + Sync>;

impl ImdsState {
    fn new(ec2: Ec2Client, owner: Owner) -> ImdsState {
        ImdsState {
            ec2,
            owner,
            tokens: Mutex::new(HashSet::new()),
            hide_new_for: AtomicUsize::new(0),
            views: Mutex::new(HashMap::new()),
            hidden_hits: AtomicUsize::new(0),
            unauthorized: AtomicUsize::new(0),
            card_key: Mutex::new(CardKey::LegacyIndex),
            role: Mutex::new(None),
            on_new: Mutex::new(None),
            plugged: Mutex::new(HashSet::new()),
        }
    }
}

/// A loopback IMDSv2: a token from PUT /latest/api/token is required on
/// every GET (401 without), 404 where AWS has nothing, and the instance's
/// interfaces come live from moto.
pub type FakeImds = Fake<ImdsState>;

impl Fake<ImdsState> {
    pub async fn start(ec2: Ec2Client, instance_id: String) -> FakeImds {
        Fake::serve(ImdsState::new(ec2, Owner::Fixed(instance_id)), imds_handler).await
    }

    /// Serves on `listener`, answering each caller as the instance that
    /// owns its source address in moto (404 for an address no attached ENI
    /// holds). Must be called inside a tokio runtime.
    pub fn serve_by_source(ec2: Ec2Client, listener: tokio::net::TcpListener) -> FakeImds {
        Fake::serve_on(listener, ImdsState::new(ec2, Owner::BySource), imds_handler)
    }

    /// Newly attached interfaces stay invisible for `n` requests that
    /// mention them (attach lag).
    pub fn hide_new_interfaces_for(&self, n: usize) {
        self.state.hide_new_for.store(n, Ordering::SeqCst);
    }

    /// Requests answered as if an interface were not there yet.
    pub fn hidden_hits(&self) -> usize {
        self.state.hidden_hits.load(Ordering::SeqCst)
    }

    /// 401s served (requests without a valid token).
    pub fn unauthorized(&self) -> usize {
        self.state.unauthorized.load(Ordering::SeqCst)
    }

    /// Invalidates every token, as an IMDS restart or expiry would.
    pub fn expire_tokens(&self) {
        self.state.tokens.lock().unwrap().clear();
    }

    pub fn set_card_key(&self, k: CardKey) {
        *self.state.card_key.lock().unwrap() = k;
    }

    /// Runs `hook(mac, device_index)` once for each interface the first
    /// time metadata shows it (before answering).
    pub fn on_new_interface(&self, hook: NewInterfaceHook) {
        *self.state.on_new.lock().unwrap() = Some(hook);
    }

    /// Serves these credentials as the instance role `role`.
    pub fn set_role(&self, role: &str, creds: Credentials) {
        *self.state.role.lock().unwrap() = Some((role.into(), creds));
    }
}

async fn imds_handler(
    State(st): State<Arc<ImdsState>>,
    ConnectInfo(caller): ConnectInfo<SocketAddr>,
    method: Method,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Response {
    let path = uri.path();
    if method == Method::PUT && path == "/latest/api/token" {
        let ttl = headers
            .get("x-aws-ec2-metadata-token-ttl-seconds")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u32>().ok());
        if !ttl.is_some_and(|t| (1..=21600).contains(&t)) {
            return text(StatusCode::BAD_REQUEST, "missing or invalid TTL");
        }
        let token = format!("tok-{:016x}", fastrand::u64(..));
        st.tokens.lock().unwrap().insert(token.clone());
        return text(StatusCode::OK, token);
    }
    if method != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "");
    }
    let token_ok = headers
        .get("x-aws-ec2-metadata-token")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| st.tokens.lock().unwrap().contains(t));
    if !token_ok {
        st.unauthorized.fetch_add(1, Ordering::SeqCst);
        return text(StatusCode::UNAUTHORIZED, "");
    }
    let Some(rest) = path.strip_prefix("/latest/meta-data/") else {
        return not_found();
    };
    let instance_id = match &st.owner {
        Owner::Fixed(id) => id.clone(),
        Owner::BySource => match owner_of(&st.ec2, caller.ip()).await {
            Ok(Some(id)) => id,
            Ok(None) => {
                eprintln!("imds: no attached ENI holds {}: 404", caller.ip());
                return not_found();
            }
            Err(e) => return text(StatusCode::BAD_GATEWAY, e),
        },
    };
    match rest {
        "instance-id" => return text(StatusCode::OK, instance_id),
        "placement/region" => return text(StatusCode::OK, REGION),
        "instance-type" => {
            return match &st.owner {
                Owner::Fixed(_) => text(StatusCode::OK, INSTANCE_TYPE),
                Owner::BySource => match instance_type(&st.ec2, &instance_id).await {
                    Ok(t) => text(StatusCode::OK, t),
                    Err(e) => text(StatusCode::BAD_GATEWAY, e),
                },
            }
        }
        "iam/security-credentials/" | "iam/security-credentials" => {
            return match &*st.role.lock().unwrap() {
                Some((role, _)) => text(StatusCode::OK, role.clone()),
                None => not_found(),
            }
        }
        _ => {}
    }
    if let Some(role) = rest.strip_prefix("iam/security-credentials/") {
        let served = st.role.lock().unwrap().clone();
        return match served {
            Some((r, c)) if r == role => text(
                StatusCode::OK,
                serde_json::json!({
                    "Code": "Success",
                    "LastUpdated": "2026-01-01T00:00:00Z",
                    "Type": "AWS-HMAC",
                    "AccessKeyId": c.access_key_id(),
                    "SecretAccessKey": c.secret_access_key(),
                    "Token": c.session_token(),
                    "Expiration": "2099-01-01T00:00:00Z",
                })
                .to_string(),
            ),
            _ => not_found(),
        };
    }
    let Some(net) = rest.strip_prefix("network/interfaces/macs/") else {
        return not_found();
    };
    let enis = match st
        .ec2
        .describe_network_interfaces(&[("attachment.instance-id", &[instance_id.as_str()])])
        .await
    {
        Ok(enis) => enis,
        Err(e) => return text(StatusCode::BAD_GATEWAY, e.to_string()),
    };
    let is_primary =
        |e: &NetworkInterface| e.attachment.as_ref().and_then(|a| a.device_index) == Some(0);
    // Counts a request mentioning `mac`; false while it is still hidden.
    let visible = |e: &NetworkInterface| {
        if is_primary(e) {
            return true;
        }
        let hide = st.hide_new_for.load(Ordering::SeqCst);
        let mut views = st.views.lock().unwrap();
        let n = views.entry(e.mac_address.clone()).or_insert(0);
        *n += 1;
        if *n <= hide {
            st.hidden_hits.fetch_add(1, Ordering::SeqCst);
            return false;
        }
        drop(views);
        let hook = st.on_new.lock().unwrap().clone();
        if let Some(hook) = hook {
            if st.plugged.lock().unwrap().insert(e.mac_address.clone()) {
                let idx = e
                    .attachment
                    .as_ref()
                    .and_then(|a| a.device_index)
                    .unwrap_or(0);
                hook(&e.mac_address, idx);
            }
        }
        true
    };
    if net.is_empty() {
        let mut body = String::new();
        for e in &enis {
            if visible(e) {
                body.push_str(&format!("{}/\n", e.mac_address));
            }
        }
        return text(StatusCode::OK, body.trim_end().to_string());
    }
    let (mac, leaf) = net.split_once('/').unwrap_or((net, ""));
    let Some(eni) = enis.iter().find(|e| e.mac_address == mac) else {
        return not_found();
    };
    if !visible(eni) {
        return not_found();
    }
    let subnet = match subnet(&st.ec2, &eni.subnet_id).await {
        Ok(s) => s,
        Err(e) => return text(StatusCode::BAD_GATEWAY, e),
    };
    let Some(att) = eni.attachment.as_ref() else {
        return not_found();
    };
    let card_key = *st.card_key.lock().unwrap();
    let card = att.network_card_index.unwrap_or(0).to_string();
    let v6: Vec<String> = eni
        .ipv6_addresses_set
        .item
        .iter()
        .map(|i| i.ipv6_address.clone())
        .collect();
    let value = match leaf {
        "interface-id" => Some(eni.network_interface_id.clone()),
        "device-number" => att.device_index.map(|i| i.to_string()),
        "network-card" => (card_key == CardKey::NetworkCard).then_some(card),
        "network-card-index" => (card_key == CardKey::LegacyIndex).then_some(card),
        // Every private IPv4 address, the primary first, as EC2 lists them.
        "local-ipv4s" => {
            let mut v4: Vec<&str> = eni.private_ip_address.iter().map(String::as_str).collect();
            v4.extend(
                eni.private_ip_addresses_set
                    .item
                    .iter()
                    .map(|i| i.private_ip_address.as_str())
                    .filter(|ip| Some(*ip) != eni.private_ip_address.as_deref()),
            );
            (!v4.is_empty()).then(|| v4.join("\n"))
        }
        "subnet-id" => Some(eni.subnet_id.clone()),
        "subnet-ipv4-cidr-block" => Some(subnet.cidr_block.clone()),
        "ipv6s" => (!v6.is_empty()).then(|| v6.join("\n")),
        "subnet-ipv6-cidr-blocks" => subnet.ipv6(),
        "mac" => Some(eni.mac_address.clone()),
        "security-group-ids" => Some(eni.group_ids().join("\n")),
        _ => None,
    };
    match value {
        Some(v) => text(StatusCode::OK, v),
        None => not_found(),
    }
}

/// One Describe call's reply, decoded; an error text for a 502.
async fn describe<T: for<'de> Deserialize<'de>>(
    ec2: &Ec2Client,
    action: &str,
    params: &[(&str, &str)],
) -> Result<T, String> {
    let body = ec2
        .query()
        .call(action, &p(params))
        .await
        .map_err(|e| e.to_string())?;
    quick_xml::de::from_str(&body).map_err(|e| format!("{action}: {e}"))
}

/// Subnet `id` as moto holds it; an error text for a 502.
async fn subnet(ec2: &Ec2Client, id: &str) -> Result<Subnet, String> {
    let r: DescribeSubnetsResponse =
        describe(ec2, "DescribeSubnets", &[("SubnetId.1", id)]).await?;
    r.subnet_set
        .item
        .into_iter()
        .next()
        .ok_or_else(|| format!("no subnet {id} in moto"))
}

/// The instance whose attached ENI holds `ip` (any of its private IPv4 or
/// IPv6 addresses), from moto's listing as it is now.
async fn owner_of(ec2: &Ec2Client, ip: IpAddr) -> Result<Option<String>, String> {
    let enis = ec2
        .describe_network_interfaces(&[])
        .await
        .map_err(|e| e.to_string())?;
    // The primary IPv4, then the rest as the EC2 client reads them.
    let holds = |e: &NetworkInterface| {
        e.private_ip_address.as_deref().and_then(|a| a.parse().ok()) == Some(ip)
            || e.secondary_ips().contains(&ip)
    };
    Ok(enis
        .iter()
        .filter(|e| holds(e))
        .find_map(|e| e.attached_instance().map(str::to_string)))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DescribeInstancesResponse {
    #[serde(default)]
    reservation_set: Items<Reservation>,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Reservation {
    #[serde(default)]
    instances_set: Items<InstanceType>,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct InstanceType {
    instance_type: String,
}

/// The instance's type as moto holds it.
async fn instance_type(ec2: &Ec2Client, instance_id: &str) -> Result<String, String> {
    let r: DescribeInstancesResponse =
        describe(ec2, "DescribeInstances", &[("InstanceId.1", instance_id)]).await?;
    r.reservation_set
        .item
        .into_iter()
        .flat_map(|r| r.instances_set.item)
        .map(|i| i.instance_type)
        .next()
        .ok_or_else(|| format!("no instance {instance_id} in moto"))
}
