//! The simulator's configuration: which moto instance each node namespace
//! plays, the VPC namespace, per-subnet MTUs, the cloud's latencies and how
//! moto is reached. The binary reads it from TOML; tests build it in code.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use aws_credential_types::Credentials;
use enim_provider_aws::client::{Ec2Client, RetryPolicy};
use enim_provider_aws::credentials::CredentialsProvider;
use serde::Deserialize;

/// EC2 gives no MTU; jumbo frames are what a VPC carries.
pub const DEFAULT_MTU: u32 = 9001;
/// Often enough to follow moto "within about a second".
pub const DEFAULT_POLL: Duration = Duration::from_millis(200);

#[derive(Debug, Clone, Deserialize)]
pub struct VpcConfig {
    /// The namespace that plays the VPC router. The rig makes it (and
    /// removes it); the simulator only configures it.
    pub vpc_netns: PathBuf,
    /// The nodes: `[[node]]` tables in TOML.
    #[serde(rename = "node", default)]
    pub nodes: Vec<NodeConfig>,
    /// MTU by subnet id, for the ENI's both ends; others get `default_mtu`.
    #[serde(default)]
    pub subnet_mtu: HashMap<String, u32>,
    #[serde(default = "default_mtu")]
    pub default_mtu: u32,
    /// How often moto is listed.
    #[serde(default = "default_poll_ms")]
    pub poll_ms: u64,
    /// How long an attachment stays invisible to the node (the cloud's
    /// attach latency), counted from the first listing that shows it.
    #[serde(default)]
    pub attach_delay_ms: u64,
    /// Likewise for a detach: the device lingers this long.
    #[serde(default)]
    pub detach_delay_ms: u64,
    /// Serve instance metadata at 169.254.169.254:80 in the VPC namespace.
    #[serde(default = "yes")]
    pub metadata: bool,
}

/// One node: a moto instance and the namespace that plays it.
#[derive(Debug, Clone, Deserialize)]
pub struct NodeConfig {
    pub instance_id: String,
    /// The node's network namespace (e.g. `/run/netns/node1`).
    pub netns: PathBuf,
    /// What to do with the instance's primary ENI (device index 0).
    #[serde(default)]
    pub primary: PrimaryMode,
}

/// The primary ENI (device index 0) is the node's own uplink in a cloud.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PrimaryMode {
    /// Not plugged: the rig gives the node an uplink of its own.
    #[default]
    Skip,
    /// Plugged as `eth0` like any ENI, left down and unaddressed.
    Plug,
    /// Plugged as `eth0`, up, with moto's primary IPv4 (subnet prefix) and
    /// its IPv6 addresses (/128), as DHCP would configure it. Routes are
    /// the rig's to add (e.g. `default via <gateway> dev eth0`).
    Address,
}

impl VpcConfig {
    /// A configuration with the defaults and no nodes.
    pub fn new(vpc_netns: PathBuf) -> VpcConfig {
        VpcConfig {
            vpc_netns,
            nodes: Vec::new(),
            subnet_mtu: HashMap::new(),
            default_mtu: DEFAULT_MTU,
            poll_ms: default_poll_ms(),
            attach_delay_ms: 0,
            detach_delay_ms: 0,
            metadata: true,
        }
    }

    pub fn mtu(&self, subnet_id: &str) -> u32 {
        self.subnet_mtu
            .get(subnet_id)
            .copied()
            .unwrap_or(self.default_mtu)
    }

    pub fn poll(&self) -> Duration {
        Duration::from_millis(self.poll_ms)
    }

    pub fn attach_delay(&self) -> Duration {
        Duration::from_millis(self.attach_delay_ms)
    }

    pub fn detach_delay(&self) -> Duration {
        Duration::from_millis(self.detach_delay_ms)
    }
}

/// How the simulator reaches moto: it lists every ENI, so these should be
/// credentials allowed `ec2:Describe*`.
#[derive(Debug, Clone, Deserialize)]
pub struct Ec2Access {
    pub endpoint: String,
    #[serde(default = "default_region")]
    pub region: String,
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl Ec2Access {
    pub fn new(endpoint: &str, region: &str, credentials: &Credentials) -> Ec2Access {
        Ec2Access {
            endpoint: endpoint.to_string(),
            region: region.to_string(),
            access_key_id: credentials.access_key_id().to_string(),
            secret_access_key: credentials.secret_access_key().to_string(),
        }
    }

    /// A new client (each user gets its own: [`Ec2Client`] is not `Clone`).
    pub fn client(&self) -> Result<Ec2Client, enim_provider_aws::client::Ec2Error> {
        let creds = Credentials::new(
            &self.access_key_id,
            &self.secret_access_key,
            None,
            None,
            "enim-vpcsim",
        );
        Ec2Client::new(
            &self.endpoint,
            &self.region,
            Arc::new(CredentialsProvider::fixed(creds)),
            RetryPolicy::default(),
        )
    }
}

fn default_mtu() -> u32 {
    DEFAULT_MTU
}

fn default_poll_ms() -> u64 {
    u64::try_from(DEFAULT_POLL.as_millis()).unwrap_or(200)
}

fn default_region() -> String {
    "us-east-1".into()
}

fn yes() -> bool {
    true
}
