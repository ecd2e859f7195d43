"""Times in the cluster components' logs, for the e2e rig's timing scripts
(sandbox-times.py, pod-phases.py): imported, never run."""

import datetime
import re


def containerd_time(stamp):
    """containerd's time="..." (RFC 3339 with nanoseconds; Python keeps
    microseconds)."""
    stamp = re.sub(r"(\.\d{6})\d*", r"\1", stamp).replace("Z", "+00:00")
    return datetime.datetime.fromisoformat(stamp)


def percentile(values, p):
    """The nearest-rank P-th percentile of VALUES (not empty)."""
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]
