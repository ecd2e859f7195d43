#!/usr/bin/env bash
# enim under a real Kubernetes: a one-node cluster of upstream components
# (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
# kube-proxy in iptables mode, containerd 2.x, CoreDNS), built from their Go
# modules by scripts/cluster/build.sh, in sandbox namespaces
# (scripts/cluster/node.sh), with enim installed by `kubectl apply` of
# deploy/. Then named scenarios, each a PASS or FAIL line, in both modes,
# a third run with the control plane: enim-operator and the agents'
# `cluster` provider (primary mode), and a fourth with DRA: pods claim ENIs
# by their attributes through ResourceClaims (primary mode, [dra] on, the
# device plugin's DaemonSet deleted; scripts/cluster/dra-scenarios.sh).
# Opt-in, not in the default list yet: `cloud`, several nodes whose ENIs
# come from the EC2 API (moto) through enim-operator and hot-plug into them
# through the VPC simulator (scripts/cluster/cloud.sh).
#
#   scripts/e2e-cluster.sh [--debug] [--no-build] [--mode LIST] [--keep]
#                          [--restarts N] [--only SCENARIO,...]
#
#   --debug       enim's image from dev-profile binaries (CI) instead of release
#   --no-build    use what target/ holds; do not run cargo
#   --mode LIST   primary, secondary, operator, dra, cloud: these runs only,
#                 in this order (comma-separated; default: the first four)
#   --keep        leave the last cluster running and print how to reach it
#   --restarts N  enimd restarts of each kind in the admission scenario
#                 (default 20)
#   --only LIST   run only these scenarios (names as printed), for debugging
#
# Needs root, Go (the components), podman (builds the images, FROM scratch:
# nothing is pulled), runc, openssl, Debian's busybox-static and catatonit,
# python3-yaml, nftables, conntrack. Nothing binds to or routes through this
# machine's own interfaces; everything it made is removed on exit, pass or
# fail (but with --keep).
set -euo pipefail

debug=()
build=1
keep=0
modes=(primary secondary operator dra)
restarts=20
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --debug) debug=(--debug); shift ;;
    --no-build) build=0; shift ;;
    --keep) keep=1; shift ;;
    --mode) IFS=, read -ra modes <<<"${2:?}"; shift 2 ;;
    --restarts) restarts=${2:?}; shift 2 ;;
    --only) only=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "e2e-cluster.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

repo=$(cd "$(dirname "$0")/.." && pwd)
. "$repo/scripts/lib.sh"
. "$repo/scripts/cluster/node.sh"
. "$repo/scripts/cluster/cloud.sh"
need_root e2e-cluster.sh "it creates namespaces, mounts and cgroups"
for tool in go podman runc openssl nsenter unshare ip nft conntrack /usr/bin/python3 /bin/busybox /usr/bin/catatonit; do
  command -v "$tool" >/dev/null || { echo "e2e-cluster.sh: $tool is missing" >&2; exit 1; }
done

t_start=$(date +%s)
elapsed() { echo "$(($(date +%s) - t_start)) s"; }
failures=0
results=()
pass() { results+=("PASS  [$run] $1"); echo "PASS: [$run] $1"; }
fail() { results+=("FAIL  [$run] $1"); echo "FAIL: [$run] $1" >&2; failures=$((failures + 1)); }
wanted() { [ -z "$only" ] || [[ ",$only," == *",$1,"* ]]; }
# scenario NAME FUNCTION: runs it (when wanted), PASS when it returns 0.
scenario() {
  local name=$1 f=$2
  wanted "$f" || return 0
  step "[$run] $name ($(elapsed))"
  if "$f"; then pass "$name"; else fail "$name"; diagnose; fi
  clean
}

images=/var/tmp/enimk8s-images-$$
IMAGES_DIR=$images
# The performance scenario's figures, printed again at the end.
PERF_OUT=$images/perf.txt
PAUSE_IMAGE=localhost/enim-e2e/pause:1
BUSYBOX=localhost/enim-e2e/busybox:1
ENIM_IMAGE=docker.io/library/enim:0.1.0

# What removes the current run's cluster (cloud.sh's cloud_down for a cloud run).
down=cluster_down
cleanup() {
  local rc=$?
  if [ "$keep" = 1 ] && [ -n "$work" ] && [ "$down" = cloud_down ]; then
    echo "kept: $work; reach it with:"
    echo "  nsenter --net=/run/netns/$vpc -- $bin/kubectl --kubeconfig $work/pki/admin.kubeconfig get pods -A"
    echo "remove with: bash -c 'repo=$repo; . $repo/scripts/cluster/node.sh; . $repo/scripts/cluster/cloud.sh; work=$work tag=$tag vpc=$vpc; cloud_down; rm -rf $work'"
  elif [ "$keep" = 1 ] && [ -n "$work" ]; then
    echo "kept: $work; reach it with:"
    echo "  nsenter --mount=$work/ns/mnt --net=/run/netns/$node -- $bin/kubectl --kubeconfig $work/pki/admin.kubeconfig get pods -A"
    echo "remove with: bash -c '. $repo/scripts/cluster/node.sh; work=$work node=$node gw=$gw cgroot=$cgroot; cluster_down'"
  elif [ -n "$work" ]; then
    "$down"
    rm -rf "$work"
  fi
  rm -rf "$images"
  exit "$rc"
}
trap cleanup EXIT

step "components ($(elapsed))"
t0=$(date +%s)
"$repo/scripts/cluster/build.sh"
bin=$("$repo/scripts/cluster/build.sh" --print-dir)
BUILD_S=$(($(date +%s) - t0))

step "images: pause, busybox, coredns, enim ($(elapsed))"
mkdir -p "$images"
# image NAME DIR: podman builds DIR's Containerfile; saved for ctr import.
image() {
  podman build --pull=never -q -t "$1" "$2" >/dev/null
  podman save -q -o "$images/$(echo "$1" | tr '/:' '__').tar" "$1"
}
mkdir -p "$images/pause" "$images/busybox/bin" "$images/coredns"
cp /usr/bin/catatonit "$images/pause/pause"
printf 'FROM scratch\nCOPY pause /pause\nENTRYPOINT ["/pause", "-P"]\n' > "$images/pause/Containerfile"
image "$PAUSE_IMAGE" "$images/pause"
cp /bin/busybox "$images/busybox/bin/busybox"
for applet in sh ip ping sleep cat echo nc nslookup httpd hostname wget ls mkdir true; do
  ln -s busybox "$images/busybox/bin/$applet"
done
printf 'FROM scratch\nCOPY bin/ /bin/\nENTRYPOINT ["/bin/sh", "-c"]\n' > "$images/busybox/Containerfile"
image "$BUSYBOX" "$images/busybox"
cp "$bin/coredns" "$images/coredns/coredns"
printf 'FROM scratch\nCOPY coredns /coredns\nENTRYPOINT ["/coredns"]\n' > "$images/coredns/Containerfile"
image localhost/enim-e2e/coredns:1 "$images/coredns"
build_args=("${debug[@]}")
[ "$build" = 1 ] || build_args+=(--no-build)
"$repo/scripts/build-image.sh" "${build_args[@]}" "$ENIM_IMAGE"
podman save -q -o "$images/enim.tar" "$ENIM_IMAGE"
if [[ " ${modes[*]} " == *" cloud "* ]]; then
  step "enim-vpcsim ($(elapsed))"
  if [ "$build" = 1 ]; then (cd "$repo" && cargo build --quiet -p enim-testkit --features vpc --bin enim-vpcsim); fi
  [ -x "$(vpcsim_bin)" ] || { echo "e2e-cluster.sh: $(vpcsim_bin) is not built" >&2; exit 1; }
fi

# enim_install MODE PROVIDER [dra]: deploy/ as a user applies it, the
# ConfigMap's provider replaced by the sandbox's static ENIs (PROVIDER
# static), or by the `cluster` provider, with the operator's [cloud] the
# sandbox's ENIs as a static inventory (PROVIDER cluster). The operator runs
# one replica: its two are spread over nodes, and this cluster has one.
# With dra: [dra] on, and the device plugin's DaemonSet deleted after the
# apply, as a user of DRA does (it would exit there anyway).
enim_install() {
  local dra=()
  [ "${3:-}" = dra ] && dra=(--dra)
  python3 "$repo/scripts/cluster/enim-config.py" "$repo/deploy" "$1" "$work/etc/enis.toml" "$2" "$NODE_NAME" "$work/etc/operator.yaml" "${dra[@]}" > "$work/etc/configmap.yaml"
  local f
  for f in "$repo"/deploy/*.yaml; do
    case $f in
      */20-configmap.yaml) f=$work/etc/configmap.yaml ;;
      */50-operator.yaml) [ "$2" = cluster ] || continue; f=$work/etc/operator.yaml ;;
    esac
    # The CRD before anything that names it.
    k apply -f - < "$f" >/dev/null
    case $f in */05-crd-*) k wait --for=condition=Established crd/netresourcesets.enim.io --timeout=60s >/dev/null ;; esac
  done
  k apply -f - < "$repo/scripts/cluster/coredns.yaml" >/dev/null
  if [ ${#dra[@]} -gt 0 ]; then
    k -n enim-system delete daemonset enim-device-plugin --wait=true >/dev/null
  fi
}

diagnose() {
  echo "--- pods"; k get pods -A -o wide 2>&1 | tail -n 30 || true
  echo "--- enim's attachments"; enimctl attachments 2>&1 || true
  echo "--- events"; k get events -A --sort-by=.lastTimestamp 2>&1 | grep -v ' Normal ' | tail -n 15 || true
  echo "--- enimd's log"; k -n enim-system logs ds/enimd -c enimd --tail=15 2>&1 || true
  if [ "$run" = dra ]; then
    echo "--- resourceclaims"; k get resourceclaims -A -o wide 2>&1 || true
    echo "--- resourceslices"; k get resourceslices 2>&1 || true
    echo "--- the kubelet on DRA"
    grep 'RegisterPlugin' "$work/logs/kubelet.log" 2>/dev/null | tail -n 2 || true
    grep -i 'dra\|resourceclaim\|prepare' "$work/logs/kubelet.log" 2>/dev/null | tail -n 8 || true
  fi
  if [ "$provider" = cluster ] || [ "$provider" = aws ]; then
    echo "--- netresourcesets"; k get nrs -o wide 2>&1 || true
    echo "--- enim-operator's log"; k -n enim-system logs deploy/enim-operator --tail=15 2>&1 || true
  fi
  if [ "$keep" = 1 ]; then echo "(--keep: stopping here for a look)"; exit 1; fi
}

# One cluster per mode.
for run in "${modes[@]}"; do
  # The operator's run is primary mode, its ENIs through NetResourceSets;
  # DRA's is primary mode with ENIs that say where they are (placement).
  case $run in
    operator) mode=primary provider=cluster ;;
    dra) mode=primary provider=static ;;
    *) mode=$run provider=static ;;
  esac
  step "[$run] cluster up ($(elapsed))"
  if [ -n "$work" ]; then "$down"; rm -rf "$work"; fi
  down=cluster_down
  cluster_init "$bin"
  if [ "$run" = cloud ]; then cloud_run; continue; fi
  # primary: 4 ENIs, each a pod's. secondary: 2 ENIs with 6 secondary
  # addresses each, 12 pods' worth.
  . "$repo/scripts/cluster/scenarios.sh"
  if [ "$run" = dra ]; then cluster_up 4 0 "" dra_eni_placement
  elif [ "$mode" = primary ]; then cluster_up 4 0 ""
  else cluster_up 2 6 ""; fi
  echo "cluster up in $CLUSTER_START_MS ms"
  if [ "$run" = dra ]; then enim_install "$mode" "$provider" dra; else enim_install "$mode" "$provider"; fi
  run_scenarios
done

[ "$keep" = 1 ] || { "$down"; rm -rf "$work"; work=""; }
step "results ($(elapsed); components $BUILD_S s)"
printf '%s\n' "${results[@]}"
[ -s "$PERF_OUT" ] && { echo "performance:"; cat "$PERF_OUT"; }
npass=$(printf '%s\n' "${results[@]}" | grep -c '^PASS' || true)
echo "e2e-cluster: $npass passed, $failures failed"
[ "$failures" = 0 ]
