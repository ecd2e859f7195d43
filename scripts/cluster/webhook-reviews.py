#!/usr/bin/python3
"""The operator's own share of admissions, from its replicas' metrics:

    webhook-reviews.py METRICS_URL [METRICS_URL ...]

Reads enim_operator_webhook_review_seconds (a histogram: the time from a
review's request head to its answer) from each replica's /metrics, adds
them up and prints the reviews answered, their mean, and the bucket bounds
that hold half and 99 % of them. Exits 1 if a replica cannot be read.
"""

import re
import sys
import urllib.request

METRIC = "enim_operator_webhook_review_seconds"
BUCKET = re.compile(METRIC + r'_bucket\{le="([^"]+)"\} (\S+)')


def read(url):
    """(bucket bound -> cumulative count, sum, count) of one replica."""
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    buckets, total, count = {}, 0.0, 0
    for line in text.splitlines():
        m = BUCKET.match(line)
        if m:
            buckets[float(m.group(1))] = int(float(m.group(2)))
        elif line.startswith(METRIC + "_sum "):
            total = float(line.split()[1])
        elif line.startswith(METRIC + "_count "):
            count = int(float(line.split()[1]))
    return buckets, total, count


def bound(buckets, count, q):
    """The smallest bucket bound holding a share q of the reviews."""
    for le in sorted(buckets):
        if buckets[le] >= q * count:
            return le
    return float("inf")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    buckets, total, count = {}, 0.0, 0
    try:
        for url in sys.argv[1:]:
            b, s, c = read(url)
            for le, n in b.items():
                buckets[le] = buckets.get(le, 0) + n
            total, count = total + s, count + c
    except OSError as e:
        print(f"webhook-reviews: {e}")
        sys.exit(1)
    if count == 0:
        print("webhook-reviews: no review answered")
        sys.exit(1)
    ms = lambda s: f"{s * 1000:.2f}"
    print(f"the webhook's own handling ({len(sys.argv) - 1} replicas): {count} reviews, "
          f"mean {ms(total / count)} ms, p50 <= {ms(bound(buckets, count, 0.5))} ms, "
          f"p99 <= {ms(bound(buckets, count, 0.99))} ms")


if __name__ == "__main__":
    main()
