//! [`AwsError`]: what the AWS provider's steps fail with, and how the pool
//! and the operator read it ([`ProviderError`]): a cloud or metadata that
//! may answer later is `Unavailable`, a refusal that will not change is
//! `Config`.

use std::time::Duration;

use enim_core::ProviderError;

use crate::client::Ec2Error;
use crate::credentials::CredentialsError;
use crate::metadata::ImdsError;
use crate::tags::{TAG_MANAGED, TAG_NODE};

#[derive(Debug, thiserror::Error)]
pub enum AwsError {
    #[error("{what}: {source}")]
    Imds {
        what: String,
        #[source]
        source: ImdsError,
    },
    #[error("{what}: {source}")]
    Ec2 {
        what: String,
        #[source]
        source: Ec2Error,
    },
    #[error("AWS credentials: {0}")]
    Credentials(#[from] CredentialsError),
    #[error("aws provider configuration: {0}")]
    Config(String),
    #[error("no primary interface (device 0 on card 0) in instance metadata")]
    NoPrimary,
    #[error("ENI {0} does not exist")]
    Missing(String),
    #[error("ENI {eni_id} does not carry {TAG_MANAGED}=true and {TAG_NODE}={instance}: enim did not create it for this node")]
    NotOurs { eni_id: String, instance: String },
    #[error("ENI {eni_id} is attached to {other}, not to this instance {instance}")]
    ForeignAttachment {
        eni_id: String,
        other: String,
        instance: String,
    },
    #[error("ENI {0} is this instance's primary interface; enim never detaches it")]
    Primary(String),
    /// EC2 lists no interface at device 0 of this instance (yet: a listing
    /// can lag a launch), whose groups new ENIs would take.
    #[error("instance {0} has no primary interface (device 0) in EC2's listing")]
    NoPrimaryInterface(String),
    #[error("ENI {eni_id} still {status} after {waited:?}")]
    StateTimeout {
        eni_id: String,
        status: String,
        waited: Duration,
    },
    #[error(
        "instance {instance} already has {attached} interfaces on card 0, its limit is {limit}"
    )]
    NoFreeSlot {
        instance: String,
        attached: usize,
        limit: usize,
    },
    #[error("ENI {eni_id}: EC2 reported MAC address {mac:?}, which is not a MAC address")]
    BadMac { eni_id: String, mac: String },
    #[error("ENI {eni_id}: EC2 reported primary address {value:?}, which is not an IPv4 address")]
    BadAddress { eni_id: String, value: String },
    #[error("subnet {subnet}: {value:?} is not a block enim can read")]
    BadSubnet { subnet: String, value: String },
    #[error("ENI {eni_id} does not carry {TAG_MANAGED}=true and enim.io/cluster={cluster}: not this cluster's")]
    NotInCluster { eni_id: String, cluster: String },
}

impl From<AwsError> for ProviderError {
    fn from(e: AwsError) -> Self {
        let msg = e.to_string();
        match &e {
            AwsError::Ec2 { source, .. } => (source.provider_kind())(msg),
            AwsError::Credentials(c) if c.is_transient() => ProviderError::Unavailable(msg),
            AwsError::Missing(id) => ProviderError::UnknownEni(id.clone()),
            AwsError::Credentials(_)
            | AwsError::Config(_)
            | AwsError::NotOurs { .. }
            | AwsError::ForeignAttachment { .. }
            | AwsError::Primary(_)
            | AwsError::BadMac { .. }
            | AwsError::BadAddress { .. }
            | AwsError::BadSubnet { .. }
            | AwsError::NotInCluster { .. } => ProviderError::Config(msg),
            // Metadata trouble, slow detaches and a full instance can all
            // clear up: the pool retries with backoff.
            AwsError::Imds { .. }
            | AwsError::NoPrimary
            | AwsError::NoPrimaryInterface(_)
            | AwsError::StateTimeout { .. }
            | AwsError::NoFreeSlot { .. } => ProviderError::Unavailable(msg),
        }
    }
}

/// An EC2 failure of the step `what`.
pub(crate) fn ec2(what: impl Into<String>) -> impl FnOnce(Ec2Error) -> AwsError {
    let what = what.into();
    move |source| AwsError::Ec2 { what, source }
}

/// An instance metadata failure of the step `what`.
pub(crate) fn imds(what: impl Into<String>) -> impl FnOnce(ImdsError) -> AwsError {
    let what = what.into();
    move |source| AwsError::Imds { what, source }
}
