#!/usr/bin/python3
"""Writes deploy/'s ConfigMap for the e2e cluster (scripts/e2e-cluster.sh):

    enim-config.py DEPLOY_DIR MODE ENIS_TOML PROVIDER NODE OPERATOR_OUT [--dra]
                   [--service-cidr CIDR] [--replicas N] > configmap.yaml

What a user edits when installing on their cloud, done for the sandbox:
`mode` is set, and [provider] becomes
- PROVIDER static: the static provider with the sandbox's veth ENIs
  (ENIS_TOML holds their [[provider.enis]]);
- PROVIDER cluster: the `cluster` provider (the agent serves its
  NetResourceSet), and OPERATOR_OUT gets deploy/50-operator.yaml with the
  operator's [cloud] a static inventory of those ENIs on node NODE, and one
  replica (the two of deploy/ are spread over nodes; this cluster has one).
- PROVIDER aws (the cloud run, scripts/cluster/cloud.sh): the `cluster`
  provider, and OPERATOR_OUT gets deploy/50-operator.yaml with the `aws`
  cloud on moto, its keys in the Secret enim-operator-cloud, its node pools
  (primary, secondary, primary-dra: the node label enim.io/pool), and the
  replicas --replicas says (default 2); ENIS_TOML is then cloud.py's state
  (JSON) and NODE is unused.
- PROVIDER aws-node (the cloud run's per-node pool): enimd's own `aws`
  provider on moto and the node's metadata, its keys from the environment
  (the DaemonSet's Secret); ENIS_TOML as for aws, NODE and OPERATOR_OUT
  unused.
With --dra, [dra] enabled = true and [device_plugin] off: pods claim ENIs
through DRA (docs/dra.md). --service-cidr CIDR sets
[host_path] service_cidrs (default: deploy/'s).
Every other key stays as deploy/ has it.
"""

import argparse
import importlib.util
import json
import os
import sys
import tomllib

import yaml


def fail(msg):
    sys.exit(f"enim-config.py: {msg}")


def e2e_pod():
    """scripts/e2e-pod.py's TOML writer, shared rather than repeated."""
    path = os.path.join(os.path.dirname(__file__), "..", "e2e-pod.py")
    spec = importlib.util.spec_from_file_location("e2e_pod", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser(prog="enim-config.py")
    for name in ("deploy_dir", "mode", "enis_file", "provider", "node", "operator_out"):
        ap.add_argument(name)
    ap.add_argument("--dra", action="store_true")
    ap.add_argument("--service-cidr")
    ap.add_argument("--replicas", type=int, default=2)
    a = ap.parse_args()
    pod = e2e_pod()
    with open(os.path.join(a.deploy_dir, "20-configmap.yaml")) as f:
        cm = yaml.safe_load(f)
    if cm.get("kind") != "ConfigMap" or list(cm["data"]) != ["enimd.toml"]:
        fail("deploy/20-configmap.yaml is not the one-key enimd ConfigMap")
    config = tomllib.loads(cm["data"]["enimd.toml"])
    config["mode"] = a.mode
    yaml.add_representer(str, pod.literal_blocks)
    if a.provider == "aws":
        with open(a.enis_file) as f:
            cloud = json.load(f)
        config["provider"] = {"type": "cluster"}
        with open(a.operator_out, "w") as out:
            aws_operator_manifests(a.deploy_dir, a.mode, cloud, a.replicas, out)
    elif a.provider == "aws-node":
        with open(a.enis_file) as f:
            cloud = json.load(f)
        config["provider"] = per_node_aws(cloud)
    else:
        with open(a.enis_file, "rb") as f:
            sandbox = tomllib.load(f)
        if a.provider == "static":
            config["provider"] = {"type": "static", **sandbox["provider"]}
        elif a.provider == "cluster":
            config["provider"] = {"type": "cluster"}
            with open(a.operator_out, "w") as out:
                operator_manifests(a.deploy_dir, a.mode, a.node, sandbox["provider"]["enis"], out)
        else:
            fail(f"PROVIDER {a.provider!r}: static, cluster, aws or aws-node")
    if a.service_cidr:
        config["host_path"]["service_cidrs"] = [a.service_cidr]
    # The metadata scenario's opted-in namespace (scenarios.sh s_metadata);
    # the refused addresses stay enimd's defaults.
    config["pod_metadata"] = {"allowed_namespaces": ["enim-e2e-imds"]}
    if a.dra:
        # One or the other: enimd refuses to start with both.
        config["device_plugin"] = {**config.get("device_plugin", {}), "enabled": False}
        config["dra"] = {"enabled": True}
    cm["data"]["enimd.toml"] = "\n".join(pod.toml_dump(config)) + "\n"
    yaml.dump(cm, sys.stdout, sort_keys=False)


def operator_docs(deploy_dir, mode, replicas, edit):
    """deploy/50-operator.yaml's documents for the e2e cluster: [operator]
    named enim-e2e, in `mode`, resyncing every 5 s, then `edit(config)`
    (the rest of the policy and [cloud]); `replicas` replicas."""
    pod = e2e_pod()
    with open(os.path.join(deploy_dir, "50-operator.yaml")) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            config = tomllib.loads(doc["data"]["operator.toml"])
            config["operator"]["cluster"] = "enim-e2e"
            config["operator"]["mode"] = mode
            config["operator"]["resync_interval"] = "5s"
            edit(config)
            doc["data"]["operator.toml"] = "\n".join(pod.toml_dump(config)) + "\n"
        elif doc["kind"] == "Deployment":
            doc["spec"]["replicas"] = replicas
    return docs


def operator_manifests(deploy_dir, mode, node, enis, out):
    """deploy/50-operator.yaml for the sandbox: a static inventory, one replica."""

    def edit(config):
        # A static inventory cannot take ENIs back: none is ever surplus.
        config["operator"]["watermarks"]["max_above_watermark"] = len(enis)
        config["cloud"] = static_inventory(node, enis)

    yaml.dump_all(operator_docs(deploy_dir, mode, 1, edit), out, sort_keys=False)


def aws_operator_manifests(deploy_dir, mode, cloud, replicas, out):
    """deploy/50-operator.yaml for the cloud run: EC2 on moto, the operator's
    keys in the optional Secret deploy/ reads them from."""

    def edit(config):
        op = config["operator"]
        op["subnets"] = [cloud["pod_subnet"]]
        op["security_groups"] = [cloud["security_group"]]
        op["node_grace"] = "30s"
        # Two ENIs a node from the start, one free ahead of demand.
        op["watermarks"] = {"pre_allocate": 1, "min_allocate": 2, "max_above_watermark": 2}
        # The node label enim.io/pool picks the pool; per-node matches none
        # (its agent runs the `aws` provider itself).
        selector = lambda pool: {"enim.io/pool": pool}
        op["pools"] = [
            {"name": "primary", "node_selector": selector("primary"), "mode": "primary"},
            {"name": "secondary", "node_selector": selector("secondary"), "mode": "secondary",
             # In addresses: eight from the start, four free ahead of demand.
             "watermarks": {"pre_allocate": 4, "min_allocate": 8, "max_above_watermark": 8}},
            {"name": "primary-dra", "node_selector": selector("primary-dra"), "mode": "primary"},
        ]
        config["cloud"] = {
            "type": "aws",
            "region": cloud["region"],
            "detach_timeout": "30s",
            # The pod subnet has an IPv6 block: each ENI gets one address.
            "assign_ipv6": True,
            # Through the fault proxy, where the run has one.
            "api": {"endpoint": cloud.get("proxy_url", cloud["url"])},
        }

    docs = operator_docs(deploy_dir, mode, replicas, edit)
    key = cloud["keys"]["operator"]
    docs.append({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "enim-operator-cloud", "namespace": "enim-system"},
        "stringData": {"AWS_ACCESS_KEY_ID": key["id"], "AWS_SECRET_ACCESS_KEY": key["secret"]},
    })
    yaml.dump_all(docs, out, sort_keys=False)


def per_node_aws(cloud):
    """enimd's own `aws` provider for the cloud run's per-node pool: EC2 on
    moto (its keys in the environment), the node's metadata from the VPC
    simulator, ENIs in the pod subnet with the cluster's group and tag, one
    free ahead of demand."""
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


def static_inventory(node, enis):
    """The operator's static cloud: the node's veth ENIs, attached from the start."""
    return {"type": "static", "nodes": {node: enis}}


if __name__ == "__main__":
    main()
