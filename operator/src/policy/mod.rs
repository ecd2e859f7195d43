//! EniPolicy in the operator: which policy applies to a pod ([`select`],
//! pure) and what a pod gets when none does (the cluster default,
//! [`DefaultPolicy`], the config's `[operator.policy] default`).

use enim_core::Mode;
use serde::{Deserialize, Serialize};

pub mod admit;
pub mod certs;
pub mod claims;
pub mod keeper;
pub mod refusals;
pub mod select;
pub mod status;
pub mod steer;
pub mod webhook;

/// What a pod no EniPolicy selects gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum DefaultPolicy {
    /// Nothing: the pod keeps the network it asks for (none: the
    /// cluster's other CNI, or the node's default), only the
    /// `enim.io/policy: (default)` annotation.
    #[default]
    None,
    /// A secondary address (`enim.io/ip`).
    Secondary,
    /// A whole ENI (`enim.io/eni`).
    Primary,
}

impl DefaultPolicy {
    /// The mode the default gives, if any.
    pub fn mode(self) -> Option<Mode> {
        match self {
            DefaultPolicy::None => None,
            DefaultPolicy::Secondary => Some(Mode::Secondary),
            DefaultPolicy::Primary => Some(Mode::Primary),
        }
    }
}

/// How a replica serves the webhook (the command line's `--webhook-*`).
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    pub addr: std::net::SocketAddr,
    /// The operator's namespace: the Secret's and the Service's.
    pub namespace: String,
    /// The Service in front of the replicas: the certificate's names.
    pub service: String,
    pub secret: String,
    /// The MutatingWebhookConfiguration whose caBundle the leader writes.
    pub webhook_config: String,
    pub default: DefaultPolicy,
    /// The operator's node pools, as nodes are matched to them
    /// ([`crate::index::Policy::node_pools`]): where a secondary policy of
    /// groups or subnets steers its pods.
    pub pools: Vec<crate::index::PoolPolicy>,
    pub cert_lifetime: std::time::Duration,
    /// The cloud's refusals of policies' claims, as the allocator notes
    /// them: the policies' status says so.
    pub refusals: std::sync::Arc<refusals::Refusals>,
}

/// Why the webhook could not start.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error(transparent)]
    Keeper(#[from] keeper::KeeperError),
    #[error(transparent)]
    Cert(#[from] certs::CertError),
    #[error(transparent)]
    Webhook(#[from] webhook::WebhookError),
}

/// A replica's whole part in EniPolicy: the certificates (kept by the
/// leader, read by all), the webhook server, and while leading the
/// policies' status. Returns when `stop` turns true.
pub async fn run(
    client: kube::Client,
    settings: WebhookSettings,
    leader: tokio::sync::watch::Receiver<bool>,
    stop: tokio::sync::watch::Receiver<bool>,
    (serving, metrics): (
        prometheus_client::metrics::gauge::Gauge,
        webhook::WebhookMetrics,
    ),
) -> Result<(), PolicyError> {
    let (svc, ns) = (&settings.service, &settings.namespace);
    let keeper = keeper::Keeper {
        client: client.clone(),
        namespace: ns.clone(),
        secret: settings.secret.clone(),
        webhook_config: settings.webhook_config.clone(),
        names: vec![
            format!("{svc}.{ns}.svc"),
            format!("{svc}.{ns}.svc.cluster.local"),
        ],
        lifetime: settings.cert_lifetime,
    };
    let first = keeper.initial(&leader).await?;
    let resolver = std::sync::Arc::new(certs::CertResolver::new(&first.serving)?);
    let (view, watches) = webhook::ClusterView::watch(
        client.clone(),
        settings.default,
        settings.pools.clone().into(),
    )
    .await?;
    let listener = tokio::net::TcpListener::bind(settings.addr)
        .await
        .map_err(webhook::WebhookError::from)?;
    tracing::info!(addr = %settings.addr, "serving the EniPolicy webhook at {}", webhook::PATH);
    // Ready from here (/readyz): the certificate, the caches and the socket.
    serving.set(1);
    let period = keeper::check_period(settings.cert_lifetime);
    let keeping = tokio::spawn(keeper.run(
        resolver.clone(),
        first.serving,
        leader.clone(),
        stop.clone(),
        period,
    ));
    let judging = tokio::spawn(status::run(
        client,
        view.clone(),
        settings.refusals.clone(),
        leader,
        stop.clone(),
    ));
    let served = webhook::serve(
        listener,
        std::sync::Arc::new(resolver.server_config()),
        view,
        metrics,
        stop,
    )
    .await;
    serving.set(0);
    let _ = tokio::join!(keeping, judging);
    watches.abort();
    Ok(served?)
}
