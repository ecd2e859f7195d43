//! `enim-operator`: see the crate's documentation (src/lib.rs) and
//! docs/architecture.md, "The control plane".

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use std::sync::Arc;

use enim_operator::allocator::Allocator;
use enim_operator::runtime::{self, RuntimeConfig, RuntimeError};
use enim_operator::setup;

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// enim's control plane: one NetResourceSet per node, every cloud call of
/// the cluster made here.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// The operator's TOML config: `[operator]` (policy) and `[cloud]`.
    #[arg(long, default_value = "/etc/enim/operator.toml")]
    config: PathBuf,
    /// The namespace of the leader Lease (the downward API's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "enim-system")]
    namespace: String,
    /// This replica's identity in the Lease (the downward API's pod name).
    #[arg(long, env = "POD_NAME")]
    identity: String,
    /// This replica's pod uid (the downward API's): what concerns no node
    /// (a throttled listing) is told as an Event on the pod.
    #[arg(long, env = "POD_UID")]
    pod_uid: Option<String>,
    #[arg(long, default_value = "enim-operator")]
    lease_name: String,
    /// A leader that has not renewed for this long loses the lease.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    lease_duration: Duration,
    /// The leader renews this long before its lease would expire. Half of
    /// it is the leader deadline's margin: a leader whose Lease was not
    /// renewed for the lease duration minus that stops calling the cloud.
    #[arg(long, default_value = "4s", value_parser = humantime::parse_duration)]
    lease_grace: Duration,
    /// `/healthz`, `/readyz` and `/metrics`.
    #[arg(long, default_value = "0.0.0.0:9470")]
    health_addr: SocketAddr,
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Where this replica serves the EniPolicy admission webhook (HTTPS);
    /// left out: no webhook.
    #[arg(long)]
    webhook_addr: Option<SocketAddr>,
    /// The Service in front of the replicas' webhooks: the serving
    /// certificate is made for its DNS names.
    #[arg(long, default_value = "enim-operator-webhook")]
    webhook_service: String,
    /// The Secret (in the operator's namespace) the certificates are kept in.
    #[arg(long, default_value = "enim-operator-webhook")]
    webhook_secret: String,
    /// The MutatingWebhookConfiguration whose caBundle the leader writes.
    #[arg(long, default_value = "enim-operator")]
    webhook_config: String,
}

fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a person at a terminal: `kubectl logs` and log
    // collectors would show the escape codes as text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    init_logging(args.log_format);
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("enim-operator: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Why the operator could not start, or stopped with an error.
#[derive(Debug, thiserror::Error)]
enum MainError {
    #[error(transparent)]
    Setup(#[from] setup::SetupError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

async fn run(args: Args) -> Result<(), MainError> {
    let file = setup::load(&args.config)?;
    let cloud = setup::connect(&file.cloud).await?;
    let client = kube::Client::try_default()
        .await
        .map_err(RuntimeError::Client)?;
    // The cloud's refusals of policies' claims: the allocator notes, the
    // policies' status says.
    let refusals = Arc::new(enim_operator::policy::refusals::Refusals::default());
    let rt = RuntimeConfig {
        namespace: args.namespace.clone(),
        lease_name: args.lease_name,
        identity: args.identity,
        pod_uid: args.pod_uid,
        lease_duration: args.lease_duration,
        lease_grace: args.lease_grace,
        resync_interval: file.operator.resync_interval,
        debounce: Duration::from_millis(500),
        health_addr: args.health_addr,
        webhook: args
            .webhook_addr
            .map(|addr| enim_operator::policy::WebhookSettings {
                addr,
                namespace: args.namespace.clone(),
                service: args.webhook_service,
                secret: args.webhook_secret,
                webhook_config: args.webhook_config,
                default: file.operator.policy.default,
                pools: file.operator.policy().node_pools(),
                cert_lifetime: file.operator.policy.cert_lifetime,
                refusals: refusals.clone(),
            }),
    };
    let policy = file.operator;
    runtime::run(rt, client, move |store| {
        let allocator = Allocator::new(cloud, store, policy)?.with_refusals(refusals);
        Ok(Arc::new(allocator) as Arc<dyn runtime::Resync>)
    })
    .await?;
    Ok(())
}
