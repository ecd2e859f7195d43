//! Where the EC2 client's credentials come from: the environment
//! (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, optional
//! `AWS_SESSION_TOKEN`), else the instance's IAM role through IMDS, cached
//! until shortly before they expire.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use tokio::sync::Mutex;

use crate::metadata::{Imds, ImdsError};

/// Role credentials are refreshed this long before they expire (AWS rotates
/// them well ahead, so the new set is already served).
const REFRESH_BEFORE: Duration = Duration::from_secs(5 * 60);

#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error(
        "no AWS credentials: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY are not set \
         and the instance has no IAM role in instance metadata"
    )]
    NoneFound,
    #[error("{0} is set but {1} is not")]
    PartialEnv(&'static str, &'static str),
    #[error("fetching the instance role's credentials: {0}")]
    Imds(#[from] ImdsError),
    #[error("instance role credentials expire at an unreadable time {0:?}")]
    BadExpiration(String),
}

/// Credentials from an environment lookup (a function so tests need not
/// touch the process environment). `None` when no key id is set.
pub fn from_env(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Option<Credentials>, CredentialsError> {
    let get = |k: &str| lookup(k).filter(|v| !v.trim().is_empty());
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
    Role {
        imds: Arc<Imds>,
        cached: Mutex<Option<Credentials>>,
    },
}

impl CredentialsProvider {
    /// Fixed credentials (the environment's, or a test's).
    pub fn fixed(creds: Credentials) -> Self {
        CredentialsProvider {
            source: Source::Static(creds),
        }
    }

    /// The instance role's credentials through IMDS.
    pub fn instance_role(imds: Arc<Imds>) -> Self {
        CredentialsProvider {
            source: Source::Role {
                imds,
                cached: Mutex::new(None),
            },
        }
    }

    /// The default chain: the process environment, then the instance role.
    /// The role is only checked for existence here; its keys are fetched on
    /// first use.
    pub async fn default_chain(imds: Arc<Imds>) -> Result<Self, CredentialsError> {
        if let Some(creds) = from_env(|k| std::env::var(k).ok())? {
            return Ok(Self::fixed(creds));
        }
        let provider = Self::instance_role(imds);
        provider.get().await?;
        Ok(provider)
    }

    /// Where the credentials come from, for messages.
    pub fn describe(&self) -> &'static str {
        match self.source {
            Source::Static(_) => "static (environment or configured) credentials",
            Source::Role { .. } => "the instance role's credentials",
        }
    }

    pub async fn get(&self) -> Result<Credentials, CredentialsError> {
        match &self.source {
            Source::Static(c) => Ok(c.clone()),
            Source::Role { imds, cached } => {
                let mut cached = cached.lock().await;
                if let Some(c) = cached.as_ref() {
                    let fresh = c
                        .expiry()
                        .is_none_or(|exp| SystemTime::now() + REFRESH_BEFORE < exp);
                    if fresh {
                        return Ok(c.clone());
                    }
                }
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
                let creds = Credentials::new(
                    role.access_key_id,
                    role.secret_access_key,
                    role.token,
                    expiry,
                    "instance-role",
                );
                *cached = Some(creds.clone());
                Ok(creds)
            }
        }
    }

    /// Drops cached role credentials (EC2 said they expired).
    pub async fn invalidate(&self) {
        if let Source::Role { cached, .. } = &self.source {
            *cached.lock().await = None;
        }
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
