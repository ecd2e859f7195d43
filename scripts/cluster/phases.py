#!/usr/bin/python3
"""Where a pod's apply -> Running goes, from the components' own logs
(scripts/cluster/cloud-scenarios.sh):

    phases.py TITLE T0_NS END_NS [--at LABEL FILE REGEX]...

T0_NS and END_NS are the scenario's clock (date +%s%N): when it applied
the pod, and when it saw it Ready. Each --at is a milestone: the first line
of FILE at or after T0 that REGEX matches (ANSI colours stripped first).
A REGEX may name groups, (?P<eni>...), which later REGEXes use as {eni}
(escaped). A LABEL that starts with "?" is optional: the pod may not
pass there (a readiness probe). Milestones are sorted by time; each phase is the time from the
one before to it, labelled with what ended it. Prints one line: the total,
then every phase; a milestone not found is listed as such.

Timestamps it reads: RFC 3339 at the line's start (kubectl logs
--timestamps) or in time="..." (containerd), klog's "I1128 08:40:01.123456"
(the kubelet: this machine's zone is UTC, the year is T0's), and "@EPOCH"
(enim-vpcsim).
"""

import argparse
import datetime
import re
import sys

ANSI = re.compile(r"\x1b\[[0-9;]*m")
RFC3339 = re.compile(r'^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d))|time="([^"]+)"')
KLOG = re.compile(r"^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d+)")
EPOCH = re.compile(r"@(\d+\.\d+)")


def rfc3339_ns(stamp):
    # Python keeps microseconds: the rest of the fraction is dropped.
    m = re.match(r"(.*?)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$", stamp)
    base, frac, zone = m.group(1), (m.group(2) or "0"), m.group(3).replace("Z", "+00:00")
    t = datetime.datetime.fromisoformat(base + zone)
    return int(t.timestamp()) * 10**9 + int(frac[:9].ljust(9, "0"))


def line_ns(line, year):
    m = RFC3339.search(line)
    if m:
        return rfc3339_ns(m.group(1) or m.group(2))
    m = KLOG.match(line)
    if m:
        mon, day, hh, mm, ss, frac = m.groups()
        t = datetime.datetime(year, int(mon), int(day), int(hh), int(mm), int(ss), tzinfo=datetime.timezone.utc)
        return int(t.timestamp()) * 10**9 + int(frac[:9].ljust(9, "0"))
    m = EPOCH.search(line)
    if m:
        secs, _, frac = m.group(1).partition(".")
        return int(secs) * 10**9 + int(frac[:9].ljust(9, "0"))
    return None


def first_match(path, regex, t0, year):
    """(time, match) of the first line at or after t0 that regex matches."""
    try:
        with open(path, errors="replace") as f:
            for line in f:
                line = ANSI.sub("", line)
                m = regex.search(line)
                if not m:
                    continue
                t = line_ns(line, year)
                if t is not None and t >= t0:
                    return t, m
    except OSError:
        pass
    return None, None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("title")
    p.add_argument("t0", type=int)
    p.add_argument("end", type=int)
    p.add_argument("--at", nargs=3, action="append", default=[], metavar=("LABEL", "FILE", "REGEX"))
    a = p.parse_args()
    year = datetime.datetime.fromtimestamp(a.t0 / 1e9, datetime.timezone.utc).year
    captured, seen, missing = {}, [], []
    for label, path, pattern in a.at:
        optional = label.startswith("?")
        label = label.removeprefix("?")
        try:
            pattern = pattern.format(**{k: re.escape(v) for k, v in captured.items()})
        except KeyError as e:
            missing.append(f"{label} (no {e} captured)")
            continue
        t, m = first_match(path, re.compile(pattern), a.t0, year)
        if t is None:
            if not optional:
                missing.append(label)
            continue
        captured.update({k: v for k, v in m.groupdict().items() if v})
        seen.append((t, label))
    seen.sort()
    seen.append((a.end, "seen Ready by the scenario (status to the API, its watch)"))
    parts, prev = [], a.t0
    for t, label in seen:
        parts.append(f"{(t - prev) / 1e6:.0f} ms {label}")
        prev = t
    line = f"{a.title}: {(a.end - a.t0) / 1e6:.0f} ms = " + "; ".join(parts)
    if missing:
        line += f" (not seen: {', '.join(missing)})"
    print(line)


if __name__ == "__main__":
    sys.exit(main())
