#!/usr/bin/python3
"""Writes deploy/'s ConfigMap for the e2e cluster (scripts/e2e-cluster.sh):

    enim-config.py DEPLOY_DIR MODE ENIS_TOML > configmap.yaml

What a user edits when installing on their cloud, done for the sandbox:
[provider] becomes the static provider with the sandbox's veth ENIs
(ENIS_TOML holds their [[provider.enis]]), and `mode` is set. Every other
key stays as deploy/20-configmap.yaml has it.
"""

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
    if len(sys.argv) != 4:
        fail("usage: enim-config.py DEPLOY_DIR MODE ENIS_TOML")
    deploy_dir, mode, enis_file = sys.argv[1:]
    pod = e2e_pod()
    with open(os.path.join(deploy_dir, "20-configmap.yaml")) as f:
        cm = yaml.safe_load(f)
    if cm.get("kind") != "ConfigMap" or list(cm["data"]) != ["enimd.toml"]:
        fail("deploy/20-configmap.yaml is not the one-key enimd ConfigMap")
    config = tomllib.loads(cm["data"]["enimd.toml"])
    with open(enis_file, "rb") as f:
        sandbox = tomllib.load(f)
    config["mode"] = mode
    config["provider"] = {"type": "static", **sandbox["provider"]}
    cm["data"]["enimd.toml"] = "\n".join(pod.toml_dump(config)) + "\n"
    yaml.add_representer(str, pod.literal_blocks)
    yaml.dump(cm, sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
