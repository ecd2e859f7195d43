//! Where the EC2 client's credentials come from, in the AWS SDKs' order:
//! the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, optional
//! `AWS_SESSION_TOKEN`); a web identity token exchanged with STS (IRSA:
//! `AWS_WEB_IDENTITY_TOKEN_FILE` and `AWS_ROLE_ARN`); the container
//! credentials endpoint (EKS Pod Identity, ECS:
//! `AWS_CONTAINER_CREDENTIALS_FULL_URI` or `_RELATIVE_URI`); else the
//! instance's IAM role through IMDS. The web identity and container
//! sources are the `aws-config` crate's providers; every source but the
//! environment is cached until shortly before its credentials expire.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_config::ecs::EcsCredentialsProvider;
use aws_config::provider_config::ProviderConfig;
use aws_config::web_identity_token::{StaticConfiguration, WebIdentityTokenCredentialsProvider};
use aws_config::Region;
use aws_credential_types::provider::error::CredentialsError as SdkCredentialsError;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_credential_types::Credentials;
use aws_smithy_http_client::tls::rustls_provider::CryptoMode;
use aws_smithy_http_client::tls::{Provider, TlsContext, TrustStore};
use tokio::sync::Mutex;

use crate::metadata::{Imds, ImdsError};

/// Role credentials are refreshed this long before they expire (AWS rotates
/// them well ahead, so the new set is already served).
const REFRESH_BEFORE: Duration = Duration::from_secs(5 * 60);

/// The variables of each source, as the AWS SDKs name them.
pub const ENV_TOKEN_FILE: &str = "AWS_WEB_IDENTITY_TOKEN_FILE";
pub const ENV_ROLE_ARN: &str = "AWS_ROLE_ARN";
pub const ENV_SESSION_NAME: &str = "AWS_ROLE_SESSION_NAME";
pub const ENV_CONTAINER_FULL_URI: &str = "AWS_CONTAINER_CREDENTIALS_FULL_URI";
pub const ENV_CONTAINER_RELATIVE_URI: &str = "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI";

/// The session name STS records when none is configured.
const DEFAULT_SESSION_NAME: &str = "enim";

#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error(
        "no AWS credentials: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY are not set, \
         nor AWS_WEB_IDENTITY_TOKEN_FILE (IRSA) or AWS_CONTAINER_CREDENTIALS_FULL_URI \
         (EKS Pod Identity), and the instance has no IAM role in instance metadata"
    )]
    NoneFound,
    #[error("{0} is set but {1} is not")]
    PartialEnv(&'static str, &'static str),
    #[error("fetching the instance role's credentials: {0}")]
    Imds(#[from] ImdsError),
    #[error("instance role credentials expire at an unreadable time {0:?}")]
    BadExpiration(String),
    /// An `aws-config` provider (web identity, container) failed; `transient`
    /// when asking again later may succeed (STS or the endpoint unreachable,
    /// timed out), not when its configuration is wrong.
    #[error("{source_name} credentials: {message}")]
    Sdk {
        source_name: &'static str,
        message: String,
        transient: bool,
    },
}

impl CredentialsError {
    /// Whether a later attempt may succeed without a change of setup.
    pub fn is_transient(&self) -> bool {
        match self {
            CredentialsError::Imds(_) => true,
            CredentialsError::Sdk { transient, .. } => *transient,
            _ => false,
        }
    }
}

/// A variable `lookup` has set to something other than blanks; blank
/// counts as unset, as the AWS SDKs read their variables.
fn set_in(lookup: &impl Fn(&str) -> Option<String>, key: &str) -> Option<String> {
    lookup(key).filter(|v| !v.trim().is_empty())
}

/// The process environment, for [`set_in`].
fn process_env(key: &str) -> Option<String> {
    std::env::var(key).ok()
}

/// What a web identity (IRSA) source is given; each field left out is read
/// from its AWS variable ([`ENV_ROLE_ARN`], [`ENV_TOKEN_FILE`],
/// [`ENV_SESSION_NAME`]), as EKS's pod identity webhook sets them.
/// Also the config's `credentials = { source = "web_identity", ... }`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct WebIdentity {
    pub role_arn: Option<String>,
    pub token_file: Option<PathBuf>,
    pub session_name: Option<String>,
}

impl WebIdentity {
    /// Each field is left out (read from the environment) or not empty.
    pub fn validate(&self) -> Result<(), String> {
        let blank = |v: Option<&str>| v.is_some_and(|v| v.trim().is_empty());
        if blank(self.role_arn.as_deref())
            || blank(self.session_name.as_deref())
            || self
                .token_file
                .as_ref()
                .is_some_and(|p| p.as_os_str().is_empty())
        {
            return Err(
                "role_arn, token_file and session_name are each left out (read from the \
                 environment) or not empty"
                    .into(),
            );
        }
        Ok(())
    }

    /// The settings with the environment's values filled in; `Err` names
    /// the variable that is missing.
    fn resolve(
        &self,
        lookup: &impl Fn(&str) -> Option<String>,
    ) -> Result<StaticConfiguration, CredentialsError> {
        let get = |k: &str| set_in(lookup, k);
        let role_arn = self.role_arn.clone().or_else(|| get(ENV_ROLE_ARN));
        let token_file = self
            .token_file
            .clone()
            .or_else(|| get(ENV_TOKEN_FILE).map(PathBuf::from));
        let (role_arn, token_file) = match (role_arn, token_file) {
            (Some(r), Some(t)) => (r, t),
            (None, _) => {
                return Err(CredentialsError::Sdk {
                    source_name: SdkSource::WebIdentity.name(),
                    message: format!("no role: set {ENV_ROLE_ARN} or role_arn"),
                    transient: false,
                })
            }
            (_, None) => {
                return Err(CredentialsError::Sdk {
                    source_name: SdkSource::WebIdentity.name(),
                    message: format!("no token file: set {ENV_TOKEN_FILE} or token_file"),
                    transient: false,
                })
            }
        };
        Ok(StaticConfiguration {
            web_identity_token_file: token_file,
            role_arn,
            session_name: self
                .session_name
                .clone()
                .or_else(|| get(ENV_SESSION_NAME))
                .unwrap_or_else(|| DEFAULT_SESSION_NAME.into()),
        })
    }
}

/// Credentials from an environment lookup (a function so tests need not
/// touch the process environment). `None` when no key id is set.
pub fn from_env(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Option<Credentials>, CredentialsError> {
    let get = |k: &str| set_in(&lookup, k);
    match (get("AWS_ACCESS_KEY_ID"), get("AWS_SECRET_ACCESS_KEY")) {
        (None, None) => Ok(None),
        (Some(_), None) => Err(CredentialsError::PartialEnv(
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
        )),
        (None, Some(_)) => Err(CredentialsError::PartialEnv(
            "AWS_SECRET_ACCESS_KEY",
            "AWS_ACCESS_KEY_ID",
        )),
        (Some(id), Some(secret)) => Ok(Some(Credentials::new(
            id,
            secret,
            get("AWS_SESSION_TOKEN"),
            None,
            "environment",
        ))),
    }
}

/// Hands out current credentials for each request.
pub struct CredentialsProvider {
    source: Source,
}

enum Source {
    Static(Credentials),
    /// Credentials that expire, fetched again shortly before they do.
    Refreshed {
        fetch: Fetch,
        cached: Mutex<Option<Credentials>>,
    },
}

enum Fetch {
    InstanceRole(Arc<Imds>),
    /// One of `aws-config`'s providers.
    Sdk {
        source: SdkSource,
        provider: SharedCredentialsProvider,
    },
}

/// Which `aws-config` provider a [`Fetch::Sdk`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SdkSource {
    WebIdentity,
    Container,
}

impl SdkSource {
    /// Its name in errors.
    fn name(self) -> &'static str {
        match self {
            SdkSource::WebIdentity => "web identity",
            SdkSource::Container => "container",
        }
    }

    /// What [`CredentialsProvider::describe`] says of it.
    fn describe(self) -> &'static str {
        match self {
            SdkSource::WebIdentity => "web identity (IRSA) credentials from STS",
            SdkSource::Container => "container (EKS Pod Identity) credentials",
        }
    }
}

/// The `aws-config` settings of the providers it builds: the region (STS
/// is regional) and the process environment, which also gives the STS
/// endpoint (`AWS_ENDPOINT_URL_STS`, or `AWS_ENDPOINT_URL`).
fn provider_config(region: &str) -> Result<ProviderConfig, CredentialsError> {
    let tls = TlsContext::builder()
        .with_trust_store(bundled_roots())
        .build()
        .map_err(|e| CredentialsError::Sdk {
            source_name: "the STS client",
            message: format!("TLS setup: {e}"),
            transient: false,
        })?;
    let https = aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .tls_context(tls)
        .build_https();
    Ok(ProviderConfig::without_region()
        .with_region(Some(Region::new(region.to_string())))
        .with_http_client(https))
}

/// The Mozilla roots bundled in the binary, the same the EC2 client trusts
/// (reqwest's webpki roots), not the image's: enim's image carries no CA
/// bundle, and aws-config's client, left to look for the system's, panics
/// without one.
fn bundled_roots() -> TrustStore {
    webpki_root_certs::TLS_SERVER_ROOT_CERTS.iter().fold(
        TrustStore::empty().with_native_roots(false),
        |roots, der| {
            roots.with_pem_certificate(pem::encode(&pem::Pem::new("CERTIFICATE", der.to_vec())))
        },
    )
}

impl CredentialsProvider {
    /// Fixed credentials (the environment's, or a test's).
    pub fn fixed(creds: Credentials) -> Self {
        CredentialsProvider {
            source: Source::Static(creds),
        }
    }

    fn refreshed(fetch: Fetch) -> Self {
        CredentialsProvider {
            source: Source::Refreshed {
                fetch,
                cached: Mutex::new(None),
            },
        }
    }

    /// The instance role's credentials through IMDS.
    pub fn instance_role(imds: Arc<Imds>) -> Self {
        Self::refreshed(Fetch::InstanceRole(imds))
    }

    /// A web identity token exchanged with STS for `settings`' role (IRSA).
    pub fn web_identity(region: &str, settings: &WebIdentity) -> Result<Self, CredentialsError> {
        let config = settings.resolve(&process_env)?;
        let provider = WebIdentityTokenCredentialsProvider::builder()
            .configure(&provider_config(region)?)
            .static_configuration(config)
            .build();
        Ok(Self::refreshed(Fetch::Sdk {
            source: SdkSource::WebIdentity,
            provider: SharedCredentialsProvider::new(provider),
        }))
    }

    /// The container credentials endpoint the environment names (EKS Pod
    /// Identity, ECS task roles).
    pub fn container(region: &str) -> Result<Self, CredentialsError> {
        let provider = EcsCredentialsProvider::builder()
            .configure(&provider_config(region)?)
            .build();
        Ok(Self::refreshed(Fetch::Sdk {
            source: SdkSource::Container,
            provider: SharedCredentialsProvider::new(provider),
        }))
    }

    /// The default chain, as the AWS SDKs order it: the process
    /// environment's keys, a web identity token, the container endpoint,
    /// then the instance role. A source is taken when its variables are
    /// set, and its credentials are fetched once here, so a wrong setup
    /// fails at start with what is wrong.
    pub async fn default_chain(imds: Arc<Imds>, region: &str) -> Result<Self, CredentialsError> {
        let env = |k: &str| set_in(&process_env, k);
        if let Some(creds) = from_env(process_env)? {
            return Ok(Self::fixed(creds));
        }
        let provider = if env(ENV_TOKEN_FILE).is_some() {
            Self::web_identity(region, &WebIdentity::default())?
        } else if env(ENV_CONTAINER_FULL_URI).is_some() || env(ENV_CONTAINER_RELATIVE_URI).is_some()
        {
            Self::container(region)?
        } else {
            Self::instance_role(imds)
        };
        provider.get().await?;
        Ok(provider)
    }

    /// Where the credentials come from, for messages.
    pub fn describe(&self) -> &'static str {
        match &self.source {
            Source::Static(_) => "static (environment or configured) credentials",
            Source::Refreshed {
                fetch: Fetch::InstanceRole(_),
                ..
            } => "the instance role's credentials",
            Source::Refreshed {
                fetch: Fetch::Sdk { source, .. },
                ..
            } => source.describe(),
        }
    }

    pub async fn get(&self) -> Result<Credentials, CredentialsError> {
        let (fetch, cached) = match &self.source {
            Source::Static(c) => return Ok(c.clone()),
            Source::Refreshed { fetch, cached } => (fetch, cached),
        };
        let mut cached = cached.lock().await;
        if let Some(c) = cached.as_ref() {
            let fresh = c
                .expiry()
                .is_none_or(|exp| SystemTime::now() + REFRESH_BEFORE < exp);
            if fresh {
                return Ok(c.clone());
            }
        }
        let creds = match fetch {
            Fetch::InstanceRole(imds) => role_credentials(imds).await?,
            Fetch::Sdk { source, provider } => provider
                .provide_credentials()
                .await
                .map_err(|e| sdk_error(source.name(), e))?,
        };
        *cached = Some(creds.clone());
        Ok(creds)
    }

    /// Drops cached credentials (EC2 said they expired).
    pub async fn invalidate(&self) {
        if let Source::Refreshed { cached, .. } = &self.source {
            *cached.lock().await = None;
        }
    }
}

async fn role_credentials(imds: &Imds) -> Result<Credentials, CredentialsError> {
    let role = imds
        .role_credentials()
        .await?
        .ok_or(CredentialsError::NoneFound)?;
    let expiry = match role.expiration.as_deref() {
        None => None,
        Some(s) => Some(
            humantime::parse_rfc3339_weak(s)
                .map_err(|_| CredentialsError::BadExpiration(s.to_string()))?,
        ),
    };
    Ok(Credentials::new(
        role.access_key_id,
        role.secret_access_key,
        role.token,
        expiry,
        "instance-role",
    ))
}

/// An `aws-config` provider's failure, with its whole chain of causes
/// (STS's own message is in a source, not in the top-level text).
fn sdk_error(source_name: &'static str, e: SdkCredentialsError) -> CredentialsError {
    let transient = !matches!(
        e,
        SdkCredentialsError::InvalidConfiguration(_) | SdkCredentialsError::CredentialsNotLoaded(_)
    );
    CredentialsError::Sdk {
        source_name,
        message: enim_core::with_causes(&e),
        transient,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn environment_credentials() {
        assert!(from_env(env(&[])).unwrap().is_none());
        let c = from_env(env(&[
            ("AWS_ACCESS_KEY_ID", "AKIDX"),
            ("AWS_SECRET_ACCESS_KEY", "s3cr3t"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(c.access_key_id(), "AKIDX");
        assert_eq!(c.secret_access_key(), "s3cr3t");
        assert_eq!(c.session_token(), None);

        let c = from_env(env(&[
            ("AWS_ACCESS_KEY_ID", "ASIAX"),
            ("AWS_SECRET_ACCESS_KEY", "s"),
            ("AWS_SESSION_TOKEN", "tok"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(c.session_token(), Some("tok"));

        let e = from_env(env(&[("AWS_ACCESS_KEY_ID", "AKIDX")])).unwrap_err();
        assert!(
            e.to_string().contains("AWS_SECRET_ACCESS_KEY is not"),
            "{e}"
        );
        // Blank counts as unset.
        assert!(from_env(env(&[("AWS_ACCESS_KEY_ID", " ")]))
            .unwrap()
            .is_none());
    }
}
