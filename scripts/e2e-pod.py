#!/usr/bin/python3
"""Turns one of deploy/'s DaemonSets (enimd's, with the ConfigMap, or
enim-device-plugin's) into a Pod that `podman kube play` runs on a sandbox
node (scripts/e2e-deploy.sh).

    e2e-pod.py [--name POD] [--daemonset NAME] DEPLOY_DIR ROOT IMAGE ENIS_TOML > pod.yaml

Reads the manifests as they are and changes only what a sandbox must:

- the DaemonSet's pod template (NAME, default enimd) becomes a Pod (podman
  4.3 plays Pods, not DaemonSets) named POD (default: the DaemonSet's
  name), with IMAGE on every container;
- every hostPath moves under ROOT (a temporary directory), except two that
  are the sandbox node's already: the pods' network namespace dir, where
  the node's runtime and `ip netns` put namespaces (/run/netns), and
  /proc/sys/net, which shows the sysctls of the namespace of whoever opens
  it: enimd's, the sandbox node's, never this machine's own;
- the dir of the agent's API socket is mounted at the same ROOT path inside
  the container, and the config's `socket` follows, so the conflist that
  install-cni writes names a path the plugin on the node really finds (the
  manifest has the socket at the same path inside and outside for that
  reason; tests/deploy_manifests.rs checks it); `enimd device-plugin` is
  given that path with --socket (its default is the ConfigMap's socket);
- in enimd.toml, [provider] becomes the sandbox's static ENIs (ENIS_TOML: a
  TOML file with `mode`, optional `[secondary]`, and `[provider]`), and
  [events] goes (there is no API server to post to), and a [host_path] that
  reads the Service CIDRs from the API gets SANDBOX_SERVICE_CIDR instead
  (for the same reason); every other key stays as the ConfigMap has it.

- podman 4.3's own limits:
  - `ports` is dropped: podman makes port mappings of them, which it
    refuses with host networking (for Kubernetes they only name the
    probes' port, and the test probes /readyz itself);
  - `restartPolicy: OnFailure`: podman gives the pod's policy to init
    containers too, so under the DaemonSet's Always it restarts the
    finished install-cni forever; OnFailure is what Kubernetes does for
    init containers;
  - an env var from the downward API's `spec.nodeName` (NODE_NAME) gets the
    value "e2e-node": podman resolves no nodeName;
  - the annotation io.podman.annotations.init.container.type=always: podman
    removes a finished init container of the default type ("once"), and the
    test inspects the privileges it ran with.

Everything else, securityContext first, is copied as is; the script fails
when the manifests lack what it expects, so a change to deploy/ that this
test does not follow is an error, not a silent skip.
"""

import copy
import json
import os
import re
import sys
import tomllib

import yaml

AGENT_DS = "enimd"
NETNS_DIRS = ("/var/run/netns", "/run/netns")
KEPT = NETNS_DIRS + ("/proc/sys/net",)
# The Service CIDR a sandbox node routes through the host path, where the
# ConfigMap reads them from the API server (kubeadm's default range).
SANDBOX_SERVICE_CIDR = "10.96.0.0/12"


def fail(msg):
    sys.exit(f"e2e-pod.py: {msg}")


def load(deploy_dir, daemonset):
    docs = []
    for name in sorted(os.listdir(deploy_dir)):
        if name.endswith((".yaml", ".yml")):
            with open(os.path.join(deploy_dir, name)) as f:
                docs.extend(d for d in yaml.safe_load_all(f) if d)
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    agents = [d for d in by_kind.get("DaemonSet", []) if d["metadata"]["name"] == daemonset]
    if len(agents) != 1:
        fail(f"expected one DaemonSet {daemonset} in {deploy_dir}")
    # enimd's ConfigMap: the one enimd's pod mounts (deploy/ also holds the
    # operator's); the device plugin follows its socket.
    enimd = [d for d in by_kind["DaemonSet"] if d["metadata"]["name"] == AGENT_DS]
    volumes = enimd[0]["spec"]["template"]["spec"].get("volumes", []) if enimd else []
    mounted = {v["configMap"]["name"] for v in volumes if "configMap" in v}
    maps = [d for d in by_kind.get("ConfigMap", []) if d["metadata"]["name"] in mounted]
    if len(maps) != 1:
        fail(f"expected one ConfigMap that DaemonSet {AGENT_DS} mounts in {deploy_dir}")
    return agents[0], maps[0]


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    fail(f"cannot write {v!r} as TOML")


def toml_key(k):
    """A bare key, or a quoted one (a label such as enim.io/pool)."""
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def toml_dump(table, path=()):
    """Plain values first, then sub-tables, then arrays of tables."""
    lines = []
    subs, arrays = [], []
    for k, v in table.items():
        if isinstance(v, dict):
            subs.append((k, v))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            arrays.append((k, v))
        else:
            lines.append(f"{toml_key(k)} = {toml_value(v)}")
    header = lambda keys: ".".join(toml_key(k) for k in keys)
    for k, v in subs:
        lines += ["", f"[{header(path + (k,))}]"] + toml_dump(v, path + (k,))
    for k, items in arrays:
        for item in items:
            lines += ["", f"[[{header(path + (k,))}]]"] + toml_dump(item, path + (k,))
    return lines


def literal_blocks(dumper, s):
    style = "|" if "\n" in s else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style=style)


def main():
    args = sys.argv[1:]
    name = None
    daemonset = AGENT_DS
    while args[:1] in (["--name"], ["--daemonset"]):
        if args[0] == "--name":
            name = args[1]
        else:
            daemonset = args[1]
        args = args[2:]
    if len(args) != 4:
        fail("usage: e2e-pod.py [--name POD] [--daemonset NAME] DEPLOY_DIR ROOT IMAGE ENIS_TOML")
    deploy_dir, root, image, enis_file = args
    root = os.path.abspath(root)
    ds, cm = load(deploy_dir, daemonset)
    agent = daemonset == AGENT_DS
    template = copy.deepcopy(ds["spec"]["template"])
    spec = template["spec"]
    containers = spec["containers"] + spec.get("initContainers", [])

    # The config: the ConfigMap's, with the sandbox's ENIs.
    keys = list(cm["data"])
    if len(keys) != 1:
        fail(f"ConfigMap has keys {keys}, expected one (enimd.toml)")
    config = tomllib.loads(cm["data"][keys[0]])
    with open(enis_file, "rb") as f:
        sandbox = tomllib.load(f)
    config.pop("provider", None)
    # Events need the cluster's API server; the podman node has none.
    config.pop("events", None)
    # Nor can the Service CIDRs be read from it: the sandbox's are given
    # (kubeadm's default range; nothing here routes to it).
    host_path = config.get("host_path", {})
    if host_path.pop("service_cidrs_from_api", False):
        host_path.pop("kubeconfig", None)
        host_path["service_cidrs"] = [SANDBOX_SERVICE_CIDR]
    # One config for both modes: in secondary mode enimd ignores
    # [host_path] (its pods reach the host over their veth already).
    config.update(sandbox)

    # Host paths under ROOT; the socket dir at the same path inside.
    socket = config.get("socket", "/run/enim/enimd.sock")
    socket_dir = os.path.dirname(socket)
    volumes = {v["name"]: v for v in spec["volumes"]}
    moved_socket = False
    for v in volumes.values():
        hp = v.get("hostPath")
        if hp is None or hp["path"] in KEPT:
            continue
        hp["path"] = root + hp["path"]
    for c in containers:
        for m in c.get("volumeMounts", []):
            hp = volumes[m["name"]].get("hostPath")
            if hp is not None and m["mountPath"] == socket_dir:
                if hp["path"] != root + socket_dir:
                    fail(f"socket dir {socket_dir} is not the same path on the node")
                m["mountPath"] = root + socket_dir
                moved_socket = True
    if not moved_socket:
        fail(f"no hostPath mount at the socket dir {socket_dir}")
    if agent and not any(v.get("hostPath", {}).get("path") in NETNS_DIRS for v in volumes.values()):
        fail(f"no hostPath volume for the pods' namespaces ({' or '.join(NETNS_DIRS)})")
    config["socket"] = root + socket
    for c in containers:
        command = c.get("command", [])
        if command[1:2] == ["device-plugin"]:
            if "--socket" in command:
                fail("enimd device-plugin has its own --socket; the test follows the ConfigMap's")
            command += ["--socket", root + socket]

    for c in containers:
        c["image"] = image
        c.pop("ports", None)
        # podman resolves no spec.nodeName (there is no scheduler): the
        # node's name is given as a value. The static provider ignores it.
        for e in c.get("env", []):
            if e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
                del e["valueFrom"]
                e["value"] = "e2e-node"
    if spec.get("restartPolicy", "Always") != "Always":
        fail(f"a DaemonSet's pods restart Always, not {spec['restartPolicy']}")
    spec["restartPolicy"] = "OnFailure"
    cm = copy.deepcopy(cm)
    cm["data"][keys[0]] = "\n".join(toml_dump(config)) + "\n"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name or ds["metadata"]["name"],
            "namespace": ds["metadata"].get("namespace"),
            "labels": template["metadata"]["labels"],
            "annotations": {"io.podman.annotations.init.container.type": "always"},
        },
        "spec": spec,
    }
    yaml.SafeDumper.add_representer(str, literal_blocks)
    # The device plugin reads no ConfigMap.
    yaml.safe_dump_all([cm, pod] if agent else [pod], sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
