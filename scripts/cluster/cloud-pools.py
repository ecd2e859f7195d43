#!/usr/bin/python3
"""enimd per node pool for the cloud run (scripts/cluster/cloud.sh): one
DaemonSet per pool, each with its own config, chosen by the node label
enim.io/pool, as a user with several kinds of nodes installs deploy/.

    cloud-pools.py DEPLOY_DIR DEFAULT_POOL POOL:CONFIGMAP:SCHEDULING[:SECRET] ... > pools.yaml

SCHEDULING is `plugin` (the device plugin's DaemonSet runs on the pool's
nodes) or `dra`. Written:
- deploy/30-daemonset.yaml's DaemonSet `enimd`, on nodes of DEFAULT_POOL
  only, with deploy/'s ConfigMap `enimd-config`;
- 40-device-plugin.yaml's `enim-device-plugin`, on nodes of DEFAULT_POOL
  and of every pool with SCHEDULING `plugin`;
- per POOL: CONFIGMAP (an enim-config.py ConfigMap) renamed
  `enimd-config-POOL`, and a DaemonSet `enimd-POOL`, `enimd` on nodes of
  POOL only with that config and a selector of its own; with SECRET, its
  environment from that Secret (a per-node provider's cloud keys).
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


def only_on(ds, pools):
    """The DaemonSet runs on nodes of `pools` only (node affinity)."""
    spec = ds["spec"]["template"]["spec"]
    term = {"matchExpressions": [{"key": LABEL, "operator": "In", "values": pools}]}
    spec.setdefault("affinity", {})["nodeAffinity"] = {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
    }


def pool_agent(agent, cm, pool, secret):
    """`agent` for nodes of `pool` with ConfigMap `cm`, renamed for it."""
    ds = copy.deepcopy(agent)
    config_name = f"{cm['metadata']['name']}-{pool}"
    cm["metadata"]["name"] = config_name
    ds["metadata"]["name"] = f"{agent['metadata']['name']}-{pool}"
    for labels in (ds["spec"]["selector"]["matchLabels"],
                   ds["spec"]["template"]["metadata"]["labels"]):
        labels[LABEL] = pool
    spec = ds["spec"]["template"]["spec"]
    spec.pop("affinity", None)
    spec.setdefault("nodeSelector", {})[LABEL] = pool
    volumes = [v for v in spec["volumes"] if "configMap" in v and v["configMap"]["name"] == "enimd-config"]
    if len(volumes) != 1:
        fail("30-daemonset.yaml: no one volume of ConfigMap enimd-config")
    volumes[0]["configMap"]["name"] = config_name
    if secret:
        enimd = [c for c in spec["containers"] if c["name"] == "enimd"]
        if len(enimd) != 1:
            fail("30-daemonset.yaml: no one container enimd")
        enimd[0].setdefault("envFrom", []).append({"secretRef": {"name": secret}})
    return ds


def main():
    if len(sys.argv) < 4:
        fail("usage: cloud-pools.py DEPLOY_DIR DEFAULT_POOL POOL:CONFIGMAP:SCHEDULING[:SECRET] ...")
    deploy_dir, default_pool = sys.argv[1:3]
    agent = one(os.path.join(deploy_dir, "30-daemonset.yaml"), "DaemonSet")
    plugin = one(os.path.join(deploy_dir, "40-device-plugin.yaml"), "DaemonSet")
    docs, plugin_pools = [], [default_pool]
    for arg in sys.argv[3:]:
        parts = arg.split(":")
        if len(parts) not in (3, 4) or parts[2] not in ("plugin", "dra"):
            fail(f"{arg!r}: want POOL:CONFIGMAP:plugin|dra[:SECRET]")
        pool, cm_path, scheduling = parts[:3]
        secret = parts[3] if len(parts) == 4 else ""
        cm = one(cm_path, "ConfigMap")
        docs += [cm, pool_agent(agent, cm, pool, secret)]
        if scheduling == "plugin":
            plugin_pools.append(pool)
    only_on(agent, [default_pool])
    only_on(plugin, plugin_pools)
    yaml.dump_all([agent, plugin] + docs, sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
