#!/usr/bin/env bash
# The DaemonSet of deploy/ run for real on a sandbox node, in both modes.
#
#   scripts/e2e-deploy.sh [--debug] [--no-build] [--keep] [--mode MODE]
#
#   --debug     image from the dev-profile binaries (CI: they are built
#               already) instead of --release
#   --no-build  do not run cargo; package what target/ holds
#   --keep      leave the namespaces, pods and temp dir for a look (the
#               cleanup commands are printed)
#   --mode MODE primary or secondary only (default: both)
#
# The node is a network namespace holding veth pairs that stand in for ENIs,
# their far ends in a gateway namespace. scripts/e2e-pod.py turns the
# DaemonSet's pod template and the ConfigMap (its provider replaced by the
# sandbox's static ENIs) into a Pod; `podman kube play` runs it with the
# node namespace as its host network, hostPath volumes under a temp dir and
# every securityContext setting as the manifest has it. Then, per mode
# (primary, secondary):
#
#   - install-cni put the plugin and the conflist in the hostPath dirs;
#   - podman applied the manifest's privileges (capabilities, read-only
#     root, not privileged, uid 0);
#   - enimd is ready: /readyz and /metrics answer on the node's loopback;
#   - podman as the node's runtime (CNI backend, the installed conflist and
#     plugin dir) runs a busybox container on an enim ENI, which pings its
#     gateway; after it exits the ENI is home under its host name;
#   - upgrade: while a container holds an ENI, the pod is replaced by one
#     with a rebuilt image; the ENI stays in that container throughout, the
#     new agent restores it, and the container's DEL then succeeds;
#   - the device plugin's DaemonSet as a second pod: with no capabilities it
#     gets enimd's list through its mounts and makes its socket in the
#     kubelet's dir (no kubelet registers it here), and it keeps running
#     while enimd is replaced.
#
# Needs root, podman (4.3+, with runc or crun), ip, curl, Debian's
# busybox-static (/bin/busybox) and python3-yaml. Touches none of this
# machine's interfaces; namespaces, pods, containers and images it made are
# removed on exit, pass or fail.
set -euo pipefail

debug=()
build=1
keep=0
modes=(primary secondary)
while [ $# -gt 0 ]; do
  case "$1" in
    --debug) debug=(--debug); shift ;;
    --no-build) build=0; shift ;;
    --keep) keep=1; shift ;;
    --mode) modes=("${2:?}"); shift 2 ;;
    -h|--help) sed -n '2,39p' "$0"; exit 0 ;;
    *) echo "e2e-deploy.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
. "$(dirname "$0")/lib.sh"
need_root e2e-deploy.sh "it creates namespaces and runs podman"
for tool in podman ip curl nsenter /usr/bin/python3 /bin/busybox; do
  command -v "$tool" >/dev/null || { echo "e2e-deploy.sh: $tool is missing" >&2; exit 1; }
done
/usr/bin/python3 -c 'import yaml' || { echo "e2e-deploy.sh: python3-yaml is missing" >&2; exit 1; }
# It goes into an image FROM scratch: it must need no libraries.
if ldd /bin/busybox >/dev/null 2>&1; then
  echo "e2e-deploy.sh: /bin/busybox is not static (install busybox-static)" >&2; exit 1
fi

repo=$(cd "$(dirname "$0")/.." && pwd)
tag="enime2e$$"
work=$(mktemp -d "/tmp/$tag.XXXX")
image_v1="localhost/$tag:v1"
image_v2="localhost/$tag:v2"
busybox="localhost/$tag-busybox:latest"
pod="$tag"
started=$(date +%s)

# podman's defaults for root (nofile 1048576, nproc 4194304) fail where
# root may not raise its hard limits (no CAP_SYS_RESOURCE, as in some CI
# sandboxes): every podman here runs with modest ones.
limits='default_ulimits = ["nofile=8192:8192", "nproc=4096:4096"]'
export CONTAINERS_CONF="$work/containers.conf"
printf '[containers]\n%s\n' "$limits" > "$CONTAINERS_CONF"

failures=0
results=()
pass() { results+=("PASS  $1"); echo "PASS: $1"; }
fail() { results+=("FAIL  $1"); echo "FAIL: $1" >&2; failures=$((failures + 1)); }
check() { # description command...
  local what=$1; shift
  if "$@"; then pass "$what"; else fail "$what"; fi
}

cleanup() {
  local rc=$?
  if [ "$keep" = 1 ]; then
    echo "kept: $work, namespaces $tag-*, pod $pod; remove with:"
    echo "  podman pod rm -f $pod; podman rm -f \$(podman ps -aq --filter name=$tag); ip netns del ..."
    return
  fi
  podman pod rm -f -t 5 "$pod" >/dev/null 2>&1 || true
  podman pod rm -f -t 5 "$pod-dp" >/dev/null 2>&1 || true
  # shellcheck disable=SC2046
  podman rm -f -t 2 $(podman ps -aq --filter "name=^$tag") >/dev/null 2>&1 || true
  for ns in $(ip netns list | awk -v t="$tag-" 'index($1, t) == 1 { print $1 }'); do
    ip netns del "$ns" 2>/dev/null || true
  done
  podman rmi -f "$image_v1" "$image_v2" "$busybox" >/dev/null 2>&1 || true
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT

on_node() { nsenter --net="/run/netns/$node" "$@"; }
# masquerade_table: enimd's nftables table is in the node, with its rules.
masquerade_table() { on_node nft list table inet enim | grep 'ct status dnat' >/dev/null; }
# podman as the node's container runtime, on the enim network.
runtime() { CONTAINERS_CONF="$work/$mode/runtime.conf" on_node podman "$@"; }
# The enimd container's own enimctl, as `kubectl exec POD -- enimctl`.
enimctl() { podman exec "$pod-enimd" /usr/local/bin/enimctl --socket "$root/run/enim/enimd.sock" "$@"; }

step "images: enim (deploy/Containerfile, twice: v1 and a rebuilt v2) and a busybox"
build_args=("${debug[@]}")
[ "$build" = 1 ] || build_args+=(--no-build)
"$repo/scripts/build-image.sh" "${build_args[@]}" "$image_v1"
"$repo/scripts/build-image.sh" "${debug[@]}" --no-build "$image_v2" -- --no-cache
[ "$(podman image inspect -f '{{.Id}}' "$image_v1")" != "$(podman image inspect -f '{{.Id}}' "$image_v2")" ] ||
  { echo "e2e-deploy.sh: v2 is the same image as v1" >&2; exit 1; }
mkdir -p "$work/busybox/bin"
cp /bin/busybox "$work/busybox/bin/busybox"
for applet in sh ip ping ping6 sleep cat; do ln -s busybox "$work/busybox/bin/$applet"; done
printf 'FROM scratch\nCOPY bin/ /bin/\nENTRYPOINT ["/bin/sh", "-c"]\n' > "$work/busybox/Containerfile"
podman build --pull=never -q -t "$busybox" "$work/busybox" >/dev/null

# sandbox MODE: namespaces $node (the node) and $gw, two veth ENIs
# (secondary: one, with two secondary addresses of each family), the
# sandbox's enimd.toml provider and mode in $work/$MODE/enis.toml.
sandbox() {
  local mode=$1
  node="$tag-$mode-node"; gw="$tag-$mode-gw"
  root="$work/$mode/root"
  mkdir -p "$root"
  ip netns add "$node"; ip netns add "$gw"
  ip -n "$node" link set lo up
  local n=2
  [ "$mode" = secondary ] && n=1
  {
    echo "mode = \"$mode\""
    echo '[provider]'
    echo 'type = "static"'
  } > "$work/$mode/enis.toml"
  enis=(); macs=()
  for i in $(seq 0 $((n - 1))); do
    local mac="02:e2:e0:00:0$i:01"
    veth_eni "$node" "$gw" "$i" "$mac" 1500 "10.79.$i.1/24" "fd00:79:$i::1/64"
    enis+=("eni$i"); macs+=("$mac")
    static_eni "eni-e2e-$i" "$mac" "10.79.$i" >> "$work/$mode/enis.toml"
    cat >> "$work/$mode/enis.toml" <<TOML
ipv6 = "fd00:79:$i::10/64"
gateway6 = "fd00:79:$i::1"
TOML
    if [ "$mode" = secondary ]; then
      cat >> "$work/$mode/enis.toml" <<TOML
secondary_ipv4 = ["10.79.$i.11", "10.79.$i.12"]
secondary_ipv6 = ["fd00:79:$i::11", "fd00:79:$i::12"]
TOML
    fi
  done
  # The node's runtime: podman with the CNI backend, reading the conflist
  # and the plugin where install-cni puts them (podman refuses plugin dirs
  # that do not exist, so this config is used once they do).
  cat > "$work/$mode/runtime.conf" <<CONF
[containers]
$limits

[network]
network_backend = "cni"
cni_plugin_dirs = ["$root/opt/cni/bin"]
network_config_dir = "$root/etc/cni/net.d"
CONF
}

# deploy IMAGE: the Pod from deploy/ with IMAGE, played on the node.
deploy() {
  /usr/bin/python3 "$repo/scripts/e2e-pod.py" --name "$pod" \
    "$repo/deploy" "$root" "$1" "$work/$mode/enis.toml" > "$work/$mode/pod.yaml"
  on_node podman kube play "$work/$mode/pod.yaml" >/dev/null
}

undeploy() {
  on_node podman kube down "$work/$mode/pod.yaml" >/dev/null
}

# The device plugin's DaemonSet as the pod $pod-dp, IMAGE.
deploy_plugin() {
  /usr/bin/python3 "$repo/scripts/e2e-pod.py" --name "$pod-dp" --daemonset enim-device-plugin \
    "$repo/deploy" "$root" "$1" "$work/$mode/enis.toml" > "$work/$mode/dp.yaml"
  on_node podman kube play "$work/$mode/dp.yaml" >/dev/null
}

# A line of the device plugin's log holds every TEXT within 10 s, and it
# runs.
plugin_says() { # text...
  local i
  for i in $(seq 50); do
    if has_all "$(podman logs "$pod-dp-device-plugin" 2>&1)" "$@"; then
      [ "$(podman inspect -f '{{.State.Running}}' "$pod-dp-device-plugin")" = true ] && return 0
      break
    fi
    sleep 0.2
  done
  echo "-- the device plugin's log:"; podman logs "$pod-dp-device-plugin" 2>&1 | tail -n 20
  return 1
}

# Its first list is enimd's: the mode's resource, two devices (two ENIs;
# secondary: one ENI with two addresses of each family, two pods). Then it
# made its socket in the kubelet's dir and tried to register, which fails
# here for want of a kubelet.
plugin_serving() {
  local resource=enim.io/eni
  [ "$mode" = secondary ] && resource=enim.io/ip
  plugin_says "enimd's device list" "\"resource\":\"$resource\"" '"devices":2' &&
    plugin_says "kubelet not reachable yet"
}

has_all() { # lines text...
  local lines=$1; shift
  while [ $# -gt 0 ]; do
    lines=$(grep -F -- "$1" <<<"$lines") || return 1
    shift
  done
}

wait_ready() {
  local i
  for i in $(seq 150); do
    on_node curl -fsS -o /dev/null http://127.0.0.1:9464/readyz 2>/dev/null && return 0
    sleep 0.2
  done
  return 1
}

installed() {
  local conflist="$root/etc/cni/net.d/05-enim.conflist"
  [ -x "$root/opt/cni/bin/enim" ] && [ -f "$conflist" ] &&
    [ "$(stat -c %a "$root/opt/cni/bin/enim")" = 755 ] &&
    /usr/bin/python3 - "$conflist" "$root/run/enim/enimd.sock" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
p = c["plugins"][0]
assert p["type"] == "enim" and p["socket"] == sys.argv[2], c
PY
}

# The privileges podman really gave: exactly those of the manifest.
privileges() { # container caps...
  local c=$1; shift
  local want got
  want=$(printf 'CAP_%s\n' "$@" | sort | tr '\n' ' ')
  [ $# -gt 0 ] || want=""
  got=$(podman inspect -f '{{range .EffectiveCaps}}{{.}} {{end}}' "$c" | tr ' ' '\n' | sed '/^$/d' | sort | tr '\n' ' ')
  local ro priv user
  ro=$(podman inspect -f '{{.HostConfig.ReadonlyRootfs}}' "$c")
  priv=$(podman inspect -f '{{.HostConfig.Privileged}}' "$c")
  user=$(podman inspect -f '{{.Config.User}}' "$c")
  echo "$c: caps [$got] read-only root $ro, privileged $priv, user $user"
  [ "$got" = "$want" ] && [ "$ro" = true ] && [ "$priv" = false ] && [ "$user" = 0 ]
}

metrics() {
  # Read it whole first: grep -q exits at the first match, and curl, still
  # writing into the closed pipe, would fail the check (curl error 23).
  local body
  body=$(on_node curl -fsS http://127.0.0.1:9464/metrics) && grep -q '^enim_' <<<"$body"
}

# The container's eth0 as `ip -o link` shows it.
eth0_of() { podman exec "$1" ip -o link show eth0; }
# Its name, MAC and MTU only (flags such as NO-CARRIER come and go).
eth0_id() { eth0_of "$1" | grep -o 'eth0@[^:]*\|mtu [0-9]*\|link/ether [0-9a-f:]*' | tr '\n' ' '; }

# Every ENI of the sandbox in the node, under its host name, and the agent
# holding no attachment.
home() {
  local i name
  for i in "${!enis[@]}"; do
    name=${enis[$i]}
    [ "$mode" = secondary ] && name="enis$((i + 1))"
    ip -n "$node" -o link show "$name" | grep "${macs[$i]}" >/dev/null || {
      echo "ENI ${macs[$i]} is not home as $name:"; ip -n "$node" -o link show; return 1; }
  done
  agent_holds 0 || { echo "attachments left:"; enimctl attachments; return 1; }
  # No pod veth of either kind left (secondary mode's, the host path's).
  ! ip -n "$node" -o link show | grep ': eni[mh]' >/dev/null || { echo "pod veths left:"; ip -n "$node" -o link show; return 1; }
}

# run_and_ping: a container on the enim network pings its gateway(s) and
# exits; podman's output must show no network teardown error.
run_and_ping() {
  local script="ip -o addr show eth0 && ping -c 2 -W 2 10.79.0.1"
  [ "$mode" = secondary ] && script="$script && ping6 -c 2 -W 2 fd00:79:0::1"
  runtime run --pull=never --rm --name "$tag-ping" --network enim "$busybox" "$script" > "$work/ping.out" 2>&1 || {
    cat "$work/ping.out"; return 1; }
  cat "$work/ping.out"
  ! grep -qi 'error' "$work/ping.out"
}

holder_has_eni() {
  local out
  out=$(eth0_of "$tag-holder") || return 1
  echo "$out"
  if [ "$mode" = primary ]; then
    printf '%s\n' "$out" | grep "link/ether ${macs[0]}\|link/ether ${macs[1]}" >/dev/null || return 1
  else
    podman exec "$tag-holder" ip -o addr show eth0 | grep 'inet 10\.79\.0\.1[12]/32' >/dev/null || return 1
  fi
  podman exec "$tag-holder" ping -c 1 -W 2 10.79.0.1 >/dev/null 2>&1 ||
    podman exec "$tag-holder" ping -c 1 -W 2 10.79.1.1 >/dev/null 2>&1
}

# The sandbox node's ENI as secondary mode tunes it, read in the node: the
# IPv4 values went over netlink, the IPv6 ones through the pod's mount of
# /proc/sys/net.
eni_tuned() {
  local key want got ok=0
  for kv in ipv4/conf/enis1/rp_filter=2 ipv4/conf/enis1/forwarding=1 \
    ipv4/neigh/enis1/proxy_delay=0 ipv6/neigh/enis1/proxy_delay=0 \
    ipv6/conf/enis1/proxy_ndp=1 ipv6/conf/enis1/accept_dad=0 ipv6/conf/all/forwarding=1; do
    key=${kv%=*}; want=${kv#*=}
    got=$(ip netns exec "$node" cat "/proc/sys/net/$key")
    [ "$got" = "$want" ] || { echo "$key is $got, not $want"; ok=1; }
  done
  return $ok
}

# This machine's own namespace: nothing of the run reached it.
own_sysctls() {
  cat /proc/sys/net/ipv4/ip_forward /proc/sys/net/ipv6/conf/all/forwarding | tr '\n' ' '
}

agent_holds() { # n
  local n
  n=$(enimctl --json attachments | /usr/bin/python3 -c 'import json,sys; print(len(json.load(sys.stdin)["attachments"]))') &&
    [ "$n" = "$1" ]
}

del_ok() {
  runtime stop -t 2 "$tag-holder" > "$work/stop.out" 2>&1 &&
    runtime rm "$tag-holder" >> "$work/stop.out" 2>&1 || { cat "$work/stop.out"; return 1; }
  cat "$work/stop.out"
  ! grep -qi 'error' "$work/stop.out"
}

own_before=$(own_sysctls)

# The log of the mode's enimd when a check of it failed.
agent_log() {
  if [ "$failures" != "$failed_before" ]; then
    echo "-- enimd's log ($mode):"; podman logs "$pod-enimd" 2>&1 | tail -n 40
  fi
}

# teardown: this mode's pods and namespaces go, also after a failed step,
# so the next mode starts clean (its pods take the same names).
teardown() {
  [ "$keep" = 0 ] || return 0
  runtime rm -f -t 2 "$tag-holder" >/dev/null 2>&1 || true
  [ ! -f "$work/$mode/dp.yaml" ] || on_node podman kube down "$work/$mode/dp.yaml" >/dev/null 2>&1 || true
  undeploy 2>/dev/null || true
  # What kube down left (a pod that failed half-way): one at a time, as
  # podman stops at the first name it does not know.
  podman pod rm -f -t 5 "$pod" >/dev/null 2>&1 || true
  podman pod rm -f -t 5 "$pod-dp" >/dev/null 2>&1 || true
  ip netns del "$node" 2>/dev/null || true
  ip netns del "$gw" 2>/dev/null || true
}

for mode in "${modes[@]}"; do
  step "$mode mode: sandbox node, the pod from deploy/"
  sandbox "$mode"
  failed_before=$failures
  t0=$(date +%s)
  deploy "$image_v1"
  check "$mode: install-cni put the plugin and the conflist in the hostPath dirs" installed
  if ! wait_ready; then
    fail "$mode: enimd ready (/readyz on the node's 127.0.0.1:9464)"
    agent_log
    teardown
    continue
  fi
  pass "$mode: enimd ready (/readyz on the node's 127.0.0.1:9464), $(($(date +%s) - t0)) s after kube play"
  check "$mode: /metrics answers on the node" metrics
  check "$mode: install-cni ran with no capabilities, read-only root" privileges "$pod-install-cni"
  check "$mode: enimd runs with exactly NET_ADMIN and SYS_ADMIN, read-only root, uid 0" \
    privileges "$pod-enimd" NET_ADMIN SYS_ADMIN
  if [ "$mode" = secondary ]; then
    check "$mode: the ENI is tuned in the node (IPv4 over netlink, IPv6 through the mount)" eni_tuned
  else
    # The ConfigMap's [host_path] masquerades by default: the image's nft
    # made the table, with the container's capabilities and read-only root.
    check "$mode: enimd's masquerade table (inet enim) is in the node" masquerade_table
  fi

  step "$mode: the device plugin's pod beside enimd's"
  deploy_plugin "$image_v1"
  check "$mode: enimd device-plugin serves enimd's list in the kubelet's dir" plugin_serving
  check "$mode: enimd device-plugin runs with no capabilities, read-only root, uid 0" \
    privileges "$pod-dp-device-plugin"

  step "$mode: a container on an enim ENI pings its gateway, then exits"
  check "$mode: container pinged its gateway over enim" run_and_ping
  check "$mode: after it exited, the ENI is home and the agent holds nothing" home

  step "$mode: upgrade while a container holds an ENI"
  if ! runtime run --pull=never -d --name "$tag-holder" --network enim "$busybox" "sleep 600" >/dev/null; then
    fail "$mode: a container holding an ENI started"
    agent_log
    teardown
    continue
  fi
  check "$mode: the holder has its ENI and reaches the gateway" holder_has_eni
  if [ "$mode" = primary ]; then
    # The ConfigMap's [host_path]: a veth from the pod to the node.
    check "$mode: the holder's host-path veth is in the node" \
      sh -c "ip -n '$node' -o link show | grep ': enih' >/dev/null"
  fi
  before=$(eth0_id "$tag-holder")
  # The old agent gets SIGTERM (as from the kubelet) and must exit cleanly.
  on_node podman pod stop -t 30 "$pod" >/dev/null
  check "$mode: the old enimd exited 0 on SIGTERM" \
    test "$(podman inspect -f '{{.State.ExitCode}}' "$pod-enimd")" = 0
  undeploy
  check "$mode: with the agent gone, the holder keeps its ENI" holder_has_eni
  check "$mode: with the agent gone, the device plugin runs on with the last list" \
    plugin_says "enimd does not answer"
  deploy "$image_v2"
  check "$mode: the rebuilt image's enimd is ready" wait_ready
  check "$mode: the device plugin hears from the new enimd" plugin_says "enimd answers again"
  check "$mode: the pod runs the rebuilt image" \
    test "$(podman inspect -f '{{.ImageName}}' "$pod-enimd")" = "$image_v2"
  check "$mode: the new agent restored the attachment" agent_holds 1
  check "$mode: the holder's eth0 is unchanged" test "$(eth0_id "$tag-holder")" = "$before"
  check "$mode: the holder's DEL after the upgrade succeeds" del_ok
  check "$mode: then the ENI is home and the agent holds nothing" home

  agent_log
  teardown
done

check "this machine's own ip_forward and IPv6 forwarding are as they were" \
  test "$(own_sysctls)" = "$own_before"

step "results ($(($(date +%s) - started)) s)"
printf '%s\n' "${results[@]}"
[ "$failures" = 0 ] || { echo "$failures check(s) failed" >&2; exit 1; }
