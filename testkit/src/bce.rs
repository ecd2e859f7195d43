//! A loopback fake of the parts of BCE enim uses, written from Baidu's
//! documentation: the ENI OpenAPI (which checks the bce-auth-v1 signature of
//! every request with its own implementation and answers 403 to bad ones)
//! and the instance metadata service.
//!
//! ENIs walk available → attaching → inuse → detaching → available; each
//! transition takes `transition_polls` reads of the ENI. List results are
//! paged (at most `server_max_keys` per page). Attaching past the
//! instance's quota fails. Mutating calls without a clientToken fail, and a
//! repeated clientToken returns the first answer.
//!
//! Secondary addresses: private-IP batch add and delete (at most 10 a
//! call, up to `ips_per_eni` addresses per family per ENI, the primary
//! counted), handed out from the subnet's free host addresses (never its
//! network, broadcast or gateway address); the ENI's listing and instance
//! metadata (`fixed_ips`) show them.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

pub const AK: &str = "ak-test-0123456789";
pub const SK: &str = "sk-test-secret";
pub const INSTANCE: &str = "i-NodeAAAA";
pub const VPC: &str = "vpc-test01";
pub const SUBNET: &str = "sbn-test01";
pub const REGION: &str = "bj";
pub const PRIMARY_MAC: &str = "fa:f6:00:00:00:01";
pub const PRIMARY_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 5);
/// The subnet's gateway (its first host address): never handed out.
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 1);

#[derive(Debug, Clone)]
pub struct FakeEni {
    pub id: String,
    pub name: String,
    pub description: String,
    pub vpc_id: String,
    pub subnet_id: String,
    pub mac: String,
    pub ip: Ipv4Addr,
    pub ipv6: Option<Ipv6Addr>,
    pub status: String,
    pub instance_id: String,
    pub polls_left: u32,
    /// Metadata listings before an inuse ENI shows up there.
    pub meta_lag: u32,
    pub security_group_ids: Vec<String>,
    /// Secondary addresses (IPv4 and IPv6) added by batch add.
    pub secondary_ips: Vec<IpAddr>,
}

impl FakeEni {
    fn ipv4_count(&self) -> usize {
        1 + self.secondary_ips.iter().filter(|ip| ip.is_ipv4()).count()
    }

    fn ipv6_count(&self) -> usize {
        usize::from(self.ipv6.is_some())
            + self.secondary_ips.iter().filter(|ip| ip.is_ipv6()).count()
    }
}

#[derive(Debug, Clone)]
pub struct Logged {
    pub method: String,
    pub path: String,
    pub query: String,
    pub status: u16,
    /// When the request arrived.
    pub at: Instant,
}

/// Called with an ENI's MAC the first time metadata lists it (a test
/// plugs a device with that MAC then, as a hypervisor would), and a
/// running number of such ENIs.
pub type NewInterfaceHook = Arc<dyn Fn(&str, u32) + Send + Sync>;

pub struct World {
    pub keys: HashMap<String, String>,
    pub enis: BTreeMap<String, FakeEni>,
    /// Interfaces the instance may have, the primary included.
    pub quota_total: u32,
    /// Addresses of each family one ENI may carry, its primary included
    /// (the quota call's answer for an `eniId`).
    pub ips_per_eni: u32,
    pub transition_polls: u32,
    pub metadata_lag: u32,
    pub server_max_keys: usize,
    pub ipv6: bool,
    /// Answers to give before serving the next API requests normally.
    pub inject: VecDeque<(u16, &'static str)>,
    /// As `inject`, for the next request of one HTTP method only
    /// (`"DELETE"`, ...): the first entry for the method is used up.
    pub inject_method: Vec<(&'static str, u16, &'static str)>,
    pub log: Vec<Logged>,
    pub tokens: HashMap<String, String>,
    /// An outage of the ENI OpenAPI: every request answers 503
    /// `ServiceUnavailable` while set (metadata still answers).
    pub down: bool,
    next: u32,
    on_new: Option<NewInterfaceHook>,
    /// MACs metadata has listed, in order.
    shown: Vec<String>,
}

impl World {
    fn new() -> Self {
        World {
            keys: HashMap::from([(AK.to_string(), SK.to_string())]),
            enis: BTreeMap::new(),
            quota_total: 8,
            ips_per_eni: 8,
            transition_polls: 2,
            metadata_lag: 1,
            server_max_keys: 1000,
            ipv6: false,
            inject: VecDeque::new(),
            inject_method: Vec::new(),
            log: Vec::new(),
            tokens: HashMap::new(),
            down: false,
            next: 0,
            on_new: None,
            shown: Vec::new(),
        }
    }

    /// Adds an ENI directly (as if made through the console or by an
    /// earlier agent).
    pub fn add_eni(&mut self, name: &str, vpc: &str, instance: Option<&str>) -> String {
        self.next += 1;
        let n = self.next;
        let id = format!("eni-{n:06}");
        let attached = instance.is_some();
        self.enis.insert(
            id.clone(),
            FakeEni {
                id: id.clone(),
                name: name.to_string(),
                description: String::new(),
                vpc_id: vpc.to_string(),
                subnet_id: SUBNET.to_string(),
                mac: format!("fa:f6:00:00:{:02x}:{:02x}", n / 256, n % 256 + 16),
                ip: Ipv4Addr::new(10, 0, 1, u8::try_from(20 + n).expect("few fake ENIs")),
                ipv6: self
                    .ipv6
                    .then(|| format!("2400:da00::{:x}", 0x20 + n).parse().unwrap()),
                status: if attached { "inuse" } else { "available" }.into(),
                instance_id: instance.unwrap_or_default().to_string(),
                polls_left: 0,
                meta_lag: 0,
                security_group_ids: vec!["g-default".into()],
                secondary_ips: Vec::new(),
            },
        );
        id
    }

    /// The secondary addresses of `eni_id` (none if it is gone).
    pub fn secondaries(&self, eni_id: &str) -> Vec<IpAddr> {
        self.enis
            .get(eni_id)
            .map(|e| e.secondary_ips.clone())
            .unwrap_or_default()
    }

    fn in_use(&self) -> Vec<IpAddr> {
        let mut used = vec![IpAddr::V4(PRIMARY_IP)];
        for e in self.enis.values() {
            used.push(IpAddr::V4(e.ip));
            used.extend(e.ipv6.map(IpAddr::V6));
            used.extend(&e.secondary_ips);
        }
        used
    }

    /// A free host address of the subnet 10.0.1.0/24, from the top down:
    /// never .0 (network), .255 (broadcast) or .1 (gateway).
    fn free_ipv4(&self) -> Option<Ipv4Addr> {
        let used = self.in_use();
        (2..=254u8)
            .rev()
            .map(|h| Ipv4Addr::new(10, 0, 1, h))
            .find(|a| *a != GATEWAY && !used.contains(&IpAddr::V4(*a)))
    }

    fn free_ipv6(&self) -> Option<Ipv6Addr> {
        let used = self.in_use();
        (0x1000u16..0x2000)
            .map(|h| Ipv6Addr::new(0x2400, 0xda00, 0, 0, 0, 0, 0, h))
            .find(|a| !used.contains(&IpAddr::V6(*a)))
    }

    /// Adds an ENI with `description`, as another node (or someone by
    /// hand) may have left it.
    pub fn add_eni_described(
        &mut self,
        name: &str,
        description: &str,
        instance: Option<&str>,
    ) -> String {
        let id = self.add_eni(name, VPC, instance);
        self.enis.get_mut(&id).unwrap().description = description.to_string();
        id
    }

    pub fn ours(&self) -> Vec<&FakeEni> {
        self.enis
            .values()
            .filter(|e| e.name.starts_with(&format!("enim-{INSTANCE}-")))
            .collect()
    }

    pub fn attached_to_us(&self) -> Vec<&FakeEni> {
        self.enis
            .values()
            .filter(|e| e.instance_id == INSTANCE && e.status == "inuse")
            .collect()
    }

    pub fn count(&self, method: &str, path_prefix: &str) -> usize {
        self.log
            .iter()
            .filter(|l| l.method == method && l.path.starts_with(path_prefix))
            .count()
    }

    fn secondaries_of_us(&self) -> usize {
        self.enis
            .values()
            .filter(|e| {
                e.instance_id == INSTANCE && matches!(e.status.as_str(), "inuse" | "attaching")
            })
            .count()
    }
}

pub struct FakeCloud {
    pub api_url: String,
    pub meta_url: String,
    world: Arc<Mutex<World>>,
}

impl FakeCloud {
    pub async fn start() -> FakeCloud {
        let world = Arc::new(Mutex::new(World::new()));
        let api = Router::new()
            .fallback(api_handler)
            .with_state(world.clone());
        let meta = Router::new()
            .fallback(meta_handler)
            .with_state(world.clone());
        let api_url = serve(api).await;
        let meta_url = format!("{}/1.0/meta-data/", serve(meta).await);
        FakeCloud {
            api_url,
            meta_url,
            world,
        }
    }

    pub fn world(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap()
    }

    /// Starts (`true`) or ends an outage of the ENI OpenAPI (see
    /// [`World::down`]).
    pub fn set_down(&self, down: bool) {
        self.world().down = down;
    }

    /// See [`NewInterfaceHook`].
    pub fn on_new_interface(&self, hook: NewInterfaceHook) {
        self.world().on_new = Some(hook);
    }
}

async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    format!("http://{addr}")
}

// ---- bce-auth-v1, re-derived here from Baidu's description ----------------

fn enc(s: &str, keep_slash: bool) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        let c = b as char;
        if c.is_ascii_alphanumeric() || "-_.~".contains(c) || (keep_slash && c == '/') {
            out.push(c);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn dec(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 3 <= b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
            if let Some(v) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hmac_hex(key: &[u8], msg: &str) -> String {
    let mut m = Hmac::<Sha256>::new_from_slice(key).unwrap();
    m.update(msg.as_bytes());
    m.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn query_pairs(raw: &str) -> Vec<(String, String)> {
    raw.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (dec(k), dec(v)),
            None => (dec(p), String::new()),
        })
        .collect()
}

/// A refusal: HTTP status, BCE error code, message.
type Fail = (u16, &'static str, String);

fn fail(status: u16, code: &'static str, message: &str) -> Fail {
    (status, code, message.to_string())
}

fn verify(
    world: &World,
    method: &Method,
    path: &str,
    query: &str,
    headers: &HeaderMap,
) -> Result<(), Fail> {
    let deny = |code, msg: String| Err((403, code, msg));
    let Some(auth) = headers.get("authorization").and_then(|v| v.to_str().ok()) else {
        return deny("AccessDenied", "no Authorization header".into());
    };
    let parts: Vec<&str> = auth.splitn(6, '/').collect();
    if parts.len() != 6 || parts[0] != "bce-auth-v1" {
        return deny("InvalidHTTPAuthHeader", format!("bad auth string {auth:?}"));
    }
    let (ak, ts, exp, signed, sig) = (parts[1], parts[2], parts[3], parts[4], parts[5]);
    let Some(sk) = world.keys.get(ak) else {
        return deny("InvalidAccessKeyId", format!("unknown access key {ak}"));
    };
    let names: Vec<&str> = signed.split(';').collect();
    if !names.contains(&"host") || !names.contains(&"x-bce-date") {
        return deny(
            "AccessDenied",
            format!("host and x-bce-date must be signed, got {signed:?}"),
        );
    }
    let date = headers
        .get("x-bce-date")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if date != ts {
        return deny(
            "AccessDenied",
            "x-bce-date differs from the auth string".into(),
        );
    }
    let (Some(t), Ok(exp)) = (
        enim_provider_bce::auth::parse_timestamp(ts),
        exp.parse::<u64>(),
    ) else {
        return deny(
            "InvalidHTTPAuthHeader",
            "bad timestamp or expiration".into(),
        );
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    if now > t + exp || t > now + 300 {
        return deny("RequestExpired", format!("signed at {ts}, valid {exp} s"));
    }
    let mut q: Vec<String> = query_pairs(query)
        .into_iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case("authorization"))
        .map(|(k, v)| format!("{}={}", enc(&k, false), enc(&v, false)))
        .collect();
    q.sort();
    let mut h = Vec::new();
    for name in &names {
        let Some(v) = headers.get(*name).and_then(|v| v.to_str().ok()) else {
            return deny("AccessDenied", format!("signed header {name} missing"));
        };
        h.push(format!("{}:{}", enc(name, false), enc(v.trim(), false)));
    }
    h.sort();
    let canonical = format!(
        "{}\n{}\n{}\n{}",
        method.as_str(),
        enc(&dec(path), true),
        q.join("&"),
        h.join("\n")
    );
    let key = hmac_hex(sk.as_bytes(), &format!("bce-auth-v1/{ak}/{ts}/{exp}"));
    if hmac_hex(key.as_bytes(), &canonical) != sig {
        return deny(
            "SignatureDoesNotMatch",
            "the request signature does not match".into(),
        );
    }
    Ok(())
}

// ---- the ENI OpenAPI -------------------------------------------------------

fn error(status: u16, code: &str, message: &str) -> Response {
    let body = json!({"code": code, "message": message, "requestId": "req-fake"});
    (
        StatusCode::from_u16(status).unwrap(),
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn eni_json(e: &FakeEni) -> Value {
    let mut v = json!({
        "eniId": e.id, "name": e.name, "description": e.description,
        "vpcId": e.vpc_id, "subnetId": e.subnet_id, "zoneName": "cn-bj-a",
        "macAddress": e.mac, "status": e.status, "instanceId": e.instance_id,
        "securityGroupIds": e.security_group_ids, "createdTime": "2024-01-01T00:00:00Z",
    });
    let ip = |a: String, primary: bool| json!({"primary": primary, "privateIpAddress": a});
    let mut v4 = vec![ip(e.ip.to_string(), true)];
    let mut v6: Vec<Value> = e.ipv6.iter().map(|a| ip(a.to_string(), false)).collect();
    for a in &e.secondary_ips {
        match a {
            IpAddr::V4(_) => v4.push(ip(a.to_string(), false)),
            IpAddr::V6(_) => v6.push(ip(a.to_string(), false)),
        }
    }
    v["privateIpSet"] = json!(v4);
    if !v6.is_empty() {
        v["ipv6PrivateIpSet"] = json!(v6);
    }
    v
}

/// One read of an ENI: the pending transition advances.
fn poll(e: &mut FakeEni, lag: u32) {
    match e.status.as_str() {
        "attaching" | "detaching" if e.polls_left > 0 => e.polls_left -= 1,
        "attaching" => {
            e.status = "inuse".into();
            e.meta_lag = lag;
        }
        "detaching" => {
            e.status = "available".into();
            e.instance_id.clear();
        }
        _ => {}
    }
}

async fn api_handler(State(world): State<Arc<Mutex<World>>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().unwrap_or("").to_string();
    let mut w = world.lock().unwrap();
    let at = Instant::now();
    let by_method = w
        .inject_method
        .iter()
        .position(|(m, _, _)| *m == parts.method.as_str());
    let resp = match verify(&w, &parts.method, &path, &query, &parts.headers) {
        _ if w.down => error(
            503,
            "ServiceUnavailable",
            "the service is down (test outage)",
        ),
        Err((status, code, msg)) => error(status, code, &msg),
        Ok(()) => match (w.inject.pop_front(), by_method) {
            (Some((status, code)), _) => error(status, code, "injected"),
            (None, Some(i)) => {
                let (_, status, code) = w.inject_method.remove(i);
                error(status, code, "injected")
            }
            (None, None) => route(&mut w, &parts.method, &path, &query, &body),
        },
    };
    w.log.push(Logged {
        method: parts.method.to_string(),
        path,
        query,
        status: resp.status().as_u16(),
        at,
    });
    resp
}

fn route(w: &mut World, method: &Method, path: &str, query: &str, body: &[u8]) -> Response {
    let params: HashMap<String, String> = query_pairs(query).into_iter().collect();
    let token = params.get("clientToken").filter(|t| !t.is_empty()).cloned();
    let json_body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let mutating = *method != Method::GET;
    if mutating && token.is_none() {
        return error(
            400,
            "MissingClientToken",
            "mutating calls need a clientToken",
        );
    }
    // A replayed token gets the first answer.
    let token_key = token.map(|t| format!("{method} {path} {t}"));
    if let Some(first) = token_key.as_ref().and_then(|k| w.tokens.get(k)) {
        return (StatusCode::OK, first.clone()).into_response();
    }
    let resp: Result<String, Fail> = match (method.clone(), segments.as_slice()) {
        (Method::GET, ["v1", "eni", "quota"]) => {
            match (params.get("eniId"), params.get("instanceId")) {
                (Some(id), _) => match w.enis.get(id) {
                    Some(e) => {
                        let used = u32::try_from(e.ipv4_count()).expect("few addresses");
                        Ok(json!({"totalQuantity": w.ips_per_eni,
                              "availableQuantity": w.ips_per_eni.saturating_sub(used)})
                        .to_string())
                    }
                    None => Err(fail(404, "EniNotFound", "no such ENI")),
                },
                (None, Some(_)) => {
                    let used = u32::try_from(w.secondaries_of_us()).expect("few fake ENIs");
                    Ok(json!({"totalQuantity": w.quota_total,
                          "availableQuantity": w.quota_total.saturating_sub(used + 1)})
                    .to_string())
                }
                (None, None) => Err(fail(400, "MissingParameter", "eniId or instanceId")),
            }
        }
        (Method::POST, ["v1", "eni", id, "privateIp", "batchAdd"]) => batch_add(w, id, &json_body),
        (Method::POST, ["v1", "eni", id, "privateIp", "batchDel"]) => batch_del(w, id, &json_body),
        (Method::GET, ["v1", "eni"]) => list(w, &params),
        (Method::GET, ["v1", "eni", id]) => {
            let lag = w.metadata_lag;
            match w.enis.get_mut(*id) {
                Some(e) => {
                    poll(e, lag);
                    Ok(eni_json(e).to_string())
                }
                None => Err(fail(404, "EniNotFound", "no such ENI")),
            }
        }
        (Method::POST, ["v1", "eni"]) => create(w, &json_body),
        (Method::PUT, ["v1", "eni", id]) if params.contains_key("attach") => {
            attach(w, id, &json_body)
        }
        (Method::PUT, ["v1", "eni", id]) if params.contains_key("detach") => {
            detach(w, id, &json_body)
        }
        (Method::DELETE, ["v1", "eni", id]) => match w.enis.get(*id) {
            None => Err(fail(404, "EniNotFound", "no such ENI")),
            Some(e) if e.status != "available" => Err(fail(
                409,
                "EniStatusConflict",
                &format!("ENI is {}", e.status),
            )),
            Some(_) => {
                w.enis.remove(*id);
                Ok(String::new())
            }
        },
        _ => Err(fail(404, "NoSuchAPI", "not part of the fake")),
    };
    match resp {
        Ok(body) => {
            if let Some(k) = token_key {
                w.tokens.insert(k, body.clone());
            }
            (StatusCode::OK, [("content-type", "application/json")], body).into_response()
        }
        Err((status, code, msg)) => error(status, code, &msg),
    }
}

fn list(w: &mut World, params: &HashMap<String, String>) -> Result<String, Fail> {
    let Some(vpc) = params.get("vpcId") else {
        return Err(fail(400, "MissingParameter", "vpcId is required"));
    };
    let instance = params.get("instanceId");
    let max_keys = params
        .get("maxKeys")
        .and_then(|m| m.parse::<usize>().ok())
        .unwrap_or(1000)
        .min(w.server_max_keys)
        .max(1);
    let matching: Vec<&FakeEni> = w
        .enis
        .values()
        .filter(|e| &e.vpc_id == vpc && instance.is_none_or(|i| &e.instance_id == i))
        .filter(|e| params.get("marker").is_none_or(|m| &e.id >= m))
        .collect();
    let page: Vec<Value> = matching
        .iter()
        .take(max_keys)
        .map(|e| eni_json(e))
        .collect();
    let truncated = matching.len() > max_keys;
    let mut v = json!({"enis": page, "isTruncated": truncated, "maxKeys": max_keys,
                       "marker": params.get("marker").cloned().unwrap_or_default()});
    if truncated {
        v["nextMarker"] = json!(matching[max_keys].id);
    }
    Ok(v.to_string())
}

fn create(w: &mut World, body: &Value) -> Result<String, Fail> {
    let name = body["name"].as_str().unwrap_or("");
    if name.is_empty() || !name.starts_with(|c: char| c.is_ascii_alphabetic()) || name.len() > 65 {
        return Err(fail(
            400,
            "InvalidName",
            "name must start with a letter, 1-65 chars",
        ));
    }
    if body["description"].as_str().unwrap_or("").chars().count() > 200 {
        return Err(fail(
            400,
            "InvalidDescription",
            "description must be at most 200 characters",
        ));
    }
    if body["subnetId"].as_str() != Some(SUBNET) {
        return Err(fail(400, "SubnetNotFound", "unknown subnet"));
    }
    let ips = body["privateIpSet"].as_array().cloned().unwrap_or_default();
    if ips.iter().filter(|ip| ip["primary"] == json!(true)).count() != 1 {
        return Err(fail(400, "InvalidPrivateIpSet", "exactly one primary IP"));
    }
    let id = w.add_eni(name, VPC, None);
    let e = w.enis.get_mut(&id).unwrap();
    e.description = body["description"].as_str().unwrap_or("").to_string();
    e.security_group_ids = body["securityGroupIds"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    Ok(json!({"eniId": id}).to_string())
}

fn attach(w: &mut World, id: &str, body: &Value) -> Result<String, Fail> {
    let Some(instance) = body["instanceId"].as_str() else {
        return Err(fail(400, "MissingParameter", "instanceId"));
    };
    let polls = w.transition_polls;
    let used = u32::try_from(w.secondaries_of_us()).expect("few fake ENIs");
    let quota = w.quota_total;
    let Some(e) = w.enis.get_mut(id) else {
        return Err(fail(404, "EniNotFound", "no such ENI"));
    };
    if e.status != "available" {
        return Err(fail(
            409,
            "EniStatusConflict",
            &format!("ENI is {}", e.status),
        ));
    }
    if instance == INSTANCE && used + 1 + 1 > quota {
        return Err(fail(
            400,
            "EniQuotaExceeded",
            "the instance cannot take more ENIs",
        ));
    }
    e.status = "attaching".into();
    e.instance_id = instance.to_string();
    e.polls_left = polls;
    Ok(String::new())
}

fn batch_add(w: &mut World, id: &str, body: &Value) -> Result<String, Fail> {
    let ipv6 = body["isIpv6"].as_bool().unwrap_or(false);
    let count = body["privateIpAddressCount"].as_u64().unwrap_or(0);
    if body.get("privateIpAddresses").is_some() {
        return Err(fail(400, "NotInFake", "the fake assigns by count only"));
    }
    let Ok(count @ 1..=10) = usize::try_from(count) else {
        return Err(fail(
            400,
            "InvalidParameter",
            "privateIpAddressCount must be 1 to 10",
        ));
    };
    if ipv6 && !w.ipv6 {
        return Err(fail(
            400,
            "SubnetIpv6NotEnabled",
            "the subnet has no IPv6 block",
        ));
    }
    let quota = w.ips_per_eni as usize;
    let Some(e) = w.enis.get(id) else {
        return Err(fail(404, "EniNotFound", "no such ENI"));
    };
    let have = if ipv6 { e.ipv6_count() } else { e.ipv4_count() };
    if have + count > quota {
        return Err(fail(
            400,
            "PrivateIpQuotaExceeded",
            &format!("the ENI has {have} of {quota} addresses"),
        ));
    }
    let mut added = Vec::new();
    for _ in 0..count {
        let next = if ipv6 {
            w.free_ipv6().map(IpAddr::V6)
        } else {
            w.free_ipv4().map(IpAddr::V4)
        };
        let Some(ip) = next else {
            return Err(fail(400, "SubnetIpExhausted", "the subnet is full"));
        };
        w.enis.get_mut(id).unwrap().secondary_ips.push(ip);
        added.push(ip.to_string());
    }
    Ok(json!({"privateIpAddresses": added}).to_string())
}

fn batch_del(w: &mut World, id: &str, body: &Value) -> Result<String, Fail> {
    let ips: Vec<String> = body["privateIpAddresses"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    if ips.is_empty() || ips.len() > 10 {
        return Err(fail(
            400,
            "InvalidParameter",
            "privateIpAddresses must list 1 to 10 addresses",
        ));
    }
    let Some(e) = w.enis.get_mut(id) else {
        return Err(fail(404, "EniNotFound", "no such ENI"));
    };
    let mut parsed = Vec::new();
    for raw in &ips {
        let ip: Option<IpAddr> = raw.parse().ok();
        match ip {
            Some(IpAddr::V4(a)) if a == e.ip => {
                return Err(fail(400, "PrimaryIpCannotDelete", "the primary IP stays"))
            }
            Some(ip) if e.secondary_ips.contains(&ip) => parsed.push(ip),
            _ => {
                return Err(fail(
                    400,
                    "PrivateIpNotOnEni",
                    &format!("{raw} is not a secondary IP of the ENI"),
                ))
            }
        }
    }
    e.secondary_ips.retain(|ip| !parsed.contains(ip));
    Ok(String::new())
}

fn detach(w: &mut World, id: &str, body: &Value) -> Result<String, Fail> {
    let polls = w.transition_polls;
    let Some(e) = w.enis.get_mut(id) else {
        return Err(fail(404, "EniNotFound", "no such ENI"));
    };
    if e.status != "inuse" || Some(e.instance_id.as_str()) != body["instanceId"].as_str() {
        return Err(fail(
            409,
            "EniStatusConflict",
            &format!("ENI is {}", e.status),
        ));
    }
    e.status = "detaching".into();
    e.polls_left = polls;
    Ok(String::new())
}

// ---- instance metadata -----------------------------------------------------

async fn meta_handler(State(world): State<Arc<Mutex<World>>>, req: Request) -> Response {
    let Some(path) = req.uri().path().strip_prefix("/1.0/meta-data/") else {
        return (StatusCode::NOT_FOUND, "").into_response();
    };
    let path = path.trim_end_matches('/').to_string();
    let mut w = world.lock().unwrap();
    let text = |s: String| (StatusCode::OK, Body::from(s)).into_response();
    match path.as_str() {
        "instance-shortid" => return text(INSTANCE.into()),
        "region" => return text(REGION.into()),
        "vpc-id" => return text(VPC.into()),
        "subnet-id" => return text(SUBNET.into()),
        "local-ipv4" => return text(PRIMARY_IP.to_string()),
        "network/interfaces/macs" => {
            let mut lines = vec![format!("{PRIMARY_MAC}/")];
            let mut new = Vec::new();
            for e in w.enis.values_mut() {
                if e.instance_id == INSTANCE && e.status == "inuse" {
                    if e.meta_lag > 0 {
                        e.meta_lag -= 1;
                    } else {
                        lines.push(format!("{}/", e.mac));
                        new.push(e.mac.clone());
                    }
                }
            }
            new.retain(|m| !w.shown.contains(m));
            let first = u32::try_from(w.shown.len()).expect("few fake ENIs");
            w.shown.extend(new.iter().cloned());
            let hook = w.on_new.clone();
            drop(w);
            // Plugged before the listing that shows it is answered.
            if let Some(hook) = hook {
                for (n, mac) in (first..).zip(&new) {
                    hook(mac, n);
                }
            }
            return text(lines.join("\n") + "\n");
        }
        _ => {}
    }
    let rest: Vec<&str> = path
        .strip_prefix("network/interfaces/macs/")
        .map(|r| r.split('/').collect())
        .unwrap_or_default();
    let (ip4, ip6, secondaries) = match rest.first() {
        Some(&m) if m == PRIMARY_MAC => (PRIMARY_IP, None, Vec::new()),
        Some(&m) => match w.enis.values().find(|e| {
            e.mac == m && e.instance_id == INSTANCE && e.status == "inuse" && e.meta_lag == 0
        }) {
            Some(e) => (e.ip, e.ipv6, e.secondary_ips.clone()),
            None => return (StatusCode::NOT_FOUND, "").into_response(),
        },
        None => return (StatusCode::NOT_FOUND, "").into_response(),
    };
    match rest.as_slice() {
        [_, "fixed_ips"] => {
            let mut s = format!("{ip4}/\n");
            for a in ip6.map(IpAddr::V6).iter().chain(&secondaries) {
                s.push_str(&format!("{a}/\n"));
            }
            text(s)
        }
        [_, "fixed_ips", ip, leaf] => {
            let Ok(ip) = ip.parse::<IpAddr>() else {
                return (StatusCode::NOT_FOUND, "").into_response();
            };
            let primary = ip == IpAddr::V4(ip4);
            let known = primary || ip6.map(IpAddr::V6) == Some(ip) || secondaries.contains(&ip);
            match (*leaf, known, ip.is_ipv4()) {
                ("gateway", true, true) => text(GATEWAY.to_string()),
                ("mask", true, true) => text("255.255.255.0".into()),
                ("ip_type", true, true) if primary => text("primary".into()),
                ("gateway", true, false) => text("2400:da00::1".into()),
                ("mask", true, false) => text("64".into()),
                ("ip_type", true, _) => text("secondary".into()),
                _ => (StatusCode::NOT_FOUND, "").into_response(),
            }
        }
        _ => (StatusCode::NOT_FOUND, "").into_response(),
    }
}
