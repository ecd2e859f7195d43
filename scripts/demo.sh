#!/usr/bin/env bash
# enim end to end on this machine, no cloud needed. It builds the binaries,
# makes a sandbox: a "host" namespace holding two veth pairs that stand in
# for ENIs, a gateway namespace at their far ends, and two pod namespaces.
# Then it starts enimd (static provider) in the sandbox host, execs the
# enim CNI plugin as a runtime would to ADD both pods, shows their
# interfaces and pings the gateway from each, DELs them, shows the ENIs back
# home, and removes everything. It never touches this machine's own
# interfaces.
#
#   scripts/demo.sh          as yourself: builds, then asks sudo for the sandbox
#   sudo scripts/demo.sh     the same; the build still runs as you ($SUDO_USER)
#
# The build never runs as root: cargo and its caches live in your home,
# and a root-owned target/ would lock your own builds out of it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib.sh"
build() { (cd "$root" && cargo build --quiet -p enim -p enim-cni --bins); }
if [ "${1:-}" = --built ]; then
  shift
elif [ "$(id -u)" != 0 ]; then
  echo "== building as $(id -un)"
  build
  command -v sudo >/dev/null || { echo "demo.sh: the sandbox needs root (network namespaces): run it as root" >&2; exit 1; }
  echo "== the sandbox needs root (network namespaces): sudo"
  exec sudo "$0" --built "$@"
elif [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ]; then
  echo "== building as $SUDO_USER"
  # A login shell, for the PATH (~/.cargo/bin) of that user's profile;
  # runuser (util-linux) is there wherever root is, sudo or not.
  runuser -u "$SUDO_USER" -- bash -lc "cd '$root' && cargo build --quiet -p enim -p enim-cni --bins"
else
  echo "== building (as root: no other user ran sudo)"
  build
fi
need_root demo.sh "it creates network namespaces"
bin="$root/target/debug"

tag="enimdemo$$"
host="$tag-host"; gw="$tag-gw"
work=$(mktemp -d)
enimd_pid=""
cleanup() {
  [ -n "$enimd_pid" ] && kill "$enimd_pid" 2>/dev/null && wait "$enimd_pid" 2>/dev/null || true
  for ns in "$tag-pod1" "$tag-pod2" "$host" "$gw"; do ip netns del "$ns" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

show() { printf '$ %s\n' "$*"; "$@"; }

step "sandbox: host $host, gateway $gw, two veth ENIs"
for ns in "$host" "$gw" "$tag-pod1" "$tag-pod2"; do ip netns add "$ns"; done
cat > "$work/enimd.toml" <<TOML
socket = "$work/enimd.sock"
checkpoint = "$work/state/checkpoint.json"
gc_interval = "0s"

[provider]
type = "static"
TOML
for i in 0 1; do
  mac="02:e1:de:00:00:0$((i + 1))"
  veth_eni "$host" "$gw" "$i" "$mac" 9000 "10.78.$i.1/24"
  { static_eni "eni-demo-$i" "$mac" "10.78.$i"; echo "mtu = 9000"; } >> "$work/enimd.toml"
done
show ip -n "$host" -o link show

step "starting enimd in $host"
ip netns exec "$host" "$bin/enimd" --config "$work/enimd.toml" 2>"$work/enimd.log" &
enimd_pid=$!
for _ in $(seq 100); do [ -S "$work/enimd.sock" ] && break; sleep 0.05; done
[ -S "$work/enimd.sock" ] || { cat "$work/enimd.log"; echo "enimd did not start" >&2; exit 1; }
conf="{\"cniVersion\":\"1.1.0\",\"name\":\"demo\",\"type\":\"enim\",\"socket\":\"$work/enimd.sock\"}"

cni() { # verb pod
  CNI_COMMAND=$1 CNI_CONTAINERID="demo-$2" CNI_NETNS="/run/netns/$tag-$2" CNI_IFNAME=eth0 \
    CNI_PATH="$bin" CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=$2" \
    "$bin/enim" <<<"$conf"
}

for pod in pod1 pod2; do
  step "CNI ADD $pod"
  cni ADD "$pod" | python3 -m json.tool
  show ip -n "$tag-$pod" addr show eth0
  gwaddr=$(ip -n "$tag-$pod" -4 route show default | awk '{print $3}')
  show ip netns exec "$tag-$pod" ping -c 1 -W 2 "$gwaddr"
done

step "what enimd holds"
show "$bin/enimctl" --socket "$work/enimd.sock" enis
show "$bin/enimctl" --socket "$work/enimd.sock" attachments

for pod in pod1 pod2; do
  step "CNI DEL $pod"
  cni DEL "$pod"
done

step "the ENIs are home, with their host names and MTU"
show ip -n "$host" -o link show
show "$bin/enimctl" --socket "$work/enimd.sock" enis
step "done; cleaning up"
