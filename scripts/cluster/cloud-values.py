#!/usr/bin/python3
"""The Helm values the cloud run (scripts/cluster/cloud.sh) installs
charts/enim with, from cloud.py's state:

    cloud-values.py CLOUD_JSON --replicas N --tag TAG > values.json

(JSON is YAML, so helm reads it as a values file.) What a user with several
kinds of nodes sets on EC2, for moto and the VPC simulator:
- the node pools, chosen by the node label enim.io/pool: primary and
  secondary (the device plugin counts their ENIs or addresses) and
  primary-dra (DRA claims), all on the operator's NetResourceSets; and
  per-node, on its agent's own `aws` provider (its keys in the Secret
  enim-node-cloud), which no operator pool selects;
- the operator on the `aws` cloud through the fault proxy, N replicas, with
  no key anywhere: IRSA, its ServiceAccount token (projected by the chart)
  exchanged at moto's STS for cloud.py's role;
- the EniPolicy admission webhook on (s_cloud_policy);
- the image tag TAG, and the metadata scenario's opted-in namespace
  (scenarios.sh s_metadata). serviceCIDRs is left unset: the agents read
  the cluster's ranges (10.100.0.0/16, as on EKS) from its ServiceCIDRs.
"""

import argparse
import json
import sys


def operator_config(cloud):
    """operator.toml: the operator's pools on the node label, ENIs in the
    pod subnet with the cluster's group, EC2 through the fault proxy."""
    selector = lambda pool: {"enim.io/pool": pool}
    return {
        "operator": {
            "cluster": "enim-e2e",
            "mode": "primary",
            "resync_interval": "5s",
            "subnets": [cloud["pod_subnet"]],
            "security_groups": [cloud["security_group"]],
            "node_grace": "30s",
            # The webhook's serving certificate renewed every 20 s (at two
            # thirds of its life), so that pods are created across
            # renewals (s_cloud_policy checks one during its admissions).
            "policy": {"cert_lifetime": "30s"},
            # Two ENIs a node from the start, one free ahead of demand.
            "watermarks": {"pre_allocate": 1, "min_allocate": 2, "max_above_watermark": 2},
            "pools": [
                {"name": "primary", "node_selector": selector("primary"), "mode": "primary"},
                {"name": "secondary", "node_selector": selector("secondary"), "mode": "secondary",
                 # In addresses: eight from the start, four free ahead of demand.
                 "watermarks": {"pre_allocate": 4, "min_allocate": 8, "max_above_watermark": 8}},
                {"name": "primary-dra", "node_selector": selector("primary-dra"), "mode": "primary"},
            ],
        },
        "cloud": {
            "type": "aws",
            "region": cloud["region"],
            "detach_timeout": "30s",
            # The pod subnet has an IPv6 block: each ENI gets one address.
            "assign_ipv6": True,
            # Through the fault proxy, where the run has one.
            "api": {"endpoint": cloud.get("proxy_url", cloud["url"])},
            "credentials": {"source": "web_identity"},
        },
    }


def per_node_aws(cloud):
    """enimd's own `aws` provider for the per-node pool: EC2 on moto (its
    keys in the environment), the node's metadata from the VPC simulator,
    ENIs in the pod subnet with the cluster's group and tag, one free ahead
    of demand."""
    return {
        "type": "aws",
        "region": cloud["region"],
        "subnet_id": cloud["pod_subnet"],
        "security_group_ids": [cloud["security_group"]],
        "cluster": "enim-e2e",
        "detach_timeout": "30s",
        "api": {"endpoint": cloud["url"]},
        "pool": {"pre_allocate": 1, "max_above_watermark": 2},
    }


def main():
    ap = argparse.ArgumentParser(prog="cloud-values.py")
    ap.add_argument("cloud_json")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--tag", required=True)
    a = ap.parse_args()
    with open(a.cloud_json) as f:
        cloud = json.load(f)
    pool = lambda name, mode: {"name": name, "mode": mode, "nodeSelector": {"enim.io/pool": name}}
    per_node = pool("per-node", "primary")
    per_node["config"] = {"provider": per_node_aws(cloud)}
    per_node["envFromSecret"] = "enim-node-cloud"
    values = {
        "image": {"repository": "enim", "tag": a.tag},
        "imds": {"allowedNamespaces": ["enim-e2e-imds"]},
        "pools": [pool("primary", "primary"), pool("secondary", "secondary"),
                  pool("primary-dra", "primary-dra"), per_node],
        "operator": {
            "replicas": a.replicas,
            # The EniPolicy webhook, served by both replicas; the API
            # server reaches it at the Service's endpoints (node.sh's
            # --enable-aggregator-routing: its control plane has no
            # kube-proxy). Namespace default is labelled out of its scope
            # (cloud.sh), so only s_cloud_policy's namespaces meet it.
            "webhook": {"enabled": True},
            # STS straight at moto: an EC2 outage of the fault proxy is not
            # an STS outage.
            "credentials": {"webIdentity": {"roleArn": cloud["roles"]["operator"]},
                            "env": {"AWS_ENDPOINT_URL_STS": cloud["url"]}},
            "config": operator_config(cloud),
        },
    }
    json.dump(values, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
