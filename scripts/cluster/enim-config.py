#!/usr/bin/python3
"""Writes deploy/'s ConfigMap for the e2e cluster (scripts/e2e-cluster.sh):

    enim-config.py DEPLOY_DIR MODE ENIS_TOML PROVIDER NODE OPERATOR_OUT [--dra] > configmap.yaml

What a user edits when installing on their cloud, done for the sandbox:
`mode` is set, and [provider] becomes
- PROVIDER static: the static provider with the sandbox's veth ENIs
  (ENIS_TOML holds their [[provider.enis]]);
- PROVIDER cluster: the `cluster` provider (the agent serves its
  NetResourceSet), and OPERATOR_OUT gets deploy/50-operator.yaml with the
  operator's [cloud] a static inventory of those ENIs on node NODE, and one
  replica (the two of deploy/ are spread over nodes; this cluster has one).
(The cloud run installs the Helm chart instead: scripts/cluster/cloud-values.py.)
With --dra, [dra] enabled = true and [device_plugin] off: pods claim ENIs
through DRA (docs/dra.md). Every other key stays as deploy/ has it.
"""

import argparse
import importlib.util
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
    a = ap.parse_args()
    pod = e2e_pod()
    with open(os.path.join(a.deploy_dir, "20-configmap.yaml")) as f:
        cm = yaml.safe_load(f)
    if cm.get("kind") != "ConfigMap" or list(cm["data"]) != ["enimd.toml"]:
        fail("deploy/20-configmap.yaml is not the one-key enimd ConfigMap")
    config = tomllib.loads(cm["data"]["enimd.toml"])
    config["mode"] = a.mode
    yaml.add_representer(str, pod.literal_blocks)
    with open(a.enis_file, "rb") as f:
        sandbox = tomllib.load(f)
    if a.provider == "static":
        config["provider"] = {"type": "static", **sandbox["provider"]}
    elif a.provider == "cluster":
        config["provider"] = {"type": "cluster"}
        with open(a.operator_out, "w") as out:
            operator_manifests(a.deploy_dir, a.mode, a.node, sandbox["provider"]["enis"], out)
    else:
        fail(f"PROVIDER {a.provider!r}: static or cluster")
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


def static_inventory(node, enis):
    """The operator's static cloud: the node's veth ENIs, attached from the start."""
    return {"type": "static", "nodes": {node: enis}}


if __name__ == "__main__":
    main()
