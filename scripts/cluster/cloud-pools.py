#!/usr/bin/python3
"""enimd per node pool for the cloud run (scripts/cluster/cloud.sh): one
DaemonSet per pool, each with its own config, chosen by the node label
enim.io/pool, as a user with two kinds of nodes installs deploy/.

    cloud-pools.py DEPLOY_DIR DRA_CONFIGMAP POOL > pools.yaml

DRA_CONFIGMAP is enim-config.py's ConfigMap made with --dra. Written:
- deploy/30-daemonset.yaml's DaemonSet `enimd` and 40-device-plugin.yaml's
  `enim-device-plugin`, kept off nodes of pool POOL (node affinity);
- the DRA pool's ConfigMap `enimd-config-POOL` (DRA_CONFIGMAP renamed) and
  DaemonSet `enimd-POOL`: `enimd` on nodes of pool POOL only, with that
  config and a selector of its own.
Every other key stays as deploy/ has it.
"""

import copy
import os
import sys

import yaml

LABEL = "enim.io/pool"


def fail(msg):
    sys.exit(f"cloud-pools.py: {msg}")


def one(path, kind):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    if len(docs) != 1 or docs[0]["kind"] != kind:
        fail(f"{path}: not one {kind}")
    return docs[0]


def keep_off(ds, pool):
    """The DaemonSet never runs on nodes of `pool`."""
    spec = ds["spec"]["template"]["spec"]
    term = {"matchExpressions": [{"key": LABEL, "operator": "NotIn", "values": [pool]}]}
    spec.setdefault("affinity", {})["nodeAffinity"] = {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
    }


def main():
    if len(sys.argv) != 4:
        fail("usage: cloud-pools.py DEPLOY_DIR DRA_CONFIGMAP POOL")
    deploy_dir, dra_cm_path, pool = sys.argv[1:]
    agent = one(os.path.join(deploy_dir, "30-daemonset.yaml"), "DaemonSet")
    plugin = one(os.path.join(deploy_dir, "40-device-plugin.yaml"), "DaemonSet")
    dra_cm = one(dra_cm_path, "ConfigMap")

    dra_agent = copy.deepcopy(agent)
    keep_off(agent, pool)
    keep_off(plugin, pool)

    config_name = f"{dra_cm['metadata']['name']}-{pool}"
    dra_cm["metadata"]["name"] = config_name
    dra_agent["metadata"]["name"] = f"{agent['metadata']['name']}-{pool}"
    for labels in (dra_agent["spec"]["selector"]["matchLabels"],
                   dra_agent["spec"]["template"]["metadata"]["labels"]):
        labels[LABEL] = pool
    spec = dra_agent["spec"]["template"]["spec"]
    spec.setdefault("nodeSelector", {})[LABEL] = pool
    volumes = [v for v in spec["volumes"] if "configMap" in v and v["configMap"]["name"] == "enimd-config"]
    if len(volumes) != 1:
        fail("30-daemonset.yaml: no one volume of ConfigMap enimd-config")
    volumes[0]["configMap"]["name"] = config_name
    yaml.dump_all([agent, plugin, dra_cm, dra_agent], sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
