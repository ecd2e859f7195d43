//! [`AwsFleetConfig`]: the operator's AWS section. No instance metadata is
//! needed: the operator need not run on EC2, so the region is given and
//! the credentials come from the config, the environment or, where the
//! operator does run on EC2, the instance role.

use std::sync::Arc;
use std::time::Duration;

use aws_credential_types::Credentials;
use enim_provider::cloud::validate_cluster_name;
use enim_provider::Secret;
use serde::{Deserialize, Serialize};

use crate::config::{check_url, Ec2ApiConfig, DEFAULT_IMDS_ENDPOINT};
use crate::credentials::{from_env, CredentialsProvider};
use crate::imds::Imds;
use crate::AwsError;

/// Every key but `region` and `cluster` has a default (what is left out
/// takes its value from [`AwsFleetConfig::default`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AwsFleetConfig {
    /// EC2 region (required).
    pub region: String,
    /// The cluster's name (required): the ENIs the operator lists, makes
    /// and deletes carry `enim.io/cluster=<it>`.
    pub cluster: String,
    /// EC2 API endpoint; default `https://ec2.<region>.amazonaws.com`.
    pub ec2_endpoint: Option<String>,
    /// Where the keys come from; default: the environment.
    pub credentials: AwsCredentialsConfig,
    /// Give each new ENI one IPv6 address (the subnet needs an IPv6 block).
    pub assign_ipv6: bool,
    /// How long a detach may take before the call fails (the operator
    /// retries later).
    #[serde(with = "humantime_serde")]
    pub detach_timeout: Duration,
    /// Retries and the operator's token buckets, one for the whole cluster.
    pub api: Ec2ApiConfig,
}

impl Default for AwsFleetConfig {
    fn default() -> Self {
        AwsFleetConfig {
            region: String::new(),
            cluster: String::new(),
            ec2_endpoint: None,
            credentials: AwsCredentialsConfig::default(),
            assign_ipv6: false,
            detach_timeout: Duration::from_secs(120),
            api: Ec2ApiConfig::default(),
        }
    }
}

/// `credentials.source` and what that source needs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "snake_case", deny_unknown_fields)]
pub enum AwsCredentialsConfig {
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and optionally
    /// `AWS_SESSION_TOKEN` (e.g. from a Kubernetes Secret).
    #[default]
    Environment,
    /// Keys written in the config. `Debug` never prints the secret.
    Static {
        access_key_id: String,
        secret_access_key: Secret,
        #[serde(default)]
        session_token: Option<Secret>,
    },
    /// The EC2 instance role through instance metadata (an operator that
    /// runs on EC2).
    InstanceRole {
        #[serde(default = "default_imds_endpoint")]
        imds_endpoint: String,
    },
}

fn default_imds_endpoint() -> String {
    DEFAULT_IMDS_ENDPOINT.into()
}

impl AwsFleetConfig {
    /// `Err` names the key and what is wrong with it.
    pub fn validate(&self) -> Result<(), String> {
        let bad = |e: String| format!("aws fleet: {e}");
        if self.region.trim().is_empty() {
            return Err(bad(
                "region must be set (the operator reads no instance metadata)".into(),
            ));
        }
        validate_cluster_name(&self.cluster).map_err(bad)?;
        if let Some(url) = &self.ec2_endpoint {
            check_url("ec2_endpoint", url).map_err(bad)?;
        }
        if self.detach_timeout.is_zero() {
            return Err(bad("detach_timeout must be above zero".into()));
        }
        self.api.validate("api.").map_err(bad)?;
        match &self.credentials {
            AwsCredentialsConfig::Environment => Ok(()),
            AwsCredentialsConfig::Static {
                access_key_id,
                secret_access_key,
                ..
            } => {
                if access_key_id.trim().is_empty() || secret_access_key.expose().trim().is_empty() {
                    return Err(bad(
                        "credentials: source \"static\" needs access_key_id and secret_access_key"
                            .into(),
                    ));
                }
                Ok(())
            }
            AwsCredentialsConfig::InstanceRole { imds_endpoint } => {
                check_url("credentials.imds_endpoint", imds_endpoint).map_err(bad)
            }
        }
    }

    /// The credentials the config names, read now (the environment's) or
    /// checked to exist (the instance role's).
    pub async fn credentials_provider(&self) -> Result<Arc<CredentialsProvider>, AwsError> {
        let provider = match &self.credentials {
            AwsCredentialsConfig::Environment => {
                let creds = from_env(|k| std::env::var(k).ok())?.ok_or_else(|| {
                    AwsError::Config(
                        "credentials: source \"environment\" but AWS_ACCESS_KEY_ID and \
                         AWS_SECRET_ACCESS_KEY are not set"
                            .into(),
                    )
                })?;
                CredentialsProvider::fixed(creds)
            }
            AwsCredentialsConfig::Static {
                access_key_id,
                secret_access_key,
                session_token,
            } => CredentialsProvider::fixed(Credentials::new(
                access_key_id,
                secret_access_key.expose(),
                session_token.as_ref().map(|t| t.expose().to_string()),
                None,
                "operator config",
            )),
            AwsCredentialsConfig::InstanceRole { imds_endpoint } => {
                let imds = Imds::new(imds_endpoint).map_err(|source| AwsError::Imds {
                    what: "instance metadata client".into(),
                    source,
                })?;
                let provider = CredentialsProvider::instance_role(Arc::new(imds));
                provider.get().await?;
                provider
            }
        };
        Ok(Arc::new(provider))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<AwsFleetConfig, String> {
        toml::from_str::<AwsFleetConfig>(text).map_err(|e| e.to_string())
    }

    #[test]
    fn minimal_and_full_configs() {
        let c = parse("region = \"eu-west-1\"\ncluster = \"prod\"").unwrap();
        assert_eq!(c.credentials, AwsCredentialsConfig::Environment);
        assert_eq!(c.api, Ec2ApiConfig::default());
        c.validate().unwrap();

        let c = parse(
            r#"
            region = "eu-west-1"
            cluster = "prod"
            ec2_endpoint = "http://127.0.0.1:5000"
            assign_ipv6 = true
            detach_timeout = "30s"
            credentials = { source = "static", access_key_id = "AKID", secret_access_key = "s3cr3t" }
            [api]
            attempts = 3
            mutating_rate = { every = "200ms", burst = 10 }
            "#,
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.api.attempts, 3);
        assert_eq!(c.detach_timeout, Duration::from_secs(30));
        assert!(!format!("{c:?}").contains("s3cr3t"));
        let c =
            parse("region = \"r\"\ncluster = \"c\"\ncredentials = { source = \"instance_role\" }")
                .unwrap();
        assert_eq!(
            c.credentials,
            AwsCredentialsConfig::InstanceRole {
                imds_endpoint: DEFAULT_IMDS_ENDPOINT.into()
            }
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        for (text, needle) in [
            ("region = \"r\"\ncluster = \"c\"\nregoin = \"x\"", "regoin"),
            ("region = \"r\"\ncluster = \"c\"\n[api]\nattempt = 1", "attempt"),
            (
                "region = \"r\"\ncluster = \"c\"\ncredentials = { source = \"static\", access_key = \"a\" }",
                "access_key",
            ),
            (
                "region = \"r\"\ncluster = \"c\"\ncredentials = { source = \"vault\" }",
                "vault",
            ),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(needle), "{needle}: {e}");
        }
        type Change = fn(&mut AwsFleetConfig);
        let cases: [(Change, &str); 7] = [
            (|c| c.region.clear(), "region must be set"),
            (|c| c.cluster.clear(), "cluster"),
            (|c| c.cluster = "a b".into(), "cluster"),
            (
                |c| c.ec2_endpoint = Some("ec2.local".into()),
                "ec2_endpoint",
            ),
            (|c| c.api.attempts = 0, "api.attempts"),
            (
                |c| c.api.describe_rate.burst = 0,
                "api.describe_rate: burst",
            ),
            (
                |c| {
                    c.credentials = AwsCredentialsConfig::Static {
                        access_key_id: "a".into(),
                        secret_access_key: "".into(),
                        session_token: None,
                    }
                },
                "secret_access_key",
            ),
        ];
        for (change, needle) in cases {
            let mut c = AwsFleetConfig {
                region: "r".into(),
                cluster: "c".into(),
                ..AwsFleetConfig::default()
            };
            c.validate().unwrap();
            change(&mut c);
            let e = c.validate().unwrap_err();
            assert!(e.contains(needle), "{needle}: {e}");
        }
    }
}
