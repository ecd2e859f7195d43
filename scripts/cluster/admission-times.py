#!/usr/bin/python3
"""What the EniPolicy webhook adds to a pod's creation, timed from a client:

    admission-times.py KUBECONFIG NS_IN NS_OUT N [METRICS_URL ...]

Creates N pods in each of two namespaces as server-side dry runs (the API
server runs every admission step, webhooks included, and stores nothing),
interleaved one by one: NS_IN is in the webhook's scope and selected by a
policy, NS_OUT is labelled enim.io/admission=ignore, so the API server
never calls the webhook for it. Then, for each namespace alone, N more with
8 clients at once. Prints the p50 and p99 of each namespace's latency,
their difference (the webhook's share), and each one's throughput; exits 1
if any creation failed.

With the operator replicas' METRICS_URLs, also the operator's own share,
from their enim_operator_webhook_review_seconds histograms (a review's time
from its request head to its answer), for each phase: the reviews, their
mean, the bucket bounds that hold half and 99 % of them, and the
connections the API server opened meanwhile.

The client certificate, key, CA and server come from KUBECONFIG (a
client-certificate kubeconfig, as scripts/cluster/pki.sh writes them).
"""

import http.client
import json
import re
import ssl
import statistics
import sys
import threading
import time
import urllib.request
from urllib.parse import urlparse

CLIENTS = 8
REVIEWS = "enim_operator_webhook_review_seconds"
CONNECTIONS = "enim_operator_webhook_connections_total"
BUCKET = re.compile(REVIEWS + r'_bucket\{le="([^"]+)"\} (\S+)')


def kubeconfig(path):
    """server, ca, cert, key of a pki.sh kubeconfig (YAML of fixed shape)."""
    fields = {}
    with open(path) as f:
        for line in f:
            key, _, value = line.strip().partition(": ")
            if key in ("server", "certificate-authority", "client-certificate", "client-key"):
                fields[key] = value
    return (fields["server"], fields["certificate-authority"],
            fields["client-certificate"], fields["client-key"])


def connection(server, ca, cert, key):
    url = urlparse(server)
    ctx = ssl.create_default_context(cafile=ca)
    ctx.load_cert_chain(cert, key)
    return http.client.HTTPSConnection(url.hostname, url.port, context=ctx, timeout=30)


def pod(name, ns):
    return json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    })


def create(conn, ns, name):
    """One dry-run creation: seconds it took; raises on a refusal."""
    body = pod(name, ns)
    t0 = time.perf_counter()
    conn.request("POST", f"/api/v1/namespaces/{ns}/pods?dryRun=All", body,
                 {"Content-Type": "application/json"})
    reply = conn.getresponse()
    data = reply.read()
    took = time.perf_counter() - t0
    if reply.status != 201:
        raise RuntimeError(f"{ns}/{name}: HTTP {reply.status}: {data[:300]!r}")
    return took


def pct(samples, q):
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


def parallel(cfg, ns, n):
    """n creations in ns by CLIENTS clients at once: creations per second."""
    errors = []

    def client(i):
        conn = connection(*cfg)
        try:
            for j in range(i, n, CLIENTS):
                create(conn, ns, f"tp-{j}")
        except Exception as e:  # reported below, with the others
            errors.append(str(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(errors[0])
    return n / (time.perf_counter() - t0)


def reviews(urls):
    """The replicas' review histograms added up: (bound -> cumulative
    count, sum of seconds, count, connections accepted)."""
    buckets, total, count, conns = {}, 0.0, 0, 0
    for url in urls:
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
        for line in text.splitlines():
            m = BUCKET.match(line)
            if m:
                le = float(m.group(1))
                buckets[le] = buckets.get(le, 0) + int(float(m.group(2)))
            elif line.startswith(REVIEWS + "_sum "):
                total += float(line.split()[1])
            elif line.startswith(REVIEWS + "_count "):
                count += int(float(line.split()[1]))
            elif line.startswith(CONNECTIONS + " "):
                conns += int(float(line.split()[1]))
    return buckets, total, count, conns


def own_share(label, before, after):
    """Prints the reviews answered between two readings of `reviews`."""
    count = after[2] - before[2]
    if count <= 0:
        print(f"the webhook's own handling, {label}: no review answered")
        return
    held = {le: n - before[0].get(le, 0) for le, n in after[0].items()}
    bound = lambda q: min((le for le, n in held.items() if n >= q * count), default=float("inf"))
    ms = lambda s: f"{s * 1000:.2f}"
    print(f"the webhook's own handling, {label}: {count} reviews, mean {ms((after[1] - before[1]) / count)} ms, "
          f"p50 <= {ms(bound(0.5))} ms, p99 <= {ms(bound(0.99))} ms; {after[3] - before[3]} new connections")


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    path, ns_in, ns_out, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    urls = sys.argv[5:]
    cfg = kubeconfig(path)
    conn = connection(*cfg)
    times = {ns_in: [], ns_out: []}
    try:
        start = reviews(urls)
        for i in range(n):
            # Alternate which goes first, so neither always follows the other.
            order = (ns_in, ns_out) if i % 2 == 0 else (ns_out, ns_in)
            for ns in order:
                times[ns].append(create(conn, ns, f"lat-{i}"))
        one_by_one = reviews(urls)
        rates = {ns: parallel(cfg, ns, n) for ns in (ns_in, ns_out)}
        at_once = reviews(urls)
    except Exception as e:
        print(f"admission-times: {e}")
        sys.exit(1)
    ms = lambda s: f"{s * 1000:.1f}"
    for ns, label in ((ns_in, "through the webhook"), (ns_out, "webhook skipped")):
        t = times[ns]
        print(f"{label} ({ns}): {n} dry-run creations, p50 {ms(pct(t, 0.5))} ms, "
              f"p99 {ms(pct(t, 0.99))} ms, mean {ms(statistics.mean(t))} ms; "
              f"{CLIENTS} clients: {rates[ns]:.0f} creations/s")
    print(f"the webhook's share: p50 +{ms(pct(times[ns_in], 0.5) - pct(times[ns_out], 0.5))} ms, "
          f"p99 +{ms(pct(times[ns_in], 0.99) - pct(times[ns_out], 0.99))} ms; "
          f"throughput {rates[ns_in] / rates[ns_out]:.2f} x")
    if urls:
        own_share("one by one", start, one_by_one)
        own_share(f"{CLIENTS} clients", one_by_one, at_once)


if __name__ == "__main__":
    main()
