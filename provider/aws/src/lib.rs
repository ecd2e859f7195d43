//! enim's AWS backend: secondary ENIs for pods on EC2.
//!
//! - [`imds`]: instance metadata (IMDSv2) — the instance, its interfaces and
//!   their addresses, and the instance role's credentials.
//! - [`ec2`]: a small SigV4-signed client of the EC2 Query API.
//! - [`backend`]: [`AwsBackend`], the [`enim_provider::cloud::CloudBackend`]
//!   the warm pool drives.

pub mod backend;
pub mod config;
pub mod credentials;
pub mod ec2;
pub mod imds;

pub use backend::{AwsBackend, AwsError, TAG_MANAGED, TAG_NODE};
pub use config::AwsConfig;

/// The IAM actions the node's credentials must allow. `ec2:CreateTags`
/// covers the tags set on create (TagSpecification).
pub const REQUIRED_IAM_ACTIONS: &[&str] = &[
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeNetworkInterfaces",
    "ec2:CreateNetworkInterface",
    "ec2:CreateTags",
    "ec2:AttachNetworkInterface",
    "ec2:ModifyNetworkInterfaceAttribute",
    "ec2:DetachNetworkInterface",
    "ec2:DeleteNetworkInterface",
];
