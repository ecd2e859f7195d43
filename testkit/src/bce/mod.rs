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
//! ENIs can be renamed and redescribed (`modifyAttribute`), and the VPC
//! API answers for its one subnet (its blocks).
//!
//! Security groups: BCC's listing by instance (`GET /v2/securityGroup`,
//! `vpcId` required with `instanceId`, paged by `maxKeys`/`marker`)
//! answers each instance's groups as `World::instance_groups` says (an
//! instance it does not know is refused); `security_groups_answer` makes
//! it answer any text instead.
//!
//! Secondary addresses: private-IP batch add and delete (at most 10 a
//! call, up to `ips_per_eni` addresses per family per ENI, the primary
//! counted), handed out from the subnet's free host addresses (never its
//! network, broadcast or gateway address); the ENI's listing and instance
//! metadata (`fixed_ips`) show them.
//!
//! Layout: the fake's state here, the signature check in `auth`, the
//! OpenAPI's handlers in `api`, instance metadata in `meta`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use axum::Router;

mod api;
mod auth;
mod meta;

pub use auth::{AK, SK};

// The node the fake serves: its instance, and the network it sits in.
pub const INSTANCE: &str = "i-NodeAAAA";
pub const REGION: &str = "bj";
pub const VPC: &str = "vpc-test01";
/// The ENIs' subnet, 10.0.1.0/24 (the only one the fake has).
pub const SUBNET: &str = "sbn-test01";
/// The instance's own (primary) interface: in metadata, never an ENI of
/// the API.
pub const PRIMARY_MAC: &str = "fa:f6:00:00:00:01";
pub const PRIMARY_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 5);
/// The subnet's gateway (its first host address): never handed out.
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 1);
/// The security group bound to [`INSTANCE`] at start.
pub const INSTANCE_GROUP: &str = "g-node";

#[derive(Debug, Clone)]
pub struct FakeEni {
    /// `eni-NNNNNN`, numbered in creation order.
    pub id: String,
    pub name: String,
    pub description: String,
    pub vpc_id: String,
    pub subnet_id: String,
    pub mac: String,
    /// The primary IPv4 address.
    pub ip: Ipv4Addr,
    /// The primary IPv6 address (when the fake's subnet has IPv6).
    pub ipv6: Option<Ipv6Addr>,
    /// `available`, `attaching`, `inuse` or `detaching`.
    pub status: String,
    /// The instance it is attached or attaching to; empty when available.
    pub instance_id: String,
    pub security_group_ids: Vec<String>,
    /// Secondary addresses (IPv4 and IPv6) added by batch add.
    pub secondary_ips: Vec<IpAddr>,
    pending: Pending,
}

/// How far an ENI's transition has come: the fake counts reads, not time.
#[derive(Debug, Clone, Default)]
struct Pending {
    /// Reads of the ENI before an attach or detach completes.
    polls_left: u32,
    /// Metadata listings before an inuse ENI shows up there.
    meta_lag: u32,
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
    /// Instance to the ids of the security groups bound to it (all in
    /// [`VPC`]), in the listing's order. At start: [`INSTANCE`] with
    /// [`INSTANCE_GROUP`].
    pub instance_groups: HashMap<String, Vec<String>>,
    /// While set, the security group listing answers this text, HTTP 200,
    /// whatever it is asked.
    pub security_groups_answer: Option<String>,
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
            instance_groups: HashMap::from([(
                INSTANCE.to_string(),
                vec![INSTANCE_GROUP.to_string()],
            )]),
            security_groups_answer: None,
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
                security_group_ids: vec!["g-default".into()],
                secondary_ips: Vec::new(),
                pending: Pending::default(),
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
            .fallback(api::handler)
            .with_state(world.clone());
        let meta = Router::new()
            .fallback(meta::handler)
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

    /// When each `method` request arrived, counted from `t0`, in order
    /// (for [`crate::cloud::assert_paced`]).
    pub fn arrivals(&self, method: &str, t0: Instant) -> Vec<std::time::Duration> {
        let mut at: Vec<_> = self
            .world()
            .log
            .iter()
            .filter(|l| l.method == method)
            .map(|l| l.at - t0)
            .collect();
        at.sort();
        at
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
