//! The operator's config file and what it builds: `[operator]` (the
//! policy, [`OperatorConfig`]) and `[cloud]` (where ENIs come from, one of
//! the provider crates' fleet backends).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use enim_provider::fleet::FleetCloud;
use enim_provider_aws::{AwsFleet, AwsFleetConfig};
use enim_provider_bce::{BceFleet, BceFleetConfig};
use enim_provider_static::{StaticFleet, StaticFleetConfig};
use serde::{Deserialize, Serialize};

use crate::config::OperatorConfig;

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("reading {path}: {source}", path = .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}", path = .path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: Box<toml::de::Error>,
    },
    #[error("{path}: {message}", path = .path.display())]
    Invalid { path: PathBuf, message: String },
    #[error("[cloud] {0}")]
    Cloud(String),
}

/// Where the operator's ENIs come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum FleetProviderConfig {
    /// EC2 (docs/providers.md, "AWS provider").
    Aws(Box<AwsFleetConfig>),
    /// Baidu BCE.
    Bce(Box<BceFleetConfig>),
    /// A fixed inventory per node: labs, bare metal, the e2e cluster.
    Static(StaticFleetConfig),
}

/// The whole file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct OperatorFile {
    /// The policy: `[operator]`.
    #[serde(default)]
    pub operator: OperatorConfig,
    /// Where ENIs come from: `[cloud]`.
    pub cloud: FleetProviderConfig,
}

impl OperatorFile {
    /// Parses and validates `text` (`path` names it in errors). The
    /// cloud's `cluster`, where it has one, defaults to the operator's and
    /// must equal it: the listing by tag and the leaks the reaper deletes
    /// are that cluster's.
    pub fn from_toml(path: &Path, text: &str) -> Result<OperatorFile, SetupError> {
        let mut file: OperatorFile = toml::from_str(text).map_err(|e| SetupError::Parse {
            path: path.into(),
            source: Box::new(e),
        })?;
        let invalid = |message: String| SetupError::Invalid {
            path: path.into(),
            message,
        };
        file.operator
            .validate()
            .map_err(|e| invalid(format!("[operator] {e}")))?;
        let ours = file.operator.cluster.clone();
        let cloud_cluster = match &mut file.cloud {
            FleetProviderConfig::Aws(c) => Some(&mut c.cluster),
            FleetProviderConfig::Bce(c) => Some(&mut c.cluster),
            FleetProviderConfig::Static(_) => None,
        };
        if let Some(cluster) = cloud_cluster {
            if cluster.is_empty() {
                cluster.clone_from(&ours);
            } else if *cluster != ours {
                return Err(invalid(format!(
                    "[cloud] cluster {cluster:?} differs from [operator] cluster {ours:?}"
                )));
            }
        }
        if let FleetProviderConfig::Aws(c) = &file.cloud {
            c.validate().map_err(|e| invalid(format!("[cloud] {e}")))?;
        }
        Ok(file)
    }
}

/// Reads and validates the operator's config file.
pub fn load(path: &Path) -> Result<OperatorFile, SetupError> {
    let text = std::fs::read_to_string(path).map_err(|source| SetupError::Read {
        path: path.into(),
        source,
    })?;
    OperatorFile::from_toml(path, &text)
}

/// Connects the cloud `[cloud]` names.
pub async fn connect(cloud: &FleetProviderConfig) -> Result<Arc<dyn FleetCloud>, SetupError> {
    let err = |e: String| SetupError::Cloud(e);
    Ok(match cloud {
        FleetProviderConfig::Aws(c) => {
            Arc::new(AwsFleet::connect(c).await.map_err(|e| err(e.to_string()))?)
        }
        FleetProviderConfig::Bce(c) => {
            Arc::new(BceFleet::connect(c).map_err(|e| err(e.to_string()))?)
        }
        FleetProviderConfig::Static(c) => {
            Arc::new(StaticFleet::new(c).map_err(|e| err(e.to_string()))?)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<OperatorFile, SetupError> {
        OperatorFile::from_toml(Path::new("operator.toml"), text)
    }

    /// deploy/50-operator.yaml's ConfigMap is a config this binary takes.
    #[test]
    fn the_deployed_config_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/50-operator.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        let config_map = serde_yaml::Deserializer::from_str(&text)
            .map(|d| serde_yaml::Value::deserialize(d).unwrap())
            .find(|d| d["kind"] == "ConfigMap")
            .expect("a ConfigMap in 50-operator.yaml");
        let toml = config_map["data"]["operator.toml"].as_str().unwrap();
        let file = parse(toml).unwrap();
        let FleetProviderConfig::Aws(aws) = &file.cloud else {
            panic!("deploy/ configures AWS: {:?}", file.cloud);
        };
        assert_eq!(
            aws.cluster, file.operator.cluster,
            "the cluster is filled in"
        );
    }

    /// The cloud run's pools (scripts/cluster/cloud.sh labels its nodes
    /// enim.io/pool), as a whole file: three served pools, `per-node` in none.
    #[test]
    fn a_file_with_pools_parses() {
        let text = r#"
[operator]
cluster = "enim-e2e"
mode = "primary"
subnets = ["subnet-pods"]
security_groups = ["sg-pods"]

[operator.watermarks]
pre_allocate = 1
min_allocate = 2
max_above_watermark = 2

[[operator.pools]]
name = "primary"
node_selector = { "enim.io/pool" = "primary" }
mode = "primary"

[[operator.pools]]
name = "secondary"
node_selector = { "enim.io/pool" = "secondary" }
mode = "secondary"
[operator.pools.watermarks]
pre_allocate = 4
min_allocate = 8
max_above_watermark = 8

[[operator.pools]]
name = "primary-dra"
node_selector = { "enim.io/pool" = "primary-dra" }
mode = "primary"

[cloud]
type = "aws"
region = "us-east-1"
"#;
        let policy = parse(text).unwrap().operator.policy();
        let pool_of = |value: &str| {
            let labels = [("enim.io/pool".to_string(), value.to_string())].into();
            policy
                .pool_of(&labels)
                .map(|p| (p.pool, p.mode, p.watermarks))
        };
        let top = policy.watermarks;
        assert_eq!(
            pool_of("primary"),
            Some(("primary", enim_core::Mode::Primary, top))
        );
        let (name, mode, marks) = pool_of("secondary").unwrap();
        assert_eq!((name, mode), ("secondary", enim_core::Mode::Secondary));
        assert_eq!(
            (
                marks.pre_allocate,
                marks.min_allocate,
                marks.max_above_watermark
            ),
            (4, 8, 8)
        );
        assert_eq!(
            pool_of("primary-dra"),
            Some(("primary-dra", enim_core::Mode::Primary, top))
        );
        assert_eq!(pool_of("per-node"), None);
        assert_eq!(policy.pool_of(&Default::default()), None);
    }

    #[test]
    fn a_cloud_of_another_cluster_and_unknown_keys_are_refused() {
        let other = "[operator]\ncluster = \"a\"\n[cloud]\ntype = \"aws\"\nregion = \"r\"\ncluster = \"b\"\n";
        let e = parse(other).unwrap_err().to_string();
        assert!(e.contains("differs from [operator] cluster"), "{e}");
        let typo = "[operator]\ncluster = \"a\"\nresync = \"1s\"\n[cloud]\ntype = \"static\"\nnodes = {}\n";
        let e = parse(typo).unwrap_err().to_string();
        assert!(e.contains("unknown field") && e.contains("resync"), "{e}");
        let no_cloud = "[operator]\ncluster = \"a\"\n";
        let e = parse(no_cloud).unwrap_err().to_string();
        assert!(e.contains("cloud"), "{e}");
    }
}
