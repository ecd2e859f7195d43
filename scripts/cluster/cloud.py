#!/usr/bin/python3
"""The cloud of scripts/e2e-cluster.sh's `cloud` run, made in moto (run it
where moto is reached: inside the VPC namespace).

    cloud.py setup MOTO_URL NODES OUT.json   IAM users, a dual-stack VPC, its subnets and
                                             a security group, NODES instances
    cloud.py sg STATE.json NAME              a new security group in the VPC;
                                             prints its id
    cloud.py enis STATE.json                 every ENI: id, instance, device
                                             index, MAC, addresses, IPv6
                                             addresses (JSON)

The IAM users are allowed what enim documents: the operator the fleet's
actions, a node (the late one, per-node provider) the node's, the VPC
simulator ec2:Describe*; the rig itself (admin) everything. The actions are
read from provider/aws/src/iam.rs, so the rig never keeps its own copy.
Signature checks are on from the first EC2 call on, as in the Rust rig
(testkit/src/moto/mod.rs).
"""

import json
import os
import re
import sys
import urllib.request

import boto3

REGION = "us-east-1"
ZONE = "us-east-1a"
VPC_CIDR = "10.0.0.0/16"
# The nodes' own subnet (their primary ENIs) and the one enim makes pods'
# ENIs in, as EKS custom networking keeps them apart.
NODE_SUBNET = "10.0.1.0/24"
POD_SUBNET = "10.0.32.0/19"
# An EniPolicy's subnet per zone (cloud-scenarios.sh, policy_groups): one in
# the nodes' zone, one in a zone no node is in.
POLICY_SUBNET = "10.0.64.0/24"
FAR_ZONE = "us-east-1b"
FAR_SUBNET = "10.0.65.0/24"
# DescribeInstanceTypes in moto: 4 interfaces, 15 addresses each.
# 8 ENIs (7 besides the primary): room for every scenario's demand.
INSTANCE_TYPE = "m5.4xlarge"
IAM_RS = os.path.join(os.path.dirname(__file__), "..", "..", "provider", "aws", "src", "iam.rs")


def fail(msg):
    sys.exit(f"cloud.py: {msg}")


def iam_actions():
    """(node's actions, the operator's): REQUIRED_IAM_ACTIONS and it plus
    FLEET_EXTRA_IAM_ACTIONS, as iam.rs lists them."""
    with open(IAM_RS) as f:
        text = f.read()

    def listed(name):
        m = re.search(name + r": &\[&str\] = &\[(.*?)\];", text, re.S)
        if not m:
            fail(f"{name} not found in {IAM_RS}")
        return re.findall(r'"(ec2:\w+)"', m.group(1))

    node = listed("REQUIRED_IAM_ACTIONS")
    return node, node + listed("FLEET_EXTRA_IAM_ACTIONS")


def moto_auth(url, after):
    """Signature checks off ("inf") or on after `after` more actions."""
    req = urllib.request.Request(f"{url}/moto-api/reset-auth", data=after.encode(),
                                 headers={"content-type": "text/plain"}, method="POST")
    urllib.request.urlopen(req, timeout=10).read()


def client(service, url, key):
    return boto3.client(service, endpoint_url=url, region_name=REGION,
                        aws_access_key_id=key["id"], aws_secret_access_key=key["secret"])


def allowing(actions):
    """An IAM policy document allowing exactly `actions`."""
    return json.dumps({"Version": "2012-10-17",
                       "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]})


def iam_user(iam, name, actions):
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName="enim", PolicyDocument=allowing(actions))
    k = iam.create_access_key(UserName=name)["AccessKey"]
    return {"id": k["AccessKeyId"], "secret": k["SecretAccessKey"]}


def irsa_role(iam, name, actions):
    """A role the operator assumes with its ServiceAccount token (IRSA):
    trusted for web identities, allowed `actions`. Its ARN."""
    trust = {"Version": "2012-10-17",
             "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRoleWithWebIdentity",
                            "Principal": {"Federated": "arn:aws:iam::123456789012:oidc-provider/enim-e2e"}}]}
    arn = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
    iam.put_role_policy(RoleName=name, PolicyName="enim", PolicyDocument=allowing(actions))
    return arn


def run_instance(ec2, subnet):
    i = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1,
                          InstanceType=INSTANCE_TYPE, SubnetId=subnet)["Instances"][0]
    return {"instance_id": i["InstanceId"], "ip": i["PrivateIpAddress"], "zone": ZONE,
            "instance_type": INSTANCE_TYPE}


def setup(url, nodes, out):
    moto_auth(url, "inf")
    bootstrap = {"id": "AKIABOOTSTRAP", "secret": "bootstrap"}
    iam = client("iam", url, bootstrap)
    node_actions, fleet_actions = iam_actions()
    keys = {
        "admin": iam_user(iam, "enim-rig", ["ec2:*", "iam:*"]),
        "node": iam_user(iam, "enim-node", node_actions),
        "vpcsim": iam_user(iam, "enim-vpcsim", ["ec2:Describe*"]),
    }
    # The operator has no key: IRSA, its ServiceAccount token for this role.
    roles = {"operator": irsa_role(iam, "enim-operator", fleet_actions)}
    moto_auth(url, "0")
    ec2 = client("ec2", url, keys["admin"])
    # Dual stack, as EC2 gives it: an Amazon-provided /56 for the VPC, and
    # its first /64 for the pod subnet (the nodes' own stays IPv4 only).
    # The addresses are global, but no packet leaves the VPC namespace.
    made = ec2.create_vpc(CidrBlock=VPC_CIDR, AmazonProvidedIpv6CidrBlock=True)["Vpc"]
    vpc = made["VpcId"]
    vpc_v6 = made["Ipv6CidrBlockAssociationSet"][0]["Ipv6CidrBlock"]
    pod_subnet_v6 = vpc_v6.replace("/56", "/64")
    def subnet(cidr, zone=ZONE, **v6):
        return ec2.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone=zone, **v6)["Subnet"]["SubnetId"]
    node_subnet = subnet(NODE_SUBNET)
    pod_subnet = subnet(POD_SUBNET, Ipv6CidrBlock=pod_subnet_v6)
    policy_subnet = subnet(POLICY_SUBNET)
    far_subnet = subnet(FAR_SUBNET, zone=FAR_ZONE)
    sg = ec2.create_security_group(GroupName="enim-pods", Description="enim e2e pods", VpcId=vpc)["GroupId"]
    state = {
        "url": url, "region": REGION, "keys": keys, "roles": roles, "vpc": vpc,
        "node_subnet": node_subnet, "node_subnet_cidr": NODE_SUBNET,
        "pod_subnet": pod_subnet, "pod_subnet_cidr": POD_SUBNET, "pod_subnet_v6": pod_subnet_v6,
        "zone": ZONE, "policy_subnet": policy_subnet, "policy_subnet_cidr": POLICY_SUBNET,
        "far_zone": FAR_ZONE, "far_subnet": far_subnet,
        "security_group": sg,
        "nodes": [run_instance(ec2, node_subnet) for _ in range(nodes)],
    }
    with open(out, "w") as f:
        json.dump(state, f, indent=1)


def enis(state):
    ec2 = client("ec2", state["url"], state["keys"]["admin"])
    found = []
    for page in ec2.get_paginator("describe_network_interfaces").paginate():
        for e in page["NetworkInterfaces"]:
            att = e.get("Attachment") or {}
            found.append({
                "id": e["NetworkInterfaceId"],
                "instance": att.get("InstanceId", ""),
                "device_index": att.get("DeviceIndex", -1),
                "mac": e["MacAddress"],
                "subnet": e["SubnetId"],
                "groups": sorted(g["GroupId"] for g in e.get("Groups", [])),
                "addresses": [a["PrivateIpAddress"] for a in e.get("PrivateIpAddresses", [])],
                "ipv6": [a["Ipv6Address"] for a in e.get("Ipv6Addresses", [])],
                "tags": {t["Key"]: t["Value"] for t in e.get("TagSet", [])},
            })
    print(json.dumps(found))


def main():
    args = sys.argv[1:]
    if args[:1] == ["setup"] and len(args) == 4:
        setup(args[1], int(args[2]), args[3])
    elif args[:1] == ["sg"] and len(args) == 3:
        with open(args[1]) as f:
            state = json.load(f)
        ec2 = client("ec2", state["url"], state["keys"]["admin"])
        print(ec2.create_security_group(GroupName=args[2], Description="enim e2e",
                                        VpcId=state["vpc"])["GroupId"])
    elif args[:1] == ["enis"] and len(args) == 2:
        with open(args[1]) as f:
            enis(json.load(f))
    else:
        fail("usage: cloud.py setup MOTO_URL NODES OUT.json | sg STATE.json NAME | enis STATE.json")


if __name__ == "__main__":
    main()
