//! `enimd`'s configuration: one TOML file, with command-line flags
//! overriding it (see `src/bin/enimd.rs`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use enim_api::DEFAULT_SOCKET;
pub use enim_core::Mode;
use enim_provider_static::StaticEniConfig;
use serde::{Deserialize, Serialize};

pub const DEFAULT_CHECKPOINT: &str = "/var/lib/enim/checkpoint.json";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config {path}: {source}")]
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("config: {0}")]
    Invalid(String),
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Where ENIs come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum ProviderConfig {
    /// ENIs declared right here (bare metal, labs, tests).
    Static {
        /// `[[provider.enis]]`, one table per ENI.
        enis: Vec<StaticEniConfig>,
    },
    /// Baidu BCE ENIs kept warm by the pool (docs/providers.md, "Baidu BCE provider").
    Bce(Box<enim_provider_bce::BceConfig>),
    /// EC2 ENIs kept warm by the pool (docs/providers.md, "AWS provider").
    Aws(Box<enim_provider_aws::AwsConfig>),
    /// The ENIs (secondary mode: addresses) the node's NetResourceSet
    /// lists, allocated by enim-operator; no cloud credentials here.
    Cluster(Box<enim_provider_cluster::ClusterConfig>),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The API socket the plugin, `enimctl` and `enimd device-plugin`
    /// connect to; mode 0600.
    #[serde(default = "default_socket")]
    pub socket: PathBuf,
    /// A gid that may connect too (the socket is then 0660; in a pod add
    /// `CHOWN`).
    #[serde(default)]
    pub socket_group: Option<u32>,
    /// Non-root uids allowed on the socket, checked on every connection's
    /// peer credentials (root always is).
    #[serde(default)]
    pub allowed_uids: Vec<u32>,
    /// The checkpoint ([format](deploy.md#checkpoint-format-and-upgrades));
    /// the DRA claims record, the `cluster` provider's cache, BCE's id cache
    /// and the API's service CIDRs' cache (`service-cidrs.json`) default to
    /// files beside it.
    #[serde(default = "default_checkpoint")]
    pub checkpoint: PathBuf,
    /// fsync every checkpoint write (power-loss safety; a process crash is
    /// safe either way).
    #[serde(default = "yes")]
    pub checkpoint_fsync: bool,
    /// The network namespace free ENIs live in (those no pod holds).
    ///
    /// Default: enimd's own netns.
    #[serde(default)]
    pub host_netns: Option<PathBuf>,
    /// Period of the GC loop; `"0s"` turns the loop off.
    #[serde(default = "default_gc_interval", with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub gc_interval: Duration,
    /// Attachments younger than this are never collected.
    #[serde(default = "default_gc_grace", with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub gc_grace: Duration,
    /// How long a request that arrives during start-up recovery waits
    /// before it is told "try again later".
    #[serde(default = "default_startup_wait", with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub startup_wait: Duration,
    /// How long the plugin's STATUS answers "available" for an enimd that
    /// is away (killed, crash-looping, restarting; from the note it leaves
    /// beside its socket) before it says not available
    /// ([Restarts](architecture.md#restarts-what-one-costs-a-new-pod-and-what-status-says));
    /// at least 30 s (three of enimd's 10 s heartbeats). Above the
    /// kubelet's longest crash back-off (5 m), so a crash loop never turns
    /// the node NotReady; an agent gone for good does.
    #[serde(default = "default_away_bound", with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub away_bound: Duration,
    /// How long an ADD whose caller went away mid-request is kept for the
    /// runtime's retry, CHECK or DEL before GC collects it.
    #[serde(default = "default_allocation_expiry", with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub allocation_expiry: Duration,
    /// The log's format.
    #[serde(default)]
    pub log_format: LogFormat,
    /// A TCP address for `/metrics`, `/healthz` and `/readyz` (GETs of
    /// those three, nothing else), e.g. `"127.0.0.1:9464"` (`deploy/` sets
    /// that, and its probes use it). `--metrics-host`
    /// (`ENIMD_METRICS_HOST`, e.g. the node's IP from the downward API's
    /// `status.hostIP`) serves it on that address instead, at this port.
    ///
    /// Default: unset (off).
    #[serde(default)]
    pub metrics_address: Option<std::net::SocketAddr>,
    /// Kubernetes Events (README "Operations"); off by default.
    #[serde(default)]
    pub events: crate::daemon::events::EventsConfig,
    /// ENIs (by id or MAC) and addresses never handed out. The node's
    /// primary interface is always excluded as well.
    #[serde(default)]
    pub exclude: crate::support::exclusion::ExclusionConfig,
    /// How pods get their network
    /// ([secondary mode](architecture.md#secondary-mode)).
    #[serde(default)]
    pub mode: Mode,
    /// Secondary mode's knobs (used only with `mode = "secondary"`).
    #[serde(default)]
    pub secondary: crate::secondary::SecondaryConfig,
    /// Primary mode's host path (docs/architecture.md, "The host path"): a veth to the
    /// host for Services, DNS and the node; off while `service_cidrs` is
    /// empty.
    #[serde(default)]
    pub host_path: crate::primary::HostPathConfig,
    /// The instance metadata service, refused to pods by default
    /// (docs/security.md, "The instance metadata service"); namespaces listed here opt in.
    #[serde(default)]
    pub pod_metadata: crate::support::metadata::MetadataConfig,
    /// The kubelet device plugin (docs/architecture.md, "Scheduling"); off by default.
    #[serde(default)]
    pub device_plugin: crate::deviceplugin::DevicePluginConfig,
    /// The DRA driver (docs/dra.md); off by default,
    /// and never on together with the device plugin.
    #[serde(default)]
    pub dra: crate::dra::DraConfig,
    pub provider: ProviderConfig,
}

fn yes() -> bool {
    true
}
fn default_socket() -> PathBuf {
    DEFAULT_SOCKET.into()
}
fn default_checkpoint() -> PathBuf {
    DEFAULT_CHECKPOINT.into()
}
fn default_gc_interval() -> Duration {
    Duration::from_secs(10)
}
fn default_gc_grace() -> Duration {
    Duration::from_secs(30)
}
fn default_allocation_expiry() -> Duration {
    Duration::from_secs(120)
}
fn default_startup_wait() -> Duration {
    Duration::from_secs(10)
}
fn default_away_bound() -> Duration {
    Duration::from_secs(600)
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(&text).map_err(|e| match e {
            ConfigError::Parse { source, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                source,
            },
            other => other,
        })
    }

    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: PathBuf::from("<inline>"),
            source: Box::new(source),
        })?;
        let invalid = |e: &dyn std::fmt::Display| ConfigError::Invalid(e.to_string());
        config.secondary.validate().map_err(|e| invalid(&e))?;
        if let ProviderConfig::Cluster(cluster) = &config.provider {
            cluster.validate().map_err(|e| invalid(&e))?;
        }
        config.host_path.validate().map_err(|e| invalid(&e))?;
        // The note is renewed every heartbeat: a bound within two of them
        // would call a running enimd away.
        let least = enim_api::note::HEARTBEAT * 3;
        if config.away_bound < least {
            return Err(invalid(&format!(
                "away_bound ({:?}) must be at least {least:?}: enimd renews its note every {:?}",
                config.away_bound,
                enim_api::note::HEARTBEAT
            )));
        }
        config.pod_metadata.validate().map_err(|e| invalid(&e))?;
        // A prohibit route and a host path route to one prefix: the second
        // ADD step would fail with EEXIST on every pod.
        let hp = &config.host_path;
        if let Some(clash) = config.pod_metadata.blocked.iter().find(|b| {
            hp.enabled()
                && hp
                    .service_cidrs
                    .iter()
                    .chain(&hp.host_stack_cidrs)
                    .any(|c| c == *b)
        }) {
            return Err(invalid(&format!(
                "[pod_metadata] blocked {clash} is also a [host_path] prefix: a pod cannot both reach it through the host and be refused it"
            )));
        }
        config
            .dra
            .check(config.device_plugin.enabled, config.mode == Mode::Secondary)
            .map_err(|e| invalid(&e))?;
        config.events.validate().map_err(|e| invalid(&e))?;
        if config
            .host_path
            .veth_prefix
            .starts_with(&config.secondary.veth_prefix)
            || config
                .secondary
                .veth_prefix
                .starts_with(&config.host_path.veth_prefix)
        {
            return Err(invalid(&format!(
                "[host_path] veth_prefix {:?} and [secondary] veth_prefix {:?} must not be prefixes of each other: GC tells their veths apart by name",
                config.host_path.veth_prefix, config.secondary.veth_prefix
            )));
        }
        Ok(config)
    }

    /// Serves the metrics on `host` (`--metrics-host`) at
    /// `metrics_address`'s port.
    pub fn serve_metrics_on(&mut self, host: std::net::IpAddr) -> Result<(), ConfigError> {
        let Some(address) = self.metrics_address.as_mut() else {
            return Err(ConfigError::Invalid(format!(
                "--metrics-host {host} (ENIMD_METRICS_HOST) needs metrics_address in the config: \
                 the metrics are served at its port"
            )));
        };
        address.set_ip(host);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A static provider with no ENIs: the least a config must give.
    const STATIC: &str = "[provider]\ntype = \"static\"\nenis = []\n";

    /// `head` (top-level keys and sections) ahead of [`STATIC`], parsed.
    fn parse_static(head: &str) -> Result<Config, ConfigError> {
        Config::parse(&format!("{head}{STATIC}"))
    }

    /// Each of `bad`, ahead of [`STATIC`], is refused.
    fn assert_refused(bad: &[&str]) {
        for bad in bad {
            assert!(parse_static(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn minimal_static_config_gets_defaults() {
        let c = Config::parse(
            r#"
            [provider]
            type = "static"
            [[provider.enis]]
            id = "eni-1"
            mac = "02:00:00:00:00:01"
            ipv4 = "10.0.0.10/24"
            gateway4 = "10.0.0.1"
            "#,
        )
        .unwrap();
        assert_eq!(c.socket, PathBuf::from("/run/enim/enimd.sock"));
        assert_eq!(c.checkpoint, PathBuf::from("/var/lib/enim/checkpoint.json"));
        assert_eq!(c.gc_interval, Duration::from_secs(10));
        assert_eq!(c.away_bound, Duration::from_secs(600));
        assert_eq!(c.log_format, LogFormat::Text);
        let ProviderConfig::Static { enis } = &c.provider else {
            panic!("not static: {:?}", c.provider);
        };
        assert_eq!(enis[0].id, "eni-1");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        assert_refused(&[
            "sockt = \"/x\"\n",
            "gc_interval = \"soon\"\n",
            "away_bound = \"20s\"\n",
        ]);
        assert_eq!(
            parse_static("away_bound = \"30s\"\n").unwrap().away_bound,
            Duration::from_secs(30)
        );
        assert!(Config::parse("[provider]\ntype = \"nimbus\"\n").is_err());
        let err = Config::parse(
            "[provider]\ntype = \"static\"\n[[provider.enis]]\nid = \"e\"\nmac = \"zz\"\nipv4 = \"10.0.0.2/24\"\ngateway4 = \"10.0.0.1\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("MAC"), "{err}");
    }

    #[test]
    fn bce_provider_config() {
        let c = Config::parse(
            "[provider]\ntype = \"bce\"\nsecurity_group_ids = [\"g-1\"]\n\
             poll_interval = \"1s\"\n[provider.pool]\nmin_free = 2\nmax_free = 4\n",
        )
        .unwrap();
        let ProviderConfig::Bce(bce) = &c.provider else {
            panic!("not bce: {:?}", c.provider);
        };
        assert_eq!(bce.security_group_ids, ["g-1"]);
        assert_eq!(bce.poll_interval, Duration::from_secs(1));
        assert_eq!(
            (bce.pool.pre_allocate, bce.pool.watermarks().high()),
            (2, 4)
        );
        assert!(Config::parse("[provider]\ntype = \"bce\"\nregoin = \"bj\"\n").is_err());
    }

    #[test]
    fn bce_serves_secondary_mode() {
        let c = Config::parse(
            "mode = \"secondary\"\n[provider]\ntype = \"bce\"\n\
             security_group_ids = [\"g-1\"]\n",
        )
        .unwrap();
        assert_eq!(c.mode, Mode::Secondary);
        assert!(
            matches!(c.provider, ProviderConfig::Bce(_)),
            "{:?}",
            c.provider
        );
    }

    #[test]
    fn aws_provider_config() {
        let c = Config::parse(
            "[provider]\ntype = \"aws\"\nsubnet_id = \"subnet-1\"\n\
             security_group_ids = [\"sg-1\"]\n[provider.pool]\nmin_free = 2\nmax_free = 4\n",
        )
        .unwrap();
        let ProviderConfig::Aws(aws) = &c.provider else {
            panic!("not aws: {:?}", c.provider);
        };
        assert_eq!(aws.subnet_id.as_deref(), Some("subnet-1"));
        assert_eq!(aws.security_group_ids, ["sg-1"]);
        assert_eq!(aws.imds_endpoint, "http://169.254.169.254");
        assert_eq!(
            (aws.pool.pre_allocate, aws.pool.watermarks().high()),
            (2, 4)
        );
        assert!(Config::parse("[provider]\ntype = \"aws\"\nregoin = \"x\"\n").is_err());
    }

    #[test]
    fn cluster_provider_config() {
        let c = Config::parse("[provider]\ntype = \"cluster\"\n").unwrap();
        let ProviderConfig::Cluster(cluster) = &c.provider else {
            panic!("not cluster: {:?}", c.provider);
        };
        assert_eq!(cluster.node_name, None, "NODE_NAME at start");
        assert_eq!(cluster.kubeconfig, None, "in-cluster");
        assert_eq!(cluster.cache, None, "beside the checkpoint");
        assert_eq!(cluster.status_debounce, Duration::from_millis(200));
        let c = Config::parse(
            "mode = \"secondary\"\n[provider]\ntype = \"cluster\"\nnode_name = \"node-1\"\n\
             kubeconfig = \"/etc/enim/kubeconfig\"\ncache = \"/var/lib/enim/nrs.json\"\n\
             status_debounce = \"50ms\"\n",
        )
        .unwrap();
        let ProviderConfig::Cluster(cluster) = &c.provider else {
            panic!("not cluster: {:?}", c.provider);
        };
        assert_eq!(cluster.node_name.as_deref(), Some("node-1"));
        assert_eq!(
            cluster.kubeconfig,
            Some(PathBuf::from("/etc/enim/kubeconfig"))
        );
        assert_eq!(cluster.cache, Some(PathBuf::from("/var/lib/enim/nrs.json")));
        assert_eq!(cluster.status_debounce, Duration::from_millis(50));
        for (bad, says) in [
            ("node_name = \"Node_1\"\n", "not a valid Node name"),
            ("status_debounce = \"1m\"\n", "status_debounce"),
            ("nodename = \"n\"\n", "unknown field"),
        ] {
            let e = Config::parse(&format!("[provider]\ntype = \"cluster\"\n{bad}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn host_path_config() {
        let c = parse_static("").unwrap();
        assert!(!c.host_path.enabled());
        let c = parse_static(
            "[host_path]\nservice_cidrs = [\"10.96.0.0/12\", \"fd00:96::/112\"]\n\
             host_stack_cidrs = [\"169.254.20.10/32\"]\n",
        )
        .unwrap();
        assert!(c.host_path.enabled());
        assert_eq!(c.host_path.interfaces, ["eth0"]);
        assert_eq!(c.host_path.veth_prefix, "enih");
        assert!(c.host_path.masquerades());
        assert_eq!(c.host_path.nft, PathBuf::from("nft"));
        assert_eq!(c.host_path.ct_mark, 0x0020_0000);
        let c = parse_static(
            "[host_path]\nservice_cidrs = [\"10.96.0.0/12\"]\nmasquerade = false\n\
             nft = \"/usr/sbin/nft\"\nct_mark = 0x1000000\n",
        )
        .unwrap();
        assert!(!c.host_path.masquerades());
        assert_eq!(c.host_path.nft, PathBuf::from("/usr/sbin/nft"));
        assert_eq!(c.host_path.ct_mark, 0x0100_0000);
        assert_refused(&[
            "[host_path]\nservice_cidrs = [\"10.96.0.0/12\"]\nct_mark = 0x3\n",
            "[host_path]\nservice_cidrs = [\"10.96.0.0/12\"]\nct_mark = 0\n",
            "[host_path]\nservice_cidrs = [\"10.96.0.0/12\"]\nnft = \"\"\n",
            "[host_path]\nservice_cidrs = [\"10.96.0.0/12\"]\nnft = \"bin/nft\"\n",
            "[host_path]\nservice_cidrs = [\"10.96.0.0/12\"]\nmasquerade = \"yes\"\n",
            "[host_path]\nhost_stack_cidrs = [\"169.254.20.10/32\"]\n",
            "[host_path]\nservice_cidrs = [\"10.96.0.0/12\"]\nveth_prefix = \"enim\"\n",
            "[host_path]\nservice_cidrs = [\"not-a-cidr\"]\n",
            "[host_path]\nservice_cirds = []\n",
        ]);
        // One config for every node: secondary mode ignores the table (its
        // pods reach the host over their veth already), at start it says so.
        let c = parse_static(
            "mode = \"secondary\"
[host_path]
service_cidrs = [\"10.96.0.0/12\"]
",
        )
        .unwrap();
        assert!(c.host_path.enabled());
    }

    #[test]
    fn secondary_mode_config() {
        let c = parse_static("").unwrap();
        assert_eq!(c.mode, Mode::Primary);
        assert_eq!(c.secondary, crate::secondary::SecondaryConfig::default());
        let c = parse_static(
            "mode = \"secondary\"\n[secondary]\ntable_offset = 2000\n\
             rule_priority_to_pod = 100\ncooldown = \"5s\"\n",
        )
        .unwrap();
        assert_eq!(c.mode, Mode::Secondary);
        assert_eq!(c.secondary.table_offset, 2000);
        assert_eq!(c.secondary.rule_priority_to_pod, 100);
        assert_eq!(c.secondary.rule_priority_from_pod, 1536);
        assert_eq!(c.secondary.cooldown, Duration::from_secs(5));
        assert_eq!(c.secondary.veth_prefix, "enim");
        assert_refused(&[
            "mode = \"tertiary\"\n",
            "[secondary]\ntable_ofset = 1\n",
            "[secondary]\nrule_priority_to_pod = 2000\n",
            "[secondary]\ntable_offset = 200\n",
            "[secondary]\nveth_prefix = \"much-too-long\"\n",
        ]);
    }

    #[test]
    fn pod_metadata_is_refused_by_default_and_its_opt_in_is_checked() {
        let c = parse_static("").unwrap();
        assert_eq!(c.pod_metadata, Default::default());
        assert_eq!(c.pod_metadata.blocked.len(), 2);
        let c = parse_static("[pod_metadata]\nallowed_namespaces = [\"agents\"]\n").unwrap();
        assert_eq!(c.pod_metadata.allowed_namespaces, ["agents"]);
        assert_refused(&[
            "[pod_metadata]\nallowed_namespaces = [\"Not A Namespace\"]\n",
            "[pod_metadata]\nblocked = [\"0.0.0.0/0\"]\n",
            "[pod_metadata]\nunknown = 1\n",
            // Refused and routed to the host at once: every ADD would fail.
            "[host_path]\nservice_cidrs = [\"10.96.0.0/12\"]\nhost_stack_cidrs = [\"169.254.169.254/32\"]\n",
        ]);
    }

    #[test]
    fn the_metrics_host_keeps_the_configured_port_and_needs_one() {
        let mut c =
            Config::parse(&format!("metrics_address = \"127.0.0.1:9464\"\n{STATIC}")).unwrap();
        c.serve_metrics_on("10.0.3.7".parse().unwrap()).unwrap();
        assert_eq!(c.metrics_address, Some("10.0.3.7:9464".parse().unwrap()));
        c.serve_metrics_on("fd00::7".parse().unwrap()).unwrap();
        assert_eq!(c.metrics_address, Some("[fd00::7]:9464".parse().unwrap()));
        let mut off = Config::parse(STATIC).unwrap();
        let e = off
            .serve_metrics_on("10.0.3.7".parse().unwrap())
            .unwrap_err();
        assert!(e.to_string().contains("needs metrics_address"), "{e}");
    }

    #[test]
    fn a_bad_events_table_is_refused_with_its_key() {
        let e =
            Config::parse(&format!("[events]\nquarantine_check = \"0s\"\n{STATIC}")).unwrap_err();
        assert!(e.to_string().contains("quarantine_check"), "{e}");
    }
}
