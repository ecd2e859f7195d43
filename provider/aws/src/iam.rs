//! The IAM actions enim's AWS credentials must allow: the node's (its
//! backend's calls) and the operator's (the same, and the subnets it
//! reads where a node reads instance metadata).

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
    // Secondary mode.
    "ec2:AssignPrivateIpAddresses",
    "ec2:UnassignPrivateIpAddresses",
    "ec2:AssignIpv6Addresses",
    "ec2:UnassignIpv6Addresses",
];

/// The IAM actions the operator's credentials must allow beyond the
/// node's ([`REQUIRED_IAM_ACTIONS`]): DescribeSubnets, for the prefix
/// lengths and gateways instance metadata gives a node.
pub const FLEET_EXTRA_IAM_ACTIONS: &[&str] = &["ec2:DescribeSubnets"];

/// Every IAM action the operator's credentials must allow.
pub fn fleet_iam_actions() -> Vec<&'static str> {
    let node = REQUIRED_IAM_ACTIONS.iter();
    node.chain(FLEET_EXTRA_IAM_ACTIONS).copied().collect()
}
