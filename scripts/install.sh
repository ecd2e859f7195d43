#!/usr/bin/env bash
# Installs enim on a node: the `enim` CNI plugin into the CNI bin dir,
# `enimd` and `enimctl` into a bin dir, an example conflist into net.d, an
# example enimd config (never overwriting an existing one), and a systemd
# unit for enimd (deploy/systemd/enimd.service, its ExecStart pointing at
# the enimd and config installed here). It enables nothing: see the end of
# its output.
#
#   scripts/install.sh [--cni-bin-dir DIR] [--net-d-dir DIR] [--bin-dir DIR]
#                      [--config-dir DIR] [--systemd-dir DIR] [--no-systemd]
#                      [--from DIR]
#
# Defaults: /opt/cni/bin, /etc/cni/net.d, /usr/local/bin, /etc/enim,
# /etc/systemd/system. --from DIR takes already built binaries from DIR
# instead of running `scripts/build-bins.sh --release` (honours
# CARGO_TARGET_DIR).
set -euo pipefail

cni_bin_dir=${CNI_BIN_DIR:-/opt/cni/bin}
net_d_dir=${CNI_NET_D_DIR:-/etc/cni/net.d}
bin_dir=${BIN_DIR:-/usr/local/bin}
config_dir=${ENIM_CONFIG_DIR:-/etc/enim}
systemd_dir=${SYSTEMD_DIR:-/etc/systemd/system}
from=""

die() { echo "install.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --cni-bin-dir) cni_bin_dir=${2:?}; shift 2 ;;
    --net-d-dir) net_d_dir=${2:?}; shift 2 ;;
    --bin-dir) bin_dir=${2:?}; shift 2 ;;
    --config-dir) config_dir=${2:?}; shift 2 ;;
    --systemd-dir) systemd_dir=${2:?}; shift 2 ;;
    --no-systemd) systemd_dir=""; shift ;;
    --from) from=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "$from" ]; then
  "$root/scripts/build-bins.sh" --release
  from=$(cd "$root" && realpath -m "${CARGO_TARGET_DIR:-target}")/release
fi
for b in enim enimd enimctl; do
  [ -x "$from/$b" ] || die "$from/$b is missing: build first or drop --from"
done

# Copy to a temp name and rename, so a runtime never execs half a binary.
place() { # src dst-dir name mode
  install -d "$2"
  install -m "$4" "$1" "$2/.$3.tmp"
  mv -f "$2/.$3.tmp" "$2/$3"
}
place "$from/enim" "$cni_bin_dir" enim 0755
place "$from/enimd" "$bin_dir" enimd 0755
place "$from/enimctl" "$bin_dir" enimctl 0755

conflist=$(mktemp)
cat > "$conflist" <<'JSON'
{
  "cniVersion": "1.0.0",
  "cniVersions": ["1.0.0", "1.1.0"],
  "name": "enim",
  "plugins": [
    {
      "type": "enim",
      "socket": "/run/enim/enimd.sock"
    }
  ]
}
JSON
place "$conflist" "$net_d_dir" 05-enim.conflist 0644
rm -f "$conflist"
# enim's conflist under its previous name (before 05-, so that it sorts
# ahead of AWS VPC CNI's 10-aws.conflist): gone once the new one is there.
previous="$net_d_dir/10-enim.conflist"
if [ -f "$previous" ] && grep -q '"type": *"enim"' "$previous"; then
  rm -f "$previous"
  echo "removed enim's previous conflist $previous"
fi

install -d "$config_dir"
if [ ! -e "$config_dir/enimd.toml" ]; then
  example=$(mktemp)
  cat > "$example" <<'TOML'
# enimd configuration. Flags (enimd --help) override these keys.
socket = "/run/enim/enimd.sock"
checkpoint = "/var/lib/enim/checkpoint.json"
gc_interval = "10s"
gc_grace = "30s"
log_format = "text"

# ENIs declared by hand (bare metal, labs). One [[provider.enis]] per ENI.
[provider]
type = "static"

[[provider.enis]]
id = "eni-0001"
mac = "02:00:00:00:00:01"
ipv4 = "10.0.1.10/24"
gateway4 = "10.0.1.1"
# ipv6 = "fd00:1::10/64"
# gateway6 = "fd00:1::1"
# mtu = 9001
TOML
  place "$example" "$config_dir" enimd.toml 0644
  rm -f "$example"
fi

if [ -n "$systemd_dir" ]; then
  # The unit runs the enimd and config installed above.
  unit=$(mktemp)
  sed "s#^ExecStart=.*#ExecStart=$bin_dir/enimd --config $config_dir/enimd.toml#" \
    "$root/deploy/systemd/enimd.service" > "$unit"
  grep -q "^ExecStart=$bin_dir/enimd " "$unit" || die "deploy/systemd/enimd.service has no ExecStart"
  place "$unit" "$systemd_dir" enimd.service 0644
  rm -f "$unit"
fi

echo "installed: $cni_bin_dir/enim, $bin_dir/enimd, $bin_dir/enimctl"
echo "conflist:  $net_d_dir/05-enim.conflist"
echo "config:    $config_dir/enimd.toml (edit the ENIs, then start enimd)"
if [ -n "$systemd_dir" ]; then
  echo "unit:      $systemd_dir/enimd.service; start it now and at every boot with"
  echo "           systemctl daemon-reload && systemctl enable --now enimd"
fi
