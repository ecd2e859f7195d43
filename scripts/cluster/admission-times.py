#!/usr/bin/python3
"""What the EniPolicy webhook adds to a pod's creation, timed from a client:

    admission-times.py KUBECONFIG NS_IN NS_OUT N

Creates N pods in each of two namespaces as server-side dry runs (the API
server runs every admission step, webhooks included, and stores nothing),
interleaved one by one: NS_IN is in the webhook's scope and selected by a
policy, NS_OUT is labelled enim.io/admission=ignore, so the API server
never calls the webhook for it. Then, for each namespace alone, N more with
8 clients at once. Prints the p50 and p99 of each namespace's latency,
their difference (the webhook's share), and each one's throughput; exits 1
if any creation failed.

The client certificate, key, CA and server come from KUBECONFIG (a
client-certificate kubeconfig, as scripts/cluster/pki.sh writes them).
"""

import http.client
import json
import ssl
import statistics
import sys
import threading
import time
from urllib.parse import urlparse

CLIENTS = 8


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


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    path, ns_in, ns_out, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    cfg = kubeconfig(path)
    conn = connection(*cfg)
    times = {ns_in: [], ns_out: []}
    try:
        for i in range(n):
            # Alternate which goes first, so neither always follows the other.
            order = (ns_in, ns_out) if i % 2 == 0 else (ns_out, ns_in)
            for ns in order:
                times[ns].append(create(conn, ns, f"lat-{i}"))
        rates = {ns: parallel(cfg, ns, n) for ns in (ns_in, ns_out)}
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


if __name__ == "__main__":
    main()
