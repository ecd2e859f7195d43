#!/usr/bin/python3
"""Where a pod's start goes, from the node's logs (scripts/cluster/*-scenarios.sh):

    pod-phases.py KUBELET_LOG CONTAINERD_LOG PREFIX [ENIMD_LOG]

For each pod whose name starts with PREFIX, the times between these marks:

- `kubelet`: the kubelet's "SyncLoop ADD" to containerd's RunPodSandbox
  request: volumes, admission, and a claim's NodePrepareResources;
- `prepare`: of that, enimd's prepare of the pod's claim (its "prepared
  claim" line's took_ms; with ENIMD_LOG, claim pods only);
- `sandbox`: RunPodSandbox, the CNI ADD within it;
- `container`: the sandbox's return to the last StartContainer's return;
- `pleg`: that to the kubelet's PLEG event for the started container. The
  kubelet's generic PLEG relists the runtime once a second, so this wait is
  0-1 s and moves the pod's Ready in whole-second steps: upstream's, the
  same for any network plugin.

Prints one line per phase: the pod count, p50 and p95 in milliseconds.
"""

import datetime
import json
import re
import sys

from logtimes import containerd_time, percentile

CONTAINERD = re.compile(r'time="([^"]+)".*msg="(.*)"')
KLOG = re.compile(r"^I(\d\d)(\d\d) (\d\d:\d\d:\d\d\.\d+)\s")
POD_FIELD = re.compile(r'pod="[^/"]+/([^"]+)"|pods=\["[^/"]+/([^"]+)"\]')


def klog_time(line, year):
    m = KLOG.match(line)
    if not m:
        return None
    month, day, clock = m.groups()
    t = datetime.datetime.strptime(f"{year}-{month}-{day} {clock[:15]}", "%Y-%m-%d %H:%M:%S.%f")
    return t.replace(tzinfo=datetime.timezone.utc)


def read_containerd(path, prefix):
    """Per pod: sandbox asked, sandbox id and return, each container's start return."""
    pods, sandbox_of, started = {}, {}, {}
    with open(path, errors="replace") as f:
        for line in f:
            m = CONTAINERD.search(line)
            if not m:
                continue
            t, msg = containerd_time(m.group(1)), m.group(2)
            s = re.search(r'RunPodSandbox for name:\\"([^\\]+)\\"', msg)
            if s and s.group(1).startswith(prefix):
                p = pods.setdefault(s.group(1), {})
                r = re.search(r'returns sandbox id \\"([0-9a-f]+)\\"', msg)
                if r:
                    p["sandbox_done"] = t
                    sandbox_of[r.group(1)] = s.group(1)
                elif "returns" not in msg:
                    p["sandbox_asked"] = t
                continue
            c = re.search(r'returns container id \\"([0-9a-f]+)\\"', msg)
            sb = re.search(r'CreateContainer within sandbox \\"([0-9a-f]+)\\"', msg)
            if c and sb and sb.group(1) in sandbox_of:
                started[c.group(1)] = sandbox_of[sb.group(1)]
                continue
            st = re.search(r'StartContainer for \\"([0-9a-f]+)\\" returns successfully', msg)
            if st and st.group(1) in started:
                pods[started[st.group(1)]]["started"] = t
    return pods, started, min((p["sandbox_asked"] for p in pods.values() if "sandbox_asked" in p), default=None)


def read_kubelet(path, prefix, started, year):
    """Per pod: the first SyncLoop ADD, and the PLEG event of its started container."""
    adds, pleg = {}, {}
    with open(path, errors="replace") as f:
        for line in f:
            if "SyncLoop ADD" in line:
                m = POD_FIELD.search(line)
                name = m and (m.group(1) or m.group(2))
                if name and name.startswith(prefix) and name not in adds:
                    adds[name] = klog_time(line, year)
            elif "SyncLoop (PLEG)" in line and '"ContainerStarted"' in line:
                d = re.search(r'"Data":"([0-9a-f]+)"', line)
                if d and d.group(1) in started:
                    name = started[d.group(1)]
                    pleg.setdefault(name, klog_time(line, year))
    return adds, pleg


def read_enimd(path, prefix):
    """Per claim pod: enimd's prepare time in ms (claims are named POD-REQUEST-xxxxx)."""
    took = {}
    with open(path, errors="replace") as f:
        for line in f:
            i = line.find("{")
            if i < 0 or '"prepared claim"' not in line:
                continue
            try:
                fields = json.loads(line[i:]).get("fields", {})
            except ValueError:
                continue
            claim = fields.get("claim", "").split("/")[-1]
            if claim.startswith(prefix) and "took_ms" in fields:
                took[claim.rsplit("-", 2)[0]] = float(fields["took_ms"])
    return took


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    kubelet_log, containerd_log, prefix = sys.argv[1:4]
    pods, started, first = read_containerd(containerd_log, prefix)
    if first is None:
        sys.exit(f"pod-phases.py: no RunPodSandbox for {prefix}* in {containerd_log}")
    adds, pleg = read_kubelet(kubelet_log, prefix, started, first.year)
    phases = {k: [] for k in ("kubelet", "prepare", "sandbox", "container", "pleg")}

    def ms(a, b):
        return (b - a).total_seconds() * 1000

    for name, p in pods.items():
        if not {"sandbox_asked", "sandbox_done", "started"} <= p.keys():
            continue
        if name in adds:
            phases["kubelet"].append(ms(adds[name], p["sandbox_asked"]))
        phases["sandbox"].append(ms(p["sandbox_asked"], p["sandbox_done"]))
        phases["container"].append(ms(p["sandbox_done"], p["started"]))
        if name in pleg:
            phases["pleg"].append(ms(p["started"], pleg[name]))
    if len(sys.argv) == 5:
        phases["prepare"] = [v for k, v in read_enimd(sys.argv[4], prefix).items() if k in pods]
    for phase, v in phases.items():
        if v:
            print(f"{phase} {len(v)} {percentile(v, 50):.0f} {percentile(v, 95):.0f}")


if __name__ == "__main__":
    main()
