//! The webhook's certificates: a CA of its own (the MutatingWebhookConfiguration's
//! `caBundle`) and the serving certificate it signs, renewed at two thirds
//! of its lifetime; and the rustls resolver that serves whichever is
//! current, so that a renewal needs no restart.

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::crypto::ring::sign::any_supported_type;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use time::OffsetDateTime;

/// How long the CA is valid: the serving certificates it signs are renewed
/// far more often, the caBundle seldom.
pub const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("webhook certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("webhook certificate: {what} is not valid PEM: {why}")]
    Pem { what: &'static str, why: String },
    #[error("webhook certificate: the key cannot sign: {0}")]
    Key(#[from] rustls::Error),
}

/// A certificate and its key, both PEM, as the Secret keeps them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pem {
    pub cert: String,
    pub key: String,
}

/// A new CA.
pub fn new_ca() -> Result<Pem, CertError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, "enim-operator webhook CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    (params.not_before, params.not_after) = validity(SystemTime::now(), CA_LIFETIME);
    let cert = params.self_signed(&key)?;
    Ok(Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// A serving certificate for `names` (DNS names or IP addresses), signed
/// by `ca`, valid from now for `lifetime`.
pub fn new_serving(ca: &Pem, names: &[String], lifetime: Duration) -> Result<Pem, CertError> {
    let ca_key = KeyPair::from_pem(&ca.key)?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert, ca_key)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(names.to_vec())?;
    params.distinguished_name.push(
        DnType::CommonName,
        names.first().map_or("webhook", String::as_str),
    );
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    (params.not_before, params.not_after) = validity(SystemTime::now(), lifetime);
    let cert = params.signed_by(&key, &issuer)?;
    Ok(Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// From a minute before `now` (clocks differ a little) to `now + lifetime`.
fn validity(now: SystemTime, lifetime: Duration) -> (OffsetDateTime, OffsetDateTime) {
    let now = OffsetDateTime::from(now);
    (now - Duration::from_secs(60), now + lifetime)
}

/// When a certificate issued at `issued` for `lifetime` is renewed: at two
/// thirds of its lifetime, so that a renewal that fails has a third left
/// to be retried in.
pub fn renew_at(issued: SystemTime, lifetime: Duration) -> SystemTime {
    issued + lifetime * 2 / 3
}

/// rustls' view of a PEM pair.
pub fn certified_key(pem: &Pem) -> Result<CertifiedKey, CertError> {
    let chain = CertificateDer::pem_slice_iter(pem.cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CertError::Pem {
            what: "the certificate",
            why: e.to_string(),
        })?;
    let key = PrivateKeyDer::from_pem_slice(pem.key.as_bytes()).map_err(|e| CertError::Pem {
        what: "the key",
        why: e.to_string(),
    })?;
    Ok(CertifiedKey::new(chain, any_supported_type(&key)?))
}

/// Serves the current serving certificate to every handshake; `install`
/// replaces it for the handshakes after.
#[derive(Debug)]
pub struct CertResolver {
    current: RwLock<Arc<CertifiedKey>>,
}

impl CertResolver {
    pub fn new(serving: &Pem) -> Result<CertResolver, CertError> {
        Ok(CertResolver {
            current: RwLock::new(Arc::new(certified_key(serving)?)),
        })
    }

    pub fn install(&self, serving: &Pem) -> Result<(), CertError> {
        let key = Arc::new(certified_key(serving)?);
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = key;
        Ok(())
    }

    /// The TLS server config that serves through this resolver.
    pub fn server_config(self: &Arc<Self>) -> rustls::ServerConfig {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        config
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }
}
