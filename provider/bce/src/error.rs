//! [`BceError`]: what the BCE provider's steps fail with, and how the pool
//! and the operator read it ([`ProviderError`]): an API call as
//! [`ApiError`] says; instance metadata, a slow attach or detach and an
//! answer enim cannot read as worth asking again (`Unavailable`); an ENI
//! that is not the caller's, or a request or config BCE cannot take, as
//! final (`Config`).

use std::time::Duration;

use enim_core::ProviderError;
use enim_provider::cloud::TAG_CLUSTER;

use crate::auth::NoCredentials;
use crate::client::ApiError;
use crate::metadata::MetadataError;

#[derive(Debug, thiserror::Error)]
pub enum BceError {
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    #[error("bce: metadata client: {0}")]
    MetadataClient(#[source] reqwest::Error),
    /// The API client cannot be made for the endpoint.
    #[error("bce: {0}")]
    Endpoint(#[source] ApiError),
    #[error(transparent)]
    Credentials(#[from] NoCredentials),
    /// A config value, or a request, BCE cannot take; the message says
    /// which.
    #[error("{0}")]
    Config(String),
    #[error("ENI {0} does not exist")]
    Missing(String),
    #[error("ENI {eni_id} is held by {holder}, not by {requester}")]
    OwnedByOther {
        eni_id: String,
        holder: String,
        requester: String,
    },
    #[error(
        "ENI {eni_id} ({name:?}) was not created by enim for instance {instance}; not attaching it"
    )]
    NotOursToAttach {
        eni_id: String,
        name: String,
        instance: String,
    },
    #[error(
        "refusing to delete ENI {eni_id} ({name:?}): not created by enim for instance {instance}"
    )]
    NotOursToDelete {
        eni_id: String,
        name: String,
        instance: String,
    },
    #[error("ENI {eni_id} ({name:?}) is not marked {TAG_CLUSTER}={cluster}: not this cluster's")]
    NotInCluster {
        eni_id: String,
        name: String,
        cluster: String,
    },
    #[error("ENI {0} is the instance's primary interface; enim never changes its addresses")]
    Primary(String),
    #[error("ENI {eni_id}: still {last} after {limit:?} waiting for it to {what}")]
    StateTimeout {
        eni_id: String,
        what: &'static str,
        last: String,
        limit: Duration,
    },
    #[error("ENI {eni_id}: BCE reports {what}")]
    BadReport { eni_id: String, what: String },
    /// No security groups are configured and BCE lists none bound to the
    /// instance: a new ENI would get BCE's default group.
    #[error(
        "instance {instance}: no security groups configured for new ENIs, and BCE lists none \
         bound to the instance in VPC {vpc_id}; refusing to create one with BCE's default group \
         (configure the groups, or bind one to the instance)"
    )]
    NoSecurityGroups { instance: String, vpc_id: String },
    #[error("subnet {subnet}: {value:?} is not a block")]
    BadSubnet { subnet: String, value: String },
    /// Every device index is taken by an ENI of the instance or a create
    /// in flight.
    #[error("no free device index: {total} in use")]
    NoDeviceIndex { total: usize },
}

impl BceError {
    /// Whether asking again may help: what [`ProviderError::is_transient`]
    /// says of it.
    pub fn is_transient(&self) -> bool {
        match self {
            BceError::Api(e) => e.is_transient(),
            BceError::Metadata(_) | BceError::StateTimeout { .. } | BceError::BadReport { .. } => {
                true
            }
            _ => false,
        }
    }
}

impl From<BceError> for ProviderError {
    fn from(e: BceError) -> Self {
        let msg = e.to_string();
        match e {
            BceError::Api(e) => e.into(),
            BceError::Missing(eni_id) => ProviderError::UnknownEni(eni_id),
            BceError::OwnedByOther {
                eni_id,
                holder,
                requester,
            } => ProviderError::OwnedByOther {
                eni_id,
                holder,
                requester,
            },
            BceError::NoDeviceIndex { total } => ProviderError::Exhausted { total },
            // Metadata is local and eventually right; a bad answer now is
            // still worth asking again later, as is a slow ENI.
            BceError::Metadata(_) | BceError::StateTimeout { .. } | BceError::BadReport { .. } => {
                ProviderError::Unavailable(msg)
            }
            BceError::MetadataClient(_)
            | BceError::Endpoint(_)
            | BceError::Credentials(_)
            | BceError::Config(_)
            | BceError::NotOursToAttach { .. }
            | BceError::NotOursToDelete { .. }
            | BceError::NotInCluster { .. }
            | BceError::Primary(_)
            | BceError::NoSecurityGroups { .. }
            | BceError::BadSubnet { .. } => ProviderError::Config(msg),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_transient_agrees_with_the_provider_error() {
        let cases = [
            BceError::Missing("eni-1".into()),
            BceError::Primary("eni-1".into()),
            BceError::Config("bce: x".into()),
            BceError::NoDeviceIndex { total: 255 },
            BceError::NoSecurityGroups {
                instance: "i-1".into(),
                vpc_id: "vpc-1".into(),
            },
            BceError::BadReport {
                eni_id: "eni-1".into(),
                what: "no primary IPv4".into(),
            },
            BceError::StateTimeout {
                eni_id: "eni-1".into(),
                what: "be attached",
                last: "attaching".into(),
                limit: Duration::from_secs(1),
            },
            BceError::Metadata(MetadataError::Empty { path: "p".into() }),
            BceError::Api(ApiError::Decode {
                op: "get".into(),
                why: "x".into(),
            }),
        ];
        for e in cases {
            let transient = e.is_transient();
            let shown = e.to_string();
            assert_eq!(ProviderError::from(e).is_transient(), transient, "{shown}");
        }
    }
}
