//! Where the webhook's certificates live: a Secret in the operator's
//! namespace, so that every replica serves the same ones. Only the leader
//! writes it (the first CA and serving certificate, each renewal) and the
//! MutatingWebhookConfiguration's `caBundle`; every replica reads it and
//! installs a changed serving certificate into its resolver.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;

use super::certs::{self, CertError, CertResolver, Pem};

#[derive(Debug, thiserror::Error)]
pub enum KeeperError {
    #[error("webhook Secret {name}: {source}")]
    Api {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("webhook Secret {name}: key {key} is missing or not UTF-8")]
    Malformed { name: String, key: &'static str },
    #[error(transparent)]
    Cert(#[from] CertError),
}

/// Where the certificates are kept and who trusts them.
#[derive(Clone)]
pub struct Keeper {
    pub client: Client,
    pub namespace: String,
    pub secret: String,
    /// The MutatingWebhookConfiguration whose `caBundle` the leader writes.
    pub webhook_config: String,
    /// The names the serving certificate is for (the Service's DNS names).
    pub names: Vec<String>,
    pub lifetime: Duration,
}

/// The Secret's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub ca: Pem,
    pub serving: Pem,
    /// When the serving certificate was issued.
    pub issued: SystemTime,
}

const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const TLS_CERT: &str = "tls.crt";
const TLS_KEY: &str = "tls.key";
const ISSUED: &str = "issued";

impl Keeper {
    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn api_err(&self) -> impl Fn(kube::Error) -> KeeperError + '_ {
        |source| KeeperError::Api {
            name: self.secret.clone(),
            source,
        }
    }

    /// The Secret's certificates, `None` when it does not exist yet.
    pub async fn load(&self) -> Result<Option<(Stored, Option<String>)>, KeeperError> {
        let Some(secret) = self
            .secrets()
            .get_opt(&self.secret)
            .await
            .map_err(self.api_err())?
        else {
            return Ok(None);
        };
        let data = secret.data.unwrap_or_default();
        let get = |key: &'static str| {
            data.get(key)
                .and_then(|b| String::from_utf8(b.0.clone()).ok())
                .ok_or_else(|| KeeperError::Malformed {
                    name: self.secret.clone(),
                    key,
                })
        };
        let issued: u64 = get(ISSUED)?.parse().map_err(|_| KeeperError::Malformed {
            name: self.secret.clone(),
            key: ISSUED,
        })?;
        let stored = Stored {
            ca: Pem {
                cert: get(CA_CERT)?,
                key: get(CA_KEY)?,
            },
            serving: Pem {
                cert: get(TLS_CERT)?,
                key: get(TLS_KEY)?,
            },
            issued: UNIX_EPOCH + Duration::from_secs(issued),
        };
        Ok(Some((stored, secret.metadata.resource_version)))
    }

    fn secret_of(&self, stored: &Stored, resource_version: Option<String>) -> Secret {
        let issued = stored
            .issued
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let data: BTreeMap<String, ByteString> = [
            (CA_CERT, stored.ca.cert.clone()),
            (CA_KEY, stored.ca.key.clone()),
            (TLS_CERT, stored.serving.cert.clone()),
            (TLS_KEY, stored.serving.key.clone()),
            (ISSUED, issued.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
        .collect();
        let mut secret = Secret {
            data: Some(data),
            type_: Some("Opaque".into()),
            ..Secret::default()
        };
        secret.metadata.name = Some(self.secret.clone());
        secret.metadata.resource_version = resource_version;
        secret
    }

    /// The leader's step: makes the certificates when there are none,
    /// renews the serving one when due (the CA stays), and keeps the
    /// webhook's `caBundle` on the CA. Returns what the Secret now holds.
    pub async fn lead(&self) -> Result<Stored, KeeperError> {
        let stored = match self.load().await? {
            None => {
                let ca = certs::new_ca()?;
                let serving = certs::new_serving(&ca, &self.names, self.lifetime)?;
                let stored = Stored {
                    ca,
                    serving,
                    issued: SystemTime::now(),
                };
                match self
                    .secrets()
                    .create(&PostParams::default(), &self.secret_of(&stored, None))
                    .await
                {
                    Ok(_) => stored,
                    // Another replica, leader a moment ago, made it first.
                    Err(kube::Error::Api(e)) if e.code == 409 => {
                        return Box::pin(self.lead()).await;
                    }
                    Err(e) => return Err(self.api_err()(e)),
                }
            }
            Some((stored, version))
                if certs::renew_at(stored.issued, self.lifetime) <= SystemTime::now() =>
            {
                let renewed = Stored {
                    serving: certs::new_serving(&stored.ca, &self.names, self.lifetime)?,
                    issued: SystemTime::now(),
                    ca: stored.ca,
                };
                // The resourceVersion makes a concurrent write fail, not
                // be overwritten.
                self.secrets()
                    .replace(
                        &self.secret,
                        &PostParams::default(),
                        &self.secret_of(&renewed, version),
                    )
                    .await
                    .map_err(self.api_err())?;
                tracing::info!(secret = %self.secret, "webhook serving certificate renewed");
                renewed
            }
            Some((stored, _)) => stored,
        };
        self.write_ca_bundle(&stored.ca).await?;
        Ok(stored)
    }

    /// Sets every webhook's `caBundle` of the configuration to the CA when
    /// it differs. A configuration that does not exist (the webhook turned
    /// off) is left alone.
    async fn write_ca_bundle(&self, ca: &Pem) -> Result<(), KeeperError> {
        let api = Api::<MutatingWebhookConfiguration>::all(self.client.clone());
        let err = |source| KeeperError::Api {
            name: self.webhook_config.clone(),
            source,
        };
        let Some(config) = api.get_opt(&self.webhook_config).await.map_err(err)? else {
            return Ok(());
        };
        let bundle = ByteString(ca.cert.clone().into_bytes());
        let webhooks = config.webhooks.unwrap_or_default();
        if webhooks
            .iter()
            .all(|w| w.client_config.ca_bundle.as_ref() == Some(&bundle))
        {
            return Ok(());
        }
        let ops: Vec<serde_json::Value> = (0..webhooks.len())
            .map(|i| {
                serde_json::json!({
                    "op": "add",
                    "path": format!("/webhooks/{i}/clientConfig/caBundle"),
                    "value": bundle,
                })
            })
            .collect();
        let patch: json_patch::Patch = serde_json::from_value(ops.into()).expect("a JSON patch");
        api.patch(
            &self.webhook_config,
            &PatchParams::default(),
            &Patch::<()>::Json(patch),
        )
        .await
        .map_err(err)?;
        tracing::info!(config = %self.webhook_config, "webhook caBundle written");
        Ok(())
    }

    /// Every replica's loop: the leader keeps the Secret and caBundle,
    /// and each replica installs the Secret's serving certificate into
    /// `resolver` when it changes. Checks every `period`; returns when
    /// `stop` turns true.
    pub async fn run(
        self,
        resolver: Arc<CertResolver>,
        mut serving: Pem,
        leader: watch::Receiver<bool>,
        mut stop: watch::Receiver<bool>,
        period: Duration,
    ) {
        loop {
            let current = if *leader.borrow() {
                self.lead().await.map(Some)
            } else {
                self.load().await.map(|s| s.map(|(s, _)| s))
            };
            match current {
                Ok(Some(stored)) if stored.serving != serving => {
                    match resolver.install(&stored.serving) {
                        Ok(()) => serving = stored.serving,
                        Err(e) => tracing::warn!(error = %e, "webhook certificate not installed"),
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "webhook certificates: retried"),
            }
            tokio::select! {
                () = tokio::time::sleep(period) => {}
                _ = stop.changed() => if *stop.borrow() { return },
            }
        }
    }

    /// The certificates to start serving with: the leader makes them if
    /// need be; a follower waits for the leader's.
    pub async fn initial(&self, leader: &watch::Receiver<bool>) -> Result<Stored, KeeperError> {
        loop {
            if *leader.borrow() {
                return self.lead().await;
            }
            if let Some((stored, _)) = self.load().await? {
                return Ok(stored);
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// How often replicas look at the Secret: a tenth of the lifetime, at
/// most a minute, at least a second.
pub fn check_period(lifetime: Duration) -> Duration {
    (lifetime / 10).clamp(Duration::from_secs(1), Duration::from_secs(60))
}
