//! The VPC simulator of the test rig (not part of enim): the data plane
//! moto lacks. Every ENI moto shows attached to a configured instance
//! appears in that instance's node namespace, and goes when moto detaches
//! it, as a cloud hot-plugs:
//!
//! - the ENI is the node end of a veth pair, named `eth<device index>`,
//!   with moto's MAC and its subnet's MTU ([`VpcConfig::subnet_mtu`],
//!   default 9001), born down and unaddressed (the primary, device index
//!   0, only if its node asks: [`PrimaryMode`]);
//! - its far end sits in the one VPC namespace, named `vpc<hash>`, its
//!   alias `vpcsim <eni-id> <attachment-id>` (how a restarted simulator
//!   adopts it); it holds the subnet's gateway (first host address, /32 and
//!   /128) and answers ARP for any address the VPC routes elsewhere;
//! - the VPC namespace routes each private address moto assigned to the
//!   ENI (primary and secondary IPv4, IPv6) to that far end, forwards
//!   between them all, and has no other way out;
//! - deleting the far end deletes the ENI wherever it is, a pod's
//!   namespace included, as a detach does.
//!
//! Every `poll_ms` it lists moto (DescribeNetworkInterfaces, DescribeSubnets)
//! and reconciles; `attach_delay_ms` and `detach_delay_ms` model the
//! cloud's latencies. With `metadata` on, an IMDSv2 stand-in listens at
//! 169.254.169.254:80 in the VPC namespace and answers each caller as the
//! instance whose ENI holds the caller's source address.
//!
//! # Use from a rig (`enim-vpcsim`, built with `--features vpc`)
//!
//! ```text
//! ip netns add vpc; ip netns add node1          # the rig makes them
//! enim-vpcsim --config vpcsim.toml              # runs until SIGTERM/SIGINT
//! ```
//!
//! ```toml
//! vpc_netns = "/run/netns/vpc"
//! poll_ms = 200            # default
//! attach_delay_ms = 0      # default
//! detach_delay_ms = 0      # default
//! default_mtu = 9001       # default
//! metadata = true          # default
//! [subnet_mtu]
//! subnet-0123 = 1500
//! [moto]
//! endpoint = "http://127.0.0.1:5000"
//! region = "us-east-1"
//! access_key_id = "..."    # allowed ec2:Describe*
//! secret_access_key = "..."
//! [[node]]
//! instance_id = "i-0123"
//! netns = "/run/netns/node1"
//! primary = "address"      # skip (default) | plug | address
//! ```
//!
//! With `primary = "address"` a node reaches metadata and the other nodes
//! once the rig adds a route, e.g. `ip -n node1 route add default via
//! <subnet gateway> dev eth0`. Stopping the simulator leaves every device
//! in place (the next run adopts them); deleting the VPC namespace removes
//! every ENI of every node.

mod config;
mod desired;
mod kernel;
mod reconcile;

pub use config::{Ec2Access, NodeConfig, PrimaryMode, VpcConfig, DEFAULT_MTU, DEFAULT_POLL};
pub use desired::{parse_alias, plan, Plan, Plug, Skip, ALIAS_PREFIX};
pub use kernel::{KernelError, METADATA_ADDR, ROUTE_PROTO};
pub use reconcile::{far_name, Reconciler, Tick};

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use enim_provider_aws::client::Ec2Error;
use tokio::task::JoinHandle;

use crate::moto::FakeImds;

#[derive(Debug, thiserror::Error)]
pub enum VpcError {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("EC2 client: {0}")]
    Ec2(#[from] Ec2Error),
}

/// A running simulator: its reconcile loop and metadata server, both
/// stopped on drop. The devices stay (a new simulator adopts them).
pub struct VpcSim {
    task: JoinHandle<()>,
    imds: Option<FakeImds>,
}

/// How long a restart waits for the last run's metadata socket to close.
const REBIND_WAIT: Duration = Duration::from_secs(3);

impl VpcSim {
    pub async fn start(cfg: VpcConfig, ec2: &Ec2Access) -> Result<VpcSim, VpcError> {
        let client = ec2.client()?;
        let mut reconciler = Reconciler::new(cfg.clone()).await?;
        let imds = if cfg.metadata {
            let addr = SocketAddr::from((METADATA_ADDR, 80));
            let listener = listen_retrying(&reconciler, addr).await?;
            Some(FakeImds::serve_by_source(ec2.client()?, listener))
        } else {
            None
        };
        let poll = cfg.poll();
        let task = tokio::spawn(async move {
            loop {
                let started = Instant::now();
                reconciler.poll(&client).await;
                tokio::time::sleep(poll.saturating_sub(started.elapsed())).await;
            }
        });
        Ok(VpcSim { task, imds })
    }

    /// The metadata stand-in, if serving.
    pub fn imds(&self) -> Option<&FakeImds> {
        self.imds.as_ref()
    }

    /// Stops the loop and waits until it is gone (its sockets closed).
    pub async fn stop(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
        self.imds.take();
    }
}

impl Drop for VpcSim {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Binds the metadata address, waiting a little while a previous run's
/// socket (dropped with its task) still holds it.
async fn listen_retrying(
    reconciler: &Reconciler,
    addr: SocketAddr,
) -> Result<tokio::net::TcpListener, KernelError> {
    let deadline = Instant::now() + REBIND_WAIT;
    loop {
        match kernel::listen_in(reconciler.vpc(), addr).await {
            Err(KernelError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
}
