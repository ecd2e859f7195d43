# Shell helpers the sandbox scripts share (demo.sh, e2e-deploy.sh,
# bench.sh). Source it; it sets no options and runs nothing.

# need_root SCRIPT WHY: exit unless running as root.
need_root() {
  [ "$(id -u)" = 0 ] || { echo "$1: run as root: $2" >&2; exit 1; }
}

step() { printf '\n== %s\n' "$*"; }

# veth_eni NODE GW I MAC PEER_MTU ADDR...: a veth pair standing in for an
# ENI: eniI with MAC (MTU 1500) in namespace NODE, its far end gwI in
# namespace GW, up, holding the subnet gateway's ADDRs (IPv6 ones without
# DAD, so they are usable at once).
veth_eni() {
  local node=$1 gw=$2 i=$3 mac=$4 peer_mtu=$5 addr
  shift 5
  ip -n "$node" link add "eni$i" address "$mac" mtu 1500 type veth peer name "gw$i" netns "$gw" mtu "$peer_mtu"
  for addr in "$@"; do
    case $addr in
      *:*) ip -n "$gw" addr add "$addr" dev "gw$i" nodad ;;
      *) ip -n "$gw" addr add "$addr" dev "gw$i" ;;
    esac
  done
  ip -n "$gw" link set "gw$i" up
}

# static_eni ID MAC NET: the static provider's entry for an ENI with
# address NET.10/24 and gateway NET.1 (NET: the first three octets); the
# caller appends any further keys.
static_eni() {
  printf '\n[[provider.enis]]\nid = "%s"\nmac = "%s"\nipv4 = "%s.10/24"\ngateway4 = "%s.1"\n' "$1" "$2" "$3" "$3"
}
