#!/usr/bin/python3
"""RunPodSandbox durations from containerd's log (scripts/cluster/scenarios.sh):

    sandbox-times.py LOG PREFIX

containerd 2.x's CRI logs 'RunPodSandbox for name:\"NAME\" uid:...' when a
sandbox is asked for and the same line with "returns sandbox id" when it is
done, each with its time. Prints, for the pods whose name starts with
PREFIX: count, p50 and p95 in milliseconds, one line.
"""

import re
import sys

from logtimes import containerd_time, percentile

LINE = re.compile(r'time="([^"]+)".*RunPodSandbox for name:\\"([^\\]+)\\"')


def main():
    log, prefix = sys.argv[1:]
    started, took = {}, []
    with open(log, errors="replace") as f:
        for line in f:
            m = LINE.search(line)
            if not m or not m.group(2).startswith(prefix):
                continue
            name = m.group(2)
            if "returns sandbox id" in line:
                if name in started:
                    took.append((containerd_time(m.group(1)) - started.pop(name)).total_seconds() * 1000)
            elif "returns" not in line:
                started[name] = containerd_time(m.group(1))
    if not took:
        sys.exit(f"sandbox-times.py: no RunPodSandbox for {prefix}* in {log}")
    print(f"{len(took)} {percentile(took, 50):.1f} {percentile(took, 95):.1f}")


if __name__ == "__main__":
    main()
