# Scenarios of the cloud run (scripts/cluster/cloud.sh): ENIs from moto
# through enim-operator, hot-plugged by enim-vpcsim, pods on them across
# nodes. Sourced by cloud_run after scenarios.sh's helpers (pod, ready,
# in_pod, http_get, clean's parts); each s_* returns 0 for PASS.

. "$repo/scripts/cluster/scenarios.sh"
. "$repo/scripts/cluster/helm-scenarios.sh"

# What the operator keeps on every node (cloud-values.py's operator config:
# min_allocate 2, pre_allocate 1).
CLOUD_MIN_ENIS=2
# The secondary pool's, in addresses (min_allocate 8).
CLOUD_MIN_ADDRESSES=8
# The most free ones kept before the operator drains (pre_allocate +
# max_above_watermark), per pool.
CLOUD_HIGH_ENIS=3
CLOUD_HIGH_ADDRESSES=12

# cloud_nrs NODE JSONPATH: a field of NODE's NetResourceSet.
cloud_nrs() { k get nrs "$1" -o "jsonpath=$2"; }
# moto_enis: every ENI in moto (cloud.py enis), JSON.
moto_enis() { on_vpc python3 "$repo/scripts/cluster/cloud.py" enis "$work/cloud.json"; }
on_vpc() { nsenter --net="/run/netns/$vpc" -- "$@"; }
node_instance() { cloud_field ".nodes[$(($1 - 1))].instance_id"; }

# nrs_filled I: node I's set holds its pool's minimum (CLOUD_MIN_ENIS
# ENIs; secondary mode: CLOUD_MIN_ADDRESSES addresses) and its agent counts
# every ENI.
nrs_filled() {
  local n=enim-e2e-node$1 spec status
  spec=$(cloud_nrs "$n" '{.spec.enis[*].id}' | wc -w)
  status=$(cloud_nrs "$n" '{.status.summary.enis}')
  [ "$status" = "$spec" ] || return 1
  if [ "$(pool_mode "$1")" = secondary ]; then
    [ "$(set_units "$1")" -ge "$CLOUD_MIN_ADDRESSES" ]
  else
    [ "$spec" -ge "$CLOUD_MIN_ENIS" ]
  fi
}
# pool_mode I: the mode of node I's pool.
pool_mode() { [ "$(cloud_pool "$1")" = secondary ] && echo secondary || echo primary; }
# set_units I: what node I's set holds in its pool's unit: ENIs, or in
# secondary mode the addresses pods get.
set_units() { set_items "$1" | grep -c . || true; }

# mac_on_node I MAC: the device with MAC is in node I's netns (not in a
# pod's).
mac_on_node() { ip -n "$tag-n$1" -o link show | grep -i "link/ether $2 " >/dev/null; }

# (1) Each node's NetResourceSet fills from moto to the watermarks; each
# ENI is in moto attached to that node's instance, tagged for the cluster,
# in the pod subnet, and its device is on that node and on no other.
s_cloud_nrs() {
  local i j id mac enis line rc=0 t0 ds
  k -n enim-system rollout status deployment/enim-operator --timeout=180s || return 1
  for ds in enimd enimd-secondary enimd-primary-dra; do
    k -n enim-system rollout status "daemonset/$ds" --timeout=180s || return 1
  done
  for i in $(seq 1 "$CLOUD_NODES"); do
    t0=$(date +%s%N)
    wait_for "enim-e2e-node$i's set to fill" 240 nrs_filled "$i" || return 1
    echo "enim-e2e-node$i: filled $((($(date +%s%N) - t0) / 1000000)) ms after the operator and agents were up"
  done
  enis=$(moto_enis)
  for i in $(seq 1 "$CLOUD_NODES"); do
    for id in $(cloud_nrs "enim-e2e-node$i" '{.spec.enis[*].id}'); do
      line=$(jq -c --arg id "$id" '.[] | select(.id == $id)' <<<"$enis")
      [ -n "$line" ] || { echo "$id (enim-e2e-node$i's spec) is not in moto"; rc=1; continue; }
      [ "$(jq -r .instance <<<"$line")" = "$(node_instance "$i")" ] ||
        { echo "$id: attached to '$(jq -r .instance <<<"$line")' in moto, not to $(node_instance "$i")"; rc=1; }
      [ "$(jq -r '.tags["enim.io/cluster"]' <<<"$line")" = enim-e2e ] ||
        { echo "$id: tags $(jq -c .tags <<<"$line")"; rc=1; }
      [ "$(jq -r .subnet <<<"$line")" = "$(cloud_field .pod_subnet)" ] ||
        { echo "$id: subnet $(jq -r .subnet <<<"$line")"; rc=1; }
      mac=$(jq -r .mac <<<"$line")
      wait_for "$id ($mac) on enim-e2e-node$i" 20 mac_on_node "$i" "$mac" || rc=1
      for j in $(seq 1 "$CLOUD_NODES"); do
        [ "$j" = "$i" ] && continue
        ! mac_on_node "$j" "$mac" || { echo "$id ($mac) is also on enim-e2e-node$j"; rc=1; }
      done
      echo "enim-e2e-node$i: $id $mac eth$(jq -r .device_index <<<"$line") $(jq -r '.addresses | join(",")' <<<"$line")"
    done
  done
  k get nrs -o wide
  operator_irsa || rc=1
  return $rc
}

# operator_irsa: the operator made those ENIs with no key anywhere: no
# Secret of keys, no key in its pods' environment, and each replica took
# web identity credentials (its ServiceAccount token exchanged at moto's
# STS for cloud.py's role, which moto then judged every EC2 call by).
operator_irsa() {
  local p env rc=0
  ! k -n enim-system get secret enim-operator-cloud >/dev/null 2>&1 || { echo "a Secret of operator keys exists"; rc=1; }
  for p in $(k -n enim-system get pods -l app.kubernetes.io/component=operator -o name); do
    env=$(k -n enim-system get "$p" -o jsonpath='{.spec.containers[0].env[*].name} {.spec.containers[0].envFrom}')
    case " $env " in
      *AWS_ACCESS_KEY_ID*|*secretRef*) echo "$p has keys in its environment: $env"; rc=1 ;;
      *AWS_WEB_IDENTITY_TOKEN_FILE*) ;;
      *) echo "$p has no web identity token file: $env"; rc=1 ;;
    esac
    k -n enim-system logs "$p" | grep '"message":"AWS fleet backend ready"' | grep '"credentials":"web identity (IRSA) credentials from STS"' >/dev/null ||
      { echo "$p did not log web identity credentials"; rc=1; }
  done
  [ $rc = 0 ] && echo "the operator: IRSA (role $(cloud_field .roles.operator)), no key anywhere"
  return $rc
}

# pod_on NODE NAME [NAMESPACE]: scenarios.sh's pod (busybox serving its
# name on 8080, one enim.io/eni), pinned to node NODE.
# The resource is the node's pool's: enim.io/eni, or enim.io/ip.
pod_on() { local mode; mode=$(pool_mode "$1"); pod "$2" node="enim-e2e-node$1" ns="${3:-default}"; }

# (2) A pod on each node runs on an ENI from moto: its podIP is the primary
# address moto assigned to an ENI attached to that node's instance, and
# that ENI's device is the pod's eth0. Through the device plugin on the
# primary pool's nodes, through a DRA claim on the primary-dra pool's.
s_cloud_pods() {
  local i rc=0
  for i in $(plugin_nodes); do pod_on "$i" "web-$i"; done
  for i in $(plugin_nodes); do ready "web-$i" 120 || return 1; done
  for i in $(plugin_nodes); do on_moto_eni "web-$i" "$i" || rc=1; done
  return $rc
}
# Migrating from AWS VPC CNI: node 1 had that CNI's conflist (the bridge
# stand-in 10-aws.conflist) and the pod `legacy` on it before enim was
# installed (cloud.sh's cloud_legacy_cni). enim's conflist sorts first, so
# a new pod there runs on an ENI from moto; `legacy` keeps running on its
# old network, never restarted, and answers there; deleted, it is torn
# down through enim's conflist (which knows no attachment of it) and goes.
s_cloud_migration() {
  local files first ip rc=0
  files=$(on_cloud_node 1 on_node ls /etc/cni/net.d | grep 'conflist$' | sort)
  first=$(sed -n 1p <<<"$files")
  [ "$first" = 05-enim.conflist ] || { echo "node 1's first conflist is '$first' ($files)"; rc=1; }
  grep -x 10-aws.conflist <<<"$files" >/dev/null || { echo "the old CNI's conflist is gone ($files)"; rc=1; }
  ip=$(k get pod legacy -o jsonpath='{.status.podIP}')
  case $ip in
    "${LEGACY_SUBNET%.*/*}".*) ;;
    *) echo "legacy's address '$ip' is not the old CNI's ($LEGACY_SUBNET)"; rc=1 ;;
  esac
  [ "$(k get pod legacy -o jsonpath='{.status.containerStatuses[0].restartCount} {.status.phase}')" = "0 Running" ] ||
    { echo "legacy: $(k get pod legacy -o wide --no-headers)"; rc=1; }
  [ "$(http_get nsenter --net="/run/netns/$tag-n1" busybox nc -w 3 "$ip" 8080)" = legacy ] ||
    { echo "legacy does not answer on $ip from its node"; rc=1; }
  pod_on 1 after-migration
  ready after-migration 120 || return 1
  on_moto_eni after-migration 1 || rc=1
  k delete pod legacy --wait=true --timeout=60s >/dev/null || { echo "legacy was not torn down within 60 s"; rc=1; }
  [ $rc = 0 ] && echo "node 1: conflists $(tr '\n' ' ' <<<"$files"); legacy kept $ip on the old CNI through the install, never restarted; after-migration on an ENI from moto; legacy deleted after the switch"
  return $rc
}

# The nodes the device plugin serves (pools primary and secondary), those
# of them in primary mode, and the nodes of pool primary-dra.
plugin_nodes() {
  local i
  for i in $(seq 1 "$CLOUD_NODES"); do
    case $(cloud_pool "$i") in primary|secondary) echo "$i" ;; esac
  done
}
primary_plugin_nodes() { local i; for i in $(plugin_nodes); do [ "$(pool_mode "$i")" = primary ] && echo "$i"; done; }
dra_nodes() { local i; for i in $(seq 1 "$CLOUD_NODES"); do [ "$(cloud_pool "$i")" = primary-dra ] && echo "$i"; done; }

# on_moto_eni POD I: POD runs on node I, on an ENI moto attached to node
# I's instance: its podIP is that ENI's primary address, eth0 its MAC; in
# secondary mode, one of that ENI's secondary addresses.
on_moto_eni() {
  local pod=$1 i=$2 ip line id mac dev on
  on=$(k get pod "$pod" -o jsonpath='{.spec.nodeName}')
  [ "$on" = "enim-e2e-node$i" ] || { echo "$pod runs on '$on', not enim-e2e-node$i"; return 1; }
  ip=$(pod_ip "$pod")
  if [ "$(pool_mode "$i")" = secondary ]; then
    line=$(moto_enis | jq -c --arg ip "$ip" '.[] | select(.addresses[1:] | index($ip))')
    [ -n "$line" ] || { echo "$pod: podIP $ip is no ENI's secondary address in moto"; return 1; }
    id=$(jq -r .id <<<"$line")
    [ "$(jq -r .instance <<<"$line")" = "$(node_instance "$i")" ] ||
      { echo "$pod: $ip is $id's, attached to $(jq -r .instance <<<"$line"), not node $i's instance"; return 1; }
    echo "$pod on $on: $ip = a secondary address of moto's $id (secondary mode)"
    return 0
  fi
  line=$(moto_enis | jq -c --arg ip "$ip" '.[] | select(.addresses[0] == $ip)')
  [ -n "$line" ] || { echo "$pod: podIP $ip is no ENI's primary address in moto"; return 1; }
  id=$(jq -r .id <<<"$line")
  [ "$(jq -r .instance <<<"$line")" = "$(node_instance "$i")" ] ||
    { echo "$pod: $ip is $id's, attached to $(jq -r .instance <<<"$line"), not node $i's instance"; return 1; }
  mac=$(jq -r .mac <<<"$line")
  dev=$(in_pod "$pod" "cat /sys/class/net/eth0/address")
  [ "$dev" = "$mac" ] || { echo "$pod: eth0 has MAC $dev, $id has $mac"; return 1; }
  echo "$pod on $on: $ip = moto's $id ($mac), the pod's eth0"
}

# (2, DRA) A pod claiming any ENI of DeviceClass eni.enim.io lands on the
# DRA pool's node (the only one publishing ENIs as devices) and runs on an
# ENI from moto, the one its claim was allocated.
s_cloud_dra() {
  local i claim dev
  i=$(dra_nodes | sed -n 1p)
  [ -n "$i" ] || { echo "no node in pool primary-dra"; return 1; }
  wait_for "enim-e2e-node$i's ResourceSlice" 60 k get resourceslice "enim-e2e-node$i-enim.io" || return 1
  echo "enim-e2e-node$i's ResourceSlice: $(k get resourceslice "enim-e2e-node$i-enim.io" -o jsonpath='{.spec.devices[*].name}')"
  claim_template any-eni
  pod dra-1 claim=any-eni
  ready dra-1 120 || return 1
  on_moto_eni dra-1 "$i" || return 1
  claim=$(pod_claim dra-1)
  dev=$(claim_device "$claim")
  echo "dra-1's claim $claim was allocated device $dev; status: $(network_data "$claim")"
}

# (3) Across nodes: pod to pod (ping and HTTP, both ways), a ClusterIP
# Service whose only backend is on the other node, and CoreDNS.
s_cloud_cross() {
  local a b out svc dns_node
  for a in 1 2; do pod_on "$a" "x-$a"; done
  for a in 1 2; do ready "x-$a" 120 || return 1; done
  for a in 1 2; do
    b=$((3 - a))
    in_pod "x-$a" "ping -c 2 -W 2 $(pod_ip "x-$b")" >/dev/null ||
      { echo "ping x-$a (node $a) -> x-$b (node $b) $(pod_ip "x-$b") failed"; return 1; }
    out=$(in_pod "x-$a" "printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 $(pod_ip "x-$b") 8080 | tail -n 1") || true
    [ "$out" = "x-$b" ] || { echo "HTTP x-$a -> x-$b: got '$out'"; return 1; }
    echo "node $a -> node $b pod to pod: ping and HTTP ('$out') to $(pod_ip "x-$b")"
  done
  k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata: {name: across, labels: {e2e: "1"}}
spec:
  selector: {app: x-2}
  ports: [{port: 80, targetPort: 8080}]
EOF
  svc=$(k get svc across -o jsonpath='{.spec.clusterIP}')
  wait_for "the Service's endpoints" 60 in_pod x-1 "printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 $svc 80 | grep x-2 >/dev/null" || return 1
  echo "ClusterIP $svc (in $SERVICE_CIDR) from node 1 -> backend x-2 on node 2"
  dns_node=$(k -n kube-system get pod -l k8s-app=kube-dns -o jsonpath='{.items[0].spec.nodeName}')
  for a in 1 2; do
    out=$(in_pod "x-$a" "nslookup across.default.svc.cluster.local $DNS_IP") && grep -q "$svc" <<<"$out" ||
      { echo "DNS from x-$a: $out"; return 1; }
  done
  out=$(in_pod x-1 "cat /etc/resolv.conf" | grep nameserver)
  echo "CoreDNS ($DNS_IP, on $dns_node) from both nodes: across.default -> $svc; x-1's $out"
}

# (IPv6) The pod subnet has an IPv6 block and the operator asks one address
# for each ENI: a pod on a whole ENI (node 1 through the device plugin, the
# DRA node through a claim) has on eth0 the IPv6 address moto assigned that
# ENI, the kubelet reports it among the podIPs, and the two pods, on two
# nodes, reach each other over IPv6 through the VPC's router.
pod_ipv6() { in_pod "$1" "ip -6 -o addr show dev eth0 scope global" | awk '{ print $4 }' | cut -d/ -f1; }
on_moto_ipv6() {
  local pod=$1 v6 mac want
  v6=$(pod_ipv6 "$pod")
  [ -n "$v6" ] || { echo "$pod: no global IPv6 address on eth0"; return 1; }
  mac=$(in_pod "$pod" "cat /sys/class/net/eth0/address")
  want=$(moto_enis | jq -r --arg mac "$mac" '.[] | select(.mac == $mac) | .ipv6[]')
  [ "$v6" = "$want" ] || { echo "$pod: eth0 ($mac) has $v6, moto gave its ENI '$want'"; return 1; }
  k get pod "$pod" -o jsonpath='{.status.podIPs[*].ip}' | tr ' ' '\n' | grep -Fx "$v6" >/dev/null ||
    { echo "$pod: podIPs $(k get pod "$pod" -o jsonpath='{.status.podIPs[*].ip}') lack $v6"; return 1; }
  echo "$pod on $(k get pod "$pod" -o jsonpath='{.spec.nodeName}'): eth0 $v6 = moto's IPv6 for its ENI ($mac), in its podIPs"
}
s_cloud_ipv6() {
  local a=1 d pods=(v6-a v6-d) p q
  d=$(dra_nodes | sed -n 1p)
  [ "$(pool_mode "$a")" = primary ] && [ -n "$d" ] || { echo "needs node 1 in primary mode and a DRA node"; return 1; }
  echo "the pod subnet's IPv6 block: $(cloud_field .pod_subnet_v6)"
  pod_on "$a" v6-a
  claim_template any-eni
  pod v6-d claim=any-eni node="enim-e2e-node$d"
  for p in "${pods[@]}"; do ready "$p" 120 || return 1; done
  for p in "${pods[@]}"; do on_moto_ipv6 "$p" || return 1; done
  for p in "${pods[@]}"; do
    q=v6-a; [ "$p" = v6-a ] && q=v6-d
    in_pod "$p" "ping -6 -c 2 -W 2 $(pod_ipv6 "$q")" >/dev/null ||
      { echo "ping -6 $p -> $q ($(pod_ipv6 "$q")) failed"; return 1; }
  done
  echo "node $a <-> node $d over IPv6: ping both ways"
}

# (3, from outside) A NodePort from the VPC namespace (outside the
# cluster) to either node, its one backend on node 2.
s_cloud_nodeport() {
  local port i ip out rc=0
  pod_on 2 np-2
  ready np-2 120 || return 1
  k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata: {name: np, labels: {e2e: "1"}}
spec:
  type: NodePort
  selector: {app: np-2}
  ports: [{port: 80, targetPort: 8080}]
EOF
  port=$(k get svc np -o jsonpath='{.spec.ports[0].nodePort}')
  for i in $(seq 1 "$CLOUD_NODES"); do
    ip=$(cloud_field ".nodes[$((i - 1))].ip")
    wait_for "NodePort $ip:$port from the VPC" 60 nodeport_answers "$ip" "$port" np-2 || { rc=1; continue; }
    out=$(http_get on_vpc busybox nc -w 5 "$ip" "$port")
    echo "NodePort $ip:$port (enim-e2e-node$i) from the VPC namespace -> np-2 on node 2: '$out'"
  done
  return $rc
}
nodeport_answers() { [ "$(http_get on_vpc busybox nc -w 3 "$1" "$2")" = "$3" ]; }

# IMDSv2 from a pod: a token (PUT, busybox nc: the answer, or nc's error
# when the connection is refused), then the instance id with it (busybox
# wget: nc half-closes after the request, and the simulator's IMDS drops a
# half-closed request while it asks moto who the caller is).
# shellcheck disable=SC2016 # expanded in the pod
IMDS_TOKEN='printf "PUT /latest/api/token HTTP/1.0\r\nX-aws-ec2-metadata-token-ttl-seconds: 60\r\n\r\n" | nc -w 10 169.254.169.254 80 2>&1 | tail -n 1'
# shellcheck disable=SC2016 # expanded in the pod
IMDS_GET="tok=\$($IMDS_TOKEN)"' && wget -q -O - --header "X-aws-ec2-metadata-token: $tok" http://169.254.169.254/latest/meta-data/instance-id'

imds_reads() { [ "$(k -n "$IMDS_NS" exec "$1" -- sh -c "$IMDS_GET")" = "$2" ]; }

# (9) Metadata: node 1 reaches the simulator's IMDS and is told its own
# instance; a pod on an ENI of node 1 (whose address moto gave to that
# instance, so the IMDS would answer as node 1) is refused by enim; a pod
# of the namespace cloud-values.py opts in (imds) reaches it.
s_cloud_metadata() {
  local want out="" tok rc=0
  want=$(node_instance 1)
  tok=$(nsenter --net="/run/netns/$tag-n1" curl -fsS -m 3 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' \
    http://169.254.169.254/latest/api/token) &&
    out=$(nsenter --net="/run/netns/$tag-n1" curl -fsS -m 3 -H "X-aws-ec2-metadata-token: $tok" \
      http://169.254.169.254/latest/meta-data/instance-id) && [ "$out" = "$want" ] ||
    { echo "node 1 read instance-id '$out', want $want"; return 1; }
  echo "node 1 reads its instance-id from the VPC's IMDS: $out"
  k create namespace "$IMDS_NS" >/dev/null
  pod_on 1 imds-default
  pod_on 1 imds-allowed "$IMDS_NS"
  ready imds-default 120 && k -n "$IMDS_NS" wait --for=condition=Ready pod/imds-allowed --timeout=120s >/dev/null || rc=1
  if [ $rc = 0 ]; then
    out=$(k exec imds-default -- sh -c "$IMDS_TOKEN") || true
    [[ $out != tok-* ]] || { echo "a pod in namespace default got an IMDS token: $out"; rc=1; }
    [ $rc = 0 ] && echo "pod in default ($(pod_ip imds-default), node 1's ENI): refused: '$out'"
    # The simulator's IMDS asks moto who holds the caller's address: under
    # load that can outlast one try.
    wait_for "the opted-in pod to read $want" 10 imds_reads imds-allowed "$want" ||
      { echo "the opted-in pod read '$(k -n "$IMDS_NS" exec imds-allowed -- sh -c "$IMDS_GET")', want $want"; rc=1; }
    out=$want
    [ $rc = 0 ] && echo "pod in $IMDS_NS (opted in): instance-id $out"
  fi
  k delete namespace "$IMDS_NS" --wait=true --timeout=120s >/dev/null 2>&1 || true
  return $rc
}

# node_enis_in_moto INSTANCE: ENIs other than the primary attached to the
# instance, or tagged for it, in moto (one id a line).
node_enis_in_moto() {
  moto_enis | jq -r --arg i "$1" '.[] | select((.instance == $i and .device_index != 0) or .tags["enim.io/node"] == $i) | .id'
}
node_gone() {
  ! k get nrs "enim-e2e-node$1" >/dev/null 2>&1 && [ -z "$(node_enis_in_moto "$(node_instance "$1")")" ]
}
# eth_devices I: the ENIs plugged into node I beyond eth0.
eth_devices() { ip -n "$tag-n$1" -o link show | awk -F': ' '$2 ~ /^eth[1-9]/ { print $2 }' | cut -d@ -f1; }
no_eth_devices() { [ -z "$(eth_devices "$1")" ]; }

# (5) Node 2 is deleted (kubectl delete node, every process of it
# stopped): within node_grace (30 s) and a resync its ENIs are detached and
# deleted in moto, its NetResourceSet is gone, and the simulator has
# unplugged every ENI from it. Last: node 2 stays gone.
s_cloud_node_deleted() {
  local before t0
  before=$(node_enis_in_moto "$(node_instance 2)" | tr '\n' ' ')
  [ -n "$before" ] || { echo "node 2 has no ENIs to release"; return 1; }
  echo "the operator's leader before: $(k -n enim-system get lease enim-operator -o jsonpath='{.spec.holderIdentity}')"
  k delete node enim-e2e-node2 --wait=false >/dev/null
  t0=$(date +%s%N)
  cloud_node 2
  sandbox_stop
  cloud_cp
  wait_for "node 2's ENIs detached and deleted in moto, its set gone" 180 node_gone 2 || {
    echo "left in moto: $(node_enis_in_moto "$(node_instance 2)" | tr '\n' ' ')"; return 1; }
  echo "node 2 deleted: its ENIs $before gone from moto and its set gone $((($(date +%s%N) - t0) / 1000000)) ms later (node_grace 30 s)"
  wait_for "the simulator to unplug them" 20 no_eth_devices 2 || { echo "still on node 2: $(eth_devices 2)"; return 1; }
  echo "nothing of it left: node 2's netns holds only eth0; sets: $(k get nrs -o name | tr '\n' ' ')"
  echo "the operator's leader after: $(k -n enim-system get lease enim-operator -o jsonpath='{.spec.holderIdentity}')"
}

# claim_enis: each set's ENIs made for a claim ("node: id claim" a line).
claim_enis() {
  k get nrs -o json | jq -r '.items[] | .metadata.name as $n | .spec.enis[] | select(.claim) | "\($n): \(.id) \(.claim.name)"'
}
# eni_groups ID: the security groups moto has for ENI ID, comma-joined.
eni_groups() { moto_enis | jq -r --arg id "$1" '.[] | select(.id == $id) | .groups | join(",")'; }
eni_gone_from_moto() { [ -z "$(moto_enis | jq -r --arg id "$1" '.[] | select(.id == $id) | .id')" ]; }
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }

# (policy) Pods get enim's network by an EniPolicy, through the operator's
# admission webhook (both replicas serve it; the API server reaches them at
# the Service's endpoints): a pod with no word of enim in it, in a
# namespace the policy selects, gets enim.io/eni and the policy's
# annotation, and runs on node 1 on an ENI from moto. Server-side dry runs
# show the rest without taking ENIs: a pod of a namespace no policy selects
# gets the cluster default (none: only the annotation); of two policies
# selecting one pod the higher priority wins, and once it is deleted the
# other; with no replica serving, a pod in scope is refused naming the
# webhook (failurePolicy Fail) while one in an ignored namespace is not.
# admission-times.py prints what the webhook adds to a creation.
POLICY_NS=enim-e2e-policy
NO_POLICY_NS=enim-e2e-nopolicy
# policy_pod NAME NS [POOL [APP]]: a pod with no enim field, on a node of
# POOL (default primary), labelled app=APP when given.
policy_pod() {
  cat <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: $2, labels: {e2e: "1"${4:+, app: $4}}}
spec:
  terminationGracePeriodSeconds: 1
  nodeSelector: {enim.io/pool: ${3:-primary}}
  containers:
    - {name: c, image: $BUSYBOX, imagePullPolicy: Never, args: ["exec httpd -f -p 8080 -h /"]}
EOF
}
eni_policy() {
  k apply -f - >/dev/null <<EOF
apiVersion: enim.io/v1alpha1
kind: EniPolicy
metadata: {name: $1}
spec: {namespaceSelector: {matchLabels: {team: web}}, mode: $2, priority: $3}
EOF
}
# admitted NAME NS: the policy annotation and the enim.io/eni and
# enim.io/ip limits a dry-run creation of pod NAME in NS gets.
admitted() {
  policy_pod "$1" "$2" | k create --dry-run=server -o json -f - |
    jq -r '"\(.metadata.annotations["enim.io/policy"]) eni=\(.spec.containers[0].resources.limits["enim.io/eni"] // "-") ip=\(.spec.containers[0].resources.limits["enim.io/ip"] // "-")"'
}
policy_ready() { k get enipolicy "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}'; }
# webhook_cert_issued: when the webhook's serving certificate was issued
# (unix seconds, from the operator's Secret).
webhook_cert_issued() {
  k -n enim-system get secret enim-operator-webhook -o jsonpath='{.data.issued}' | base64 -d
}

# policy_deployment NAME NS POOL APP REPLICAS: a Deployment of REPLICAS
# pods labelled app=APP on POOL's nodes, with no enim field.
policy_deployment() {
  cat <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: $1, namespace: $2, labels: {e2e: "1"}}
spec:
  replicas: $5
  selector: {matchLabels: {app: $4}}
  template:
    metadata: {labels: {e2e: "1", app: $4}}
    spec:
      terminationGracePeriodSeconds: 1
      nodeSelector: {enim.io/pool: $3}
      containers:
        - {name: c, image: $BUSYBOX, imagePullPolicy: Never, args: ["exec httpd -f -p 8080 -h /"]}
EOF
}

# pod_events NAME NS REASON: the notes of the Events of REASON about pod NAME.
pod_events() {
  k -n "$2" get events --field-selector "involvedObject.kind=Pod,involvedObject.name=$1,reason=$3" \
    -o jsonpath='{range .items[*]}{.message}{"\n"}{end}' 2>/dev/null
}
pod_told() { [ -n "$(pod_events "$@")" ]; }
# eni_subnet ID: the subnet moto has for ENI ID.
eni_subnet() { moto_enis | jq -r --arg id "$1" '.[] | select(.id == $id) | .subnet'; }

# group_policy NAME APP MODE PRIORITY SG [LINE...]: EniPolicy NAME (MODE,
# PRIORITY) for the pods labelled app=APP of the namespaces labelled
# team=web, with security group SG, and each LINE (YAML) in its spec.
group_policy() {
  local extra=""
  if [ $# -gt 5 ]; then extra=$(printf '  %s\n' "${@:6}"); fi
  k apply -f - >/dev/null <<EOF
apiVersion: enim.io/v1alpha1
kind: EniPolicy
metadata: {name: $1}
spec:
  namespaceSelector: {matchLabels: {team: web}}
  podSelector: {matchLabels: {app: $2}}
  mode: $3
  priority: $4
  securityGroups: [$5]
$extra
EOF
}
# zoned_policy NAME APP SG SUBNETS [WARM]: a primary group_policy of
# priority 30 with SUBNETS (a YAML flow list of {zone, subnetId}), keeping
# WARM ENIs warm (default 0).
zoned_policy() { group_policy "$1" "$2" primary 30 "$3" "subnets: $4" "warmEnis: ${5:-0}"; }
# secondary_policy NAME APP SG [PRIORITY]: a secondary group_policy
# (priority default 30).
secondary_policy() { group_policy "$1" "$2" secondary "${4:-30}" "$3"; }
# kept_enis POLICY: the ENIs the sets keep warm for POLICY, one a line.
kept_enis() { k get nrs -o json | jq -r --arg p "$1" '.items[].spec.enis[]? | select(.policy == $p) | .id' | sort; }
# device_published ID: ENI ID is a device of some node's ResourceSlice.
device_published() { k get resourceslices -o json | jq -e --arg d "$1" 'any(.items[].spec.devices[]?; .name == $d)' >/dev/null; }
# kept_free POLICY EXCEPT: one ENI kept for POLICY other than EXCEPT.
kept_free() { kept_enis "$1" | grep -vx "$2" | sed -n 1p; }
# pending_told POD APP MATCH: pod POD (app=APP, no enim field) on the DRA
# node's pool stays Pending and is told ClaimNotServable; prints the first
# such Event's note that contains MATCH.
pending_told() {
  local why
  policy_pod "$1" "$POLICY_NS" primary-dra "$2" | k apply -f - >/dev/null || return 1
  wait_for "$1 told why it waits" 90 pod_told "$1" "$POLICY_NS" ClaimNotServable ||
    { echo "$1: $(k -n "$POLICY_NS" get pod "$1" --no-headers)"; return 1; }
  why=$(pod_events "$1" "$POLICY_NS" ClaimNotServable | grep -F "$3" | sed -n 1p) && [ -n "$why" ] ||
    { echo "$1 was told: $(pod_events "$1" "$POLICY_NS" ClaimNotServable | tr '\n' ';'), nothing with '$3'"; return 1; }
  [ "$(k -n "$POLICY_NS" get pod "$1" -o jsonpath='{.status.phase}')" = Pending ] ||
    { echo "$1 is $(k -n "$POLICY_NS" get pod "$1" -o jsonpath='{.status.phase}'), not Pending"; return 1; }
  echo "$why"
}

# (policy, secondary mode) Groups in secondary mode: a policy naming the
# cluster's group, which the secondary pool (node 2) makes its ENIs with.
# Its pod, with no enim field and no nodeSelector, is given enim.io/ip
# and a node affinity to that pool by the webhook, and runs on node 2 on a
# secondary address of an ENI of node 2's instance that has exactly that
# group in moto. A policy naming a group no secondary pool has: its pod
# is refused at admission naming it, and it is NotServedYet.
policy_secondary_groups() {
  local sg t0 got ip eni groups nope why
  sg=$(cloud_field .security_group)
  secondary_policy e2e-web-sg addr "$sg"
  wait_for "EniPolicy e2e-web-sg Ready" 120 test_eq True policy_ready e2e-web-sg || return 1
  t0=$(date +%s%N)
  policy_pod addr-1 "$POLICY_NS" "" addr | sed '/nodeSelector:/d' | k apply -f - >/dev/null || return 1
  k -n "$POLICY_NS" wait --for=condition=Ready pod/addr-1 --timeout=120s >/dev/null ||
    { echo "addr-1: $(k -n "$POLICY_NS" get pod addr-1 -o wide --no-headers)"; return 1; }
  got=$(k -n "$POLICY_NS" get pod addr-1 -o json | jq -r '"\(.metadata.annotations["enim.io/policy"]) ip=\(.spec.containers[0].resources.limits["enim.io/ip"])"
    + " \(.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms | tojson) \(.spec.nodeName) \(.status.podIP)"')
  echo "addr-1 (no enim field, no nodeSelector; EniPolicy e2e-web-sg, secondary, group $sg): apply -> Ready $(ms_since "$t0") ms; $got"
  [ "$(cut -d' ' -f1-4 <<<"$got")" = 'e2e-web-sg ip=1 [{"matchExpressions":[{"key":"enim.io/pool","operator":"In","values":["secondary"]}]}] enim-e2e-node2' ] ||
    { echo "addr-1 was not admitted and placed as the policy says"; return 1; }
  ip=$(cut -d' ' -f5 <<<"$got")
  eni=$(moto_enis | jq -r --arg ip "$ip" '.[] | select(.addresses[1:] | index($ip)) | "\(.id) \(.instance)"')
  [ "${eni#* }" = "$(node_instance 2)" ] || { echo "addr-1's $ip is no secondary address of an ENI of node 2's instance in moto: '$eni'"; return 1; }
  groups=$(eni_groups "${eni% *}")
  [ "$groups" = "$sg" ] || { echo "addr-1's ENI ${eni% *} has groups '$groups' in moto, not exactly $sg"; return 1; }
  echo "addr-1 runs on $ip, a secondary address of ${eni% *} (node 2), which has exactly $sg in moto"
  k -n "$POLICY_NS" delete pod addr-1 --wait=true >/dev/null
  nope=$(on_vpc python3 "$repo/scripts/cluster/cloud.py" sg "$work/cloud.json" enim-policy-nopool)
  # Above e2e-web-sg, which selects the same pods.
  secondary_policy e2e-web-nopool addr "$nope" 40
  wait_for "EniPolicy e2e-web-nopool NotServedYet" 120 test_eq NotServedYet \
    k get enipolicy e2e-web-nopool -o jsonpath='{.status.conditions[?(@.type=="Ready")].reason}' || return 1
  why=$(policy_pod addr-2 "$POLICY_NS" "" addr | sed '/nodeSelector:/d' | k create --dry-run=server -f - 2>&1)
  [[ $why == *"EniPolicy e2e-web-nopool selects this pod but cannot be served: no node pool of the operator in secondary mode has exactly its security groups [$nope]"* ]] ||
    { echo "a pod of a policy of a group no secondary pool has: $why"; return 1; }
  echo "a pod of e2e-web-nopool (group $nope, no secondary pool has it) is refused: $why"
}

# policy_groups: a policy naming a security group no ENI has and a subnet
# per zone (primary mode) selects pods labelled app=db: one with no enim
# field gets a claim from the template the leader keeps in its namespace,
# and runs on the DRA node on an ENI made in moto with exactly that group,
# in the policy's subnet of the node's zone (not the pool's); deleting the
# pod deletes the ENI, and deleting the policy its template. A policy whose
# only zone has no node (policy_far_zone): its pod stays Pending, told why.
policy_groups() {
  local sg t0 t_db pod claim id ids=() groups line subnet zone policy_subnet far_zone far_subnet
  sg=$(on_vpc python3 "$repo/scripts/cluster/cloud.py" sg "$work/cloud.json" enim-policy-db)
  zone=$(cloud_field .zone) policy_subnet=$(cloud_field .policy_subnet)
  far_zone=$(cloud_field .far_zone) far_subnet=$(cloud_field .far_subnet)
  zoned_policy e2e-db db "$sg" "[{zone: $zone, subnetId: $policy_subnet}, {zone: $far_zone, subnetId: $far_subnet}]"
  wait_for "EniPolicy e2e-db Ready" 120 test_eq True policy_ready e2e-db || return 1
  wait_for "its claim template in $POLICY_NS" 60 k -n "$POLICY_NS" get resourceclaimtemplate enim-policy-e2e-db || return 1
  t0=$(date +%s%N)
  policy_deployment db "$POLICY_NS" primary-dra db 2 | k apply -f - >/dev/null || return 1
  k -n "$POLICY_NS" rollout status deployment/db --timeout=180s >/dev/null ||
    { echo "Deployment db: $(k -n "$POLICY_NS" get pods -l app=db -o wide --no-headers | tr '\n' ';'); claims: $(claim_enis | tr '\n' ';')"; return 1; }
  t_db=$(ms_since "$t0")
  echo "Deployment db (2 pods, no enim field; EniPolicy e2e-db, group $sg): apply -> both Ready $t_db ms, their ENIs made on demand"
  for pod in $(k -n "$POLICY_NS" get pods -l app=db -o jsonpath='{.items[*].metadata.name}'); do
    line=$(k -n "$POLICY_NS" get pod "$pod" -o json |
      jq -r '"\(.metadata.annotations["enim.io/policy"]) \(.spec.resourceClaims[0].resourceClaimTemplateName)"')
    [ "$line" = "e2e-db enim-policy-e2e-db" ] || { echo "$pod was admitted as '$line'"; return 1; }
    claim=$(pod_claim "$pod" "$POLICY_NS")
    id=$(claim_device "$claim" "$POLICY_NS")
    groups=$(eni_groups "$id")
    [ "$groups" = "$sg" ] || { echo "$pod's ENI '$id' has groups '$groups' in moto, not exactly $sg"; return 1; }
    subnet=$(eni_subnet "$id")
    [ "$subnet" = "$policy_subnet" ] || { echo "$pod's ENI '$id' is in subnet '$subnet', not the policy's $policy_subnet of $zone"; return 1; }
    line=$(k -n "$POLICY_NS" get pod "$pod" -o jsonpath='{.status.podIP}')
    [[ $line == "$(cloud_field .policy_subnet_cidr | cut -d. -f1-3)".* ]] ||
      { echo "$pod's address '$line' is not in $(cloud_field .policy_subnet_cidr)"; return 1; }
    echo "$pod runs on $id ($line), made in moto with exactly $sg in the policy's subnet $policy_subnet of $zone for its claim $claim"
    ids+=("$id")
  done
  [ "${#ids[@]}" = 2 ] && [ "${ids[0]}" != "${ids[1]}" ] || { echo "the Deployment's pods' ENIs: ${ids[*]}"; return 1; }
  policy_warm "$zone" "$policy_subnet" "$t_db" || return 1
  policy_far_zone "$sg" "$far_zone" "$far_subnet" || return 1
  policy_refused "$sg" "$zone" || return 1
  k -n "$POLICY_NS" delete deployment db --wait=true >/dev/null
  for id in "${ids[@]}"; do
    wait_for "$id deleted in moto" 240 eni_gone_from_moto "$id" || return 1
  done
  k delete enipolicy e2e-db >/dev/null
  wait_for "its claim template deleted" 60 test_eq "" k -n "$POLICY_NS" get resourceclaimtemplate -o name || return 1
}

# policy_warm ZONE SUBNET ON_DEMAND_MS: a policy keeping one ENI warm
# (warmEnis: 1) in SUBNET of ZONE: the operator makes it in moto with
# exactly the policy's group before any pod asks; a pod of the policy runs
# on that very ENI (apply -> Ready printed beside ON_DEMAND_MS, the
# Deployment's on demand), and another is made warm. Deleting the policy
# takes the free one back from moto; the pod's stays while it runs, and
# goes after it.
policy_warm() {
  local sg t0 w1 w2 claim id groups ms left
  sg=$(on_vpc python3 "$repo/scripts/cluster/cloud.py" sg "$work/cloud.json" enim-policy-warm)
  zoned_policy e2e-warm warm "$sg" "[{zone: $1, subnetId: $2}]" 1
  wait_for "an ENI kept warm for e2e-warm" 120 test_ne "" kept_enis e2e-warm ||
    { echo "EniPolicy e2e-warm: $(k get enipolicy e2e-warm -o jsonpath='{.status.conditions}')"; return 1; }
  w1=$(kept_enis e2e-warm)
  groups=$(eni_groups "$w1")
  [ "$groups" = "$sg" ] && [ "$(eni_subnet "$w1")" = "$2" ] ||
    { echo "the warm ENI $w1 has groups '$groups' and subnet '$(eni_subnet "$w1")' in moto, not $sg in $2"; return 1; }
  echo "EniPolicy e2e-warm (warmEnis: 1): $w1 made in moto with exactly $sg in $2 before any pod"
  wait_for "$w1 a device in a ResourceSlice" 60 device_published "$w1" || return 1
  t0=$(date +%s%N)
  policy_pod warm-1 "$POLICY_NS" primary-dra warm | k apply -f - >/dev/null || return 1
  k -n "$POLICY_NS" wait --for=condition=Ready pod/warm-1 --timeout=120s >/dev/null ||
    { echo "warm-1: $(k -n "$POLICY_NS" get pod warm-1 -o wide --no-headers)"; return 1; }
  ms=$(ms_since "$t0")
  claim=$(pod_claim warm-1 "$POLICY_NS")
  id=$(claim_device "$claim" "$POLICY_NS")
  [ "$id" = "$w1" ] || { echo "warm-1 runs on '$id', not the warm ENI $w1"; return 1; }
  echo "warm-1 (EniPolicy e2e-warm): apply -> Ready $ms ms on the warm ENI $w1 (the Deployment db of 2, their ENIs made on demand: $3 ms to both Ready)"
  wait_for "another ENI kept warm for e2e-warm" 120 test_ne "" kept_free e2e-warm "$w1" || return 1
  w2=$(kept_free e2e-warm "$w1")
  echo "$w1 held by warm-1: $w2 made warm in its place"
  k delete enipolicy e2e-warm >/dev/null
  t0=$(date +%s%N)
  wait_for "the free warm ENI $w2 deleted in moto" 180 eni_gone_from_moto "$w2" || return 1
  echo "EniPolicy e2e-warm deleted: its free warm ENI $w2 gone from moto $(ms_since "$t0") ms later"
  left=$(kept_enis e2e-warm | tr '\n' ' ')
  [ "$left" = "$w1 " ] || { echo "kept for e2e-warm after its deletion: '$left', not $w1 alone (held by warm-1)"; return 1; }
  k -n "$POLICY_NS" delete pod warm-1 --wait=true >/dev/null
  wait_for "$w1 deleted in moto once warm-1 is gone" 180 eni_gone_from_moto "$w1" || return 1
  echo "warm-1 deleted: $w1 gone from moto"
}

# policy_far_zone SG ZONE SUBNET: a policy whose one subnet is in ZONE, where
# no node is: its pod stays Pending, told why on the pod; nothing is made.
policy_far_zone() {
  local why
  zoned_policy e2e-far far "$1" "[{zone: $2, subnetId: $3}]"
  wait_for "EniPolicy e2e-far Ready" 120 test_eq True policy_ready e2e-far || return 1
  wait_for "its claim template" 60 k -n "$POLICY_NS" get resourceclaimtemplate enim-policy-e2e-far || return 1
  why=$(pending_told far-1 far "($2)") || { echo "$why"; return 1; }
  [ -z "$(moto_enis | jq -r --arg s "$3" '.[] | select(.subnet == $s) | .id')" ] ||
    { echo "an ENI was made in $3, where no node is"; return 1; }
  echo "far-1 (EniPolicy e2e-far, only $2, where no node is): Pending, told on the pod: $why"
  k -n "$POLICY_NS" delete pod far-1 --wait=true >/dev/null
  k delete enipolicy e2e-far >/dev/null
}

# policy_reason NAME: the reason of EniPolicy NAME's Ready condition.
policy_reason() { k get enipolicy "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].reason}'; }
# policy_refused SG ZONE: a policy whose subnet in ZONE does not exist: the
# operator's create is refused by the cloud (moto: InvalidSubnetID.NotFound),
# its pod stays Pending, told why, and the policy's status says
# CloudRefused; nothing is left in moto or in any set's intents.
policy_refused() {
  local why missing=subnet-0000000000000dead
  zoned_policy e2e-refused refused "$1" "[{zone: $2, subnetId: $missing}]"
  wait_for "its claim template" 60 k -n "$POLICY_NS" get resourceclaimtemplate enim-policy-e2e-refused || return 1
  why=$(pending_told refused-1 refused InvalidSubnetID.NotFound) || { echo "$why"; return 1; }
  wait_for "EniPolicy e2e-refused CloudRefused" 60 test_eq CloudRefused policy_reason e2e-refused ||
    { echo "its status: $(k get enipolicy e2e-refused -o jsonpath='{.status.conditions}')"; return 1; }
  [ "$(k -n "$POLICY_NS" get pod refused-1 -o jsonpath='{.status.phase}')" = Pending ] || { echo "refused-1 is not Pending"; return 1; }
  [ -z "$(k get nrs -o json | jq -r '.items[].spec.intents[]? | select(.subnet == "'$missing'") | .clientToken')" ] ||
    { echo "an intent for $missing is still in a set"; return 1; }
  echo "refused-1 (EniPolicy e2e-refused, subnet $missing): Pending, told on the pod: $why"
  echo "EniPolicy e2e-refused: $(k get enipolicy e2e-refused -o jsonpath='{.status.conditions[?(@.type=="Ready")].message}')"
  k -n "$POLICY_NS" delete pod refused-1 --wait=true >/dev/null
  k delete enipolicy e2e-refused >/dev/null
}

s_cloud_policy() {
  local rc=0 got ip line t0 issued renewed wait urls host
  k create namespace "$POLICY_NS" >/dev/null && k label namespace "$POLICY_NS" team=web >/dev/null || return 1
  k create namespace "$NO_POLICY_NS" >/dev/null || return 1
  eni_policy e2e-web primary 0
  wait_for "EniPolicy e2e-web Ready" 120 test_eq True policy_ready e2e-web || rc=1
  t0=$(date +%s%N)
  policy_pod by-policy "$POLICY_NS" | k apply -f - >/dev/null || return 1
  k -n "$POLICY_NS" wait --for=condition=Ready pod/by-policy --timeout=120s >/dev/null ||
    { echo "by-policy: $(k -n "$POLICY_NS" get pod by-policy -o wide --no-headers)"; rc=1; }
  echo "by-policy: apply -> Ready $(ms_since "$t0") ms"
  got=$(k -n "$POLICY_NS" get pod by-policy -o json |
    jq -r '"\(.metadata.annotations["enim.io/policy"]) \(.spec.containers[0].resources.limits["enim.io/eni"])"')
  [ "$got" = "e2e-web 1" ] || { echo "by-policy was admitted as '$got', not 'e2e-web 1'"; rc=1; }
  ip=$(k -n "$POLICY_NS" get pod by-policy -o jsonpath='{.status.podIP}')
  line=$(moto_enis | jq -c --arg ip "$ip" '.[] | select(.addresses[0] == $ip)')
  [ -n "$ip" ] && [ "$(jq -r .instance <<<"$line")" = "$(node_instance 1)" ] ||
    { echo "by-policy's address '$ip' is no primary address of an ENI of node 1's instance in moto: $line"; rc=1; }
  # What the webhook adds: 1,000 dry-run creations in its scope against as
  # many in the ignored namespace default, interleaved (#33's figures).
  # Started 5 s before the serving certificate's renewal (cloud-values.py:
  # a 30 s life, renewed at 20 s), so that the replicas take the new one
  # while pods are being created: no creation may fail (the script exits 1).
  # With the replicas' /metrics: the operator's own part of that share.
  urls=()
  for host in $(k -n enim-system get pods -l app.kubernetes.io/component=operator -o jsonpath='{.items[*].status.hostIP}'); do
    urls+=("http://$host:9470/metrics")
  done
  issued=$(webhook_cert_issued)
  wait=$((issued + 20 - 5 - $(date +%s)))
  [ "$wait" -le 0 ] || sleep "$wait"
  on_node python3 "$repo/scripts/cluster/admission-times.py" "$work/pki/admin.kubeconfig" \
    "$POLICY_NS" default 1000 "${urls[@]}" || rc=1
  renewed=$(webhook_cert_issued)
  if [ -n "$issued" ] && [ "$renewed" -gt "$issued" ]; then
    echo "the webhook's serving certificate was renewed during the admissions (issued $issued, then $renewed)"
  else
    echo "no renewal of the webhook's certificate during the admissions (issued '$issued', then '$renewed')"; rc=1
  fi
  got=$(admitted no-policy "$NO_POLICY_NS")
  [ "$got" = "(default) eni=- ip=-" ] || { echo "a pod no policy selects: '$got'"; rc=1; }
  eni_policy e2e-web-secondary secondary 10
  wait_for "EniPolicy e2e-web-secondary Ready" 120 test_eq True policy_ready e2e-web-secondary || rc=1
  got=$(admitted two "$POLICY_NS")
  [ "$got" = "e2e-web-secondary eni=- ip=1" ] || { echo "two policies, priority 10 over 0: '$got'"; rc=1; }
  k delete enipolicy e2e-web-secondary >/dev/null
  wait_for "the deleted policy to leave the webhook's view" 120 test_eq "e2e-web eni=1 ip=-" admitted after "$POLICY_NS" ||
    { echo "after deleting the winner: '$(admitted after "$POLICY_NS")'"; rc=1; }
  policy_groups || rc=1
  policy_secondary_groups || rc=1
  k delete enipolicy e2e-web-sg e2e-web-nopool --ignore-not-found >/dev/null
  # No replica serving: refused in scope, admitted where ignored.
  k -n enim-system scale deployment/enim-operator --replicas=0 >/dev/null
  k -n enim-system wait --for=delete pod -l app.kubernetes.io/component=operator --timeout=120s >/dev/null
  got=$(policy_pod down "$POLICY_NS" | k create --dry-run=server -f - 2>&1)
  grep 'pods.policy.enim.io' <<<"$got" >/dev/null || { echo "with no replica, a pod in scope got: $got"; rc=1; }
  policy_pod down default | k create --dry-run=server -f - >/dev/null ||
    { echo "with no replica, a pod in the ignored namespace default was refused"; rc=1; }
  k -n enim-system scale deployment/enim-operator --replicas=2 >/dev/null
  k -n enim-system rollout status deployment/enim-operator --timeout=180s >/dev/null || rc=1
  wait_for "the webhook serving again" 120 test_eq "e2e-web eni=1 ip=-" admitted back "$POLICY_NS" || rc=1
  k delete namespace "$POLICY_NS" "$NO_POLICY_NS" --wait=true --timeout=120s >/dev/null || rc=1
  k delete enipolicy e2e-web >/dev/null || rc=1
  return $rc
}

# (7) On demand: a claim asking for a security group no ENI has gets an
# ENI made in moto with exactly that group, hot-plugged into the DRA node,
# and its pod runs on it; deleting the pod (and so its claim) deletes the ENI.
# apply -> Running is compared with a claim pod served from a warm ENI.
s_cloud_on_demand() {
  local i sg t0 warm id groups claim t_warm t_end
  i=$(dra_nodes | sed -n 1p)
  claim_template any-eni
  t_warm=$(date +%s%N)
  pod warm-1 claim=any-eni
  ready warm-1 120 || return 1
  t_end=$(date +%s%N)
  warm=$(ms_since "$t_warm")
  echo "apply -> Running of a claim pod from a warm ENI: $warm ms"
  phase_logs "$i"
  pod_phases "phases, a claim pod on a warm ENI (enim-e2e-node$i, DRA), apply -> Ready" "$t_warm" "$t_end" "$i" warm-1 \
    --at "enimd prepared its claim" "$PHASE_LOGS/agents-n$i.log" "\"message\":\"prepared claim\",\"claim\":\"default/warm-1-"
  k delete pod warm-1 --wait=true >/dev/null
  sg=$(on_vpc python3 "$repo/scripts/cluster/cloud.py" sg "$work/cloud.json" enim-claim-db)
  claim_template db "device.attributes[\"sg.enim.io\"].?${sg//-/_}.orValue(false)" \
    "{apiVersion: enim.io/v1alpha1, kind: EniParameters, securityGroups: [$sg]}"
  t0=$(date +%s%N)
  pod od-1 claim=db
  ready od-1 180 || { echo "ENIs made for claims: $(claim_enis | tr '\n' ';')"; return 1; }
  t_end=$(date +%s%N)
  echo "apply -> Running of a claim pod whose ENI is made on demand: $(ms_since "$t0") ms (warm: $warm ms)"
  phase_logs "$i"
  pod_phases "phases, a claim pod whose ENI is made on demand (enim-e2e-node$i, DRA), apply -> Ready" "$t0" "$t_end" "$i" od-1 \
    --at "the operator's pass records its intent (scheduler: no device; the operator's watch)" "$PHASE_LOGS/operator.log" "\"message\":\"intents recorded.*default/od-1-" \
    --at "moto: CreateNetworkInterface" "$PHASE_LOGS/operator.log" "\"message\":\"created ENI\",\"eni\":\"(?P<eni>eni-[0-9a-f]+)\",\"node\":\"$(node_instance "$i")\"" \
    --at "moto: AttachNetworkInterface (to attached)" "$PHASE_LOGS/operator.log" "\"message\":\"attached ENI\",\"eni\":\"{eni}\"" \
    --at "the hot-plug (enim-vpcsim's 200 ms poll of moto)" "$work/cp/logs/vpcsim.log" "plugged {eni}" \
    --at "enimd publishes it (ResourceSlice)" "$PHASE_LOGS/agents-n$i.log" "\"message\":\"ResourceSlice published\"" \
    --at "enimd prepared its claim (scheduler allocated it, the kubelet asked)" "$PHASE_LOGS/agents-n$i.log" "\"message\":\"prepared claim\",\"claim\":\"default/od-1-"
  on_moto_eni od-1 "$i" || return 1
  claim=$(pod_claim od-1)
  id=$(claim_device "$claim")
  groups=$(eni_groups "$id")
  [ "$groups" = "$sg" ] || { echo "$id has groups $groups in moto, not exactly $sg"; return 1; }
  echo "$id made in moto with exactly $sg, for claim $claim ($(claim_enis | tr '\n' ' '))"
  # The pod's claim goes with it (made from the pod's template).
  k delete pod od-1 --wait=true >/dev/null
  t0=$(date +%s%N)
  wait_for "$id deleted in moto" 240 eni_gone_from_moto "$id" || return 1
  echo "pod and its claim deleted: $id gone from moto $(ms_since "$t0") ms later"
}

# (4) The late node joins: its kubelet starts (its instance ran from the
# start). It is of pool per-node, which no operator pool selects: its own
# agent's `aws` provider makes its ENIs in moto through the node's keys
# and metadata, and a pod applied before it registered runs on one. No
# NetResourceSet is made for it. Timed from registration.
s_cloud_late_node() {
  local i=$CLOUD_LATE t0 t_reg t_end enis
  pod_on "$i" late-1
  t0=$(date +%s%N)
  cloud_node_up "$i"
  cloud_cp
  wait_for "enim-e2e-node$i to register" 240 k get node "enim-e2e-node$i" || return 1
  t_reg=$(date +%s%N)
  echo "enim-e2e-node$i registered $((($t_reg - t0) / 1000000)) ms after its containerd started"
  ready late-1 240 || return 1
  t_end=$(date +%s%N)
  echo "registration -> first pod Ready: $(ms_since "$t_reg") ms"
  phase_logs "$i"
  local n=$work/n$i/logs a=$PHASE_LOGS/agents-n$i.log
  pod_phases "phases, the late node's first pod (enim-e2e-node$i, its own agent on the aws provider; registration -> Ready $(((t_end - t_reg) / 1000000)) ms), its node's start -> Ready" "$t0" "$t_end" "$i" late-1 \
    --at "containerd, images, the kubelet: registered" "$n/kubelet.log" "Successfully registered node" \
    --at "the kubelet has enimd's pod (DaemonSet controller)" "$n/kubelet.log" 'SyncLoop ADD.*"enim-system/enimd' \
    --at "enimd's pod started, its aws provider read the metadata" "$a" "\"message\":\"AWS backend discovered the instance\"" \
    --at "CreateNetworkInterface (moto)" "$a" "\"message\":\"created ENI\",\"eni\":\"(?P<eni>eni-[0-9a-f]+)" \
    --at "AttachNetworkInterface (moto), the hot-plug" "$work/cp/logs/vpcsim.log" "plugged {eni}" \
    --at "enimd has the device (its warm pool)" "$a" "\"message\":\"ENI attached to the warm pool\",\"eni\":\"{eni}\"" \
    --at "the device plugin registered with the kubelet" "$a" "\"message\":\"registered with the kubelet\""
  on_moto_eni late-1 "$i" || return 1
  enis=$(node_enis_in_moto "$(node_instance "$i")" | tr '\n' ' ')
  echo "its agent's ENIs in moto, tagged for its instance: $enis"
  ! k get nrs "enim-e2e-node$i" >/dev/null 2>&1 || { echo "the operator made it a set: $(cloud_nrs "enim-e2e-node$i" '{.spec.enis[*].id}')"; return 1; }
  echo "no NetResourceSet for it: the operator leaves a node of no pool alone"
}

# lease_holder: the operator replica that leads (its pod's name).
lease_holder() { k -n enim-system get lease enim-operator -o jsonpath='{.spec.holderIdentity}'; }
holder_is_not() { local h; h=$(lease_holder) && [ -n "$h" ] && [ "$h" != "$1" ]; }
# set_enis I: the ENI ids of node I's set, one a line.
set_enis() { cloud_nrs "enim-e2e-node$1" '{range .spec.enis[*]}{.id}{"\n"}{end}'; }
# set_items I: what node I's set holds, one a line: ENI ids, or in
# secondary mode the addresses pods get.
set_items() {
  if [ "$(pool_mode "$1")" = secondary ]; then
    cloud_nrs "enim-e2e-node$1" '{range .spec.enis[*]}{range .secondaryIps[*]}{@}{"\n"}{end}{end}'
  else
    set_enis "$1"
  fi
}
# no_surplus I: node I's set drains nothing and keeps no more free than
# its pool's high watermark.
no_surplus() {
  local high=$CLOUD_HIGH_ENIS free
  [ "$(pool_mode "$1")" = secondary ] && high=$CLOUD_HIGH_ADDRESSES
  free=$(cloud_nrs "enim-e2e-node$1" '{.status.summary.available}')
  [ -z "$(cloud_nrs "enim-e2e-node$1" '{.spec.draining[*]}')" ] && [ "${free:-0}" -le "$high" ]
}
# set_gained I BEFORE: node I's set holds something BEFORE did not.
set_gained() { [ -n "$(comm -13 <(sort <<<"$2") <(set_items "$1" | sort))" ]; }
units_of() { [ "$(pool_mode "$1")" = secondary ] && echo addresses || echo ENIs; }
# operator_enis: the ids of the cluster's ENIs in moto but the per-node
# late node's (its own agent made them; no set holds them), sorted.
operator_enis() {
  moto_enis | jq -r --arg late "$(node_instance "$CLOUD_LATE")" \
    '.[] | select(.tags["enim.io/cluster"] == "enim-e2e" and .instance != $late and .tags["enim.io/node"] != $late) | .id' | sort
}
# sets_agree_with_moto: every cluster ENI in moto (but the per-node late
# node's, which no set holds) is in exactly one set, and every set's ENI
# is in moto.
sets_agree_with_moto() {
  local sets cloud dup
  sets=$(k get nrs -o json | jq -r '.items[].spec.enis[]?.id' | sort)
  dup=$(uniq -d <<<"$sets")
  [ -z "$dup" ] || { echo "in two sets: $dup"; return 1; }
  cloud=$(operator_enis)
  [ "$sets" = "$cloud" ] || { echo "sets: $(echo $sets); moto: $(echo $cloud)"; return 1; }
}
set_users() { cloud_nrs "enim-e2e-node$1" '{.status.used[*].podName}'; }
# reb_deployment I: a Deployment of one pod pinned to node I (its pool's
# resource). A reboot's kubelet refuses the pods bound to it before the
# device plugin registers again (UnexpectedAdmissionError, upstream's rule
# at boot, whatever the plugin), so what survives a reboot is what a
# controller replaces.
reb_deployment() { local mode; mode=$(pool_mode "$1"); httpd_deployment reb 1 "enim-e2e-node$1"; }
# reb_pod: the Deployment's Running, Ready pod.
reb_pod() {
  k get pods -l app=reb --field-selector=status.phase=Running \
    -o jsonpath='{range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' |
    awk '$2 == "True" { print $1; exit }'
}
reb_runs_anew() { local p; p=$(reb_pod) && [ -n "$p" ] && [ "$p" != "$1" ]; }

# (6, 11) The operator's leader's node dies as by a power cut, every
# process of it at once, its pods' netns gone without a DEL:
# - the other replica leads within the lease (10 s) and a renewal;
# - churn goes on: two pods on another node take its free ENIs, and the
#   new leader makes it one more in moto;
# - the node boots again: its Deployment's pod, refused at boot, is
#   replaced and runs on an ENI of its own, the set's status names that
#   pod alone, and no ENI is in two sets, none in moto outside the sets.
s_cloud_leader_reboot() {
  local leader on l other t0 t_lost before old="" new i
  leader=$(lease_holder)
  on=$(k -n enim-system get pod "$leader" -o jsonpath='{.spec.nodeName}')
  l=${on#enim-e2e-node}
  [ -n "$leader" ] && [ -n "$l" ] || { echo "no leader ('$leader') or its node ('$on')"; return 1; }
  # Churn goes to a device-plugin node the leader is not on.
  other=$(plugin_nodes | grep -vx "$l" | sed -n 1p)
  # A pod of the leader's node, if it serves pods by the device plugin.
  if plugin_nodes | grep -x "$l" >/dev/null; then
    reb_deployment "$l"
    k rollout status deployment/reb --timeout=120s >/dev/null || return 1
    old=$(reb_pod)
    on_moto_eni "$old" "$l" || return 1
  fi
  # The outage's pods left a surplus there, which the operator drains
  # once it has lasted drain_delay (30 s); until then the node may be at
  # its instance's ENI limit, with no room for one more.
  wait_for "enim-e2e-node$other's surplus to be drained" 120 no_surplus "$other" || {
    echo "its set: $(cloud_nrs "enim-e2e-node$other" '{.status.summary} draining: {.spec.draining}')"; return 1; }
  before=$(set_items "$other")
  echo "leader $leader on $on; churn on enim-e2e-node$other ($(wc -w <<<"$before") $(units_of "$other"))"
  t0=$(date +%s%N)
  cloud_power_off "$l"
  echo "enim-e2e-node$l powered off"
  wait_for "another replica to lead" 60 holder_is_not "$leader" || return 1
  t_lost=$(ms_since "$t0")
  echo "$(lease_holder) leads $t_lost ms after the power cut (lease 10 s)"
  # As many pods as it has free ENIs (addresses) and one more: none left
  # free, the new leader must make more (pre_allocate), which the set then
  # shows as one it did not hold before.
  local free j
  free=$(cloud_nrs "enim-e2e-node$other" '{.status.summary.available}')
  free=$((${free:-0} + 1))
  for j in $(seq 1 "$free"); do pod_on "$other" "churn-$j"; done
  for j in $(seq 1 "$free"); do ready "churn-$j" 180 || { echo "its set: $(set_items "$other" | tr '\n' ' ')"; return 1; }; done
  wait_for "the new leader to give enim-e2e-node$other new $(units_of "$other")" 120 set_gained "$other" "$before" || {
    echo "its set: $(set_items "$other" | tr '\n' ' ')"; return 1; }
  echo "churn: $free pods run on enim-e2e-node$other; the new leader gave it $(comm -13 <(sort <<<"$before") <(set_items "$other" | sort) | tr '\n' ' ')$(ms_since "$t0") ms after the power cut"
  cloud_power_on "$l"
  t0=$(date +%s%N)
  wait_for "enim-e2e-node$l Ready again" 240 node_ready "$l" || return 1
  echo "enim-e2e-node$l Ready $(ms_since "$t0") ms after power-on"
  if [ -n "$old" ]; then
    wait_for "a new pod of the Deployment to run" 240 reb_runs_anew "$old" || return 1
    new=$(reb_pod)
    echo "$new (replacing $old) runs $(ms_since "$t0") ms after power-on"
    on_moto_eni "$new" "$l" || return 1
    wait_for "enim-e2e-node$l's status to name $new alone" 120 test_eq "$new" set_users "$l" || {
      echo "status.used: $(set_users "$l")"; return 1; }
  fi
  k -n enim-system rollout status deployment/enim-operator --timeout=240s >/dev/null || return 1
  wait_for "moto and the sets to agree" 120 sets_agree_with_moto || { sets_agree_with_moto; return 1; }
  for i in $(seq 1 "$CLOUD_NODES"); do echo "enim-e2e-node$i: $(set_enis "$i" | tr '\n' ' ')"; done
  echo "no ENI in two sets; moto's ENIs are the sets'"
}
node_ready() {
  [ "$(k get node "enim-e2e-node$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]
}
# test_eq WANT CMD...: CMD prints WANT.
test_eq() { local want=$1; shift; [ "$("$@")" = "$want" ]; }
test_ne() { local not=$1; shift; [ "$("$@")" != "$not" ]; }

# (10) enimd's crashes on a cloud node: node 1's agent (primary mode, its
# ENIs from moto through its NetResourceSet) killed with -9, and its
# DaemonSet restarted, CLOUD_RESTARTS times each, with pods admitted through
# each restart: every pod runs (to Succeeded). The one-node primary run
# does 20 of each kind on a static inventory; here fewer, on the cloud's
# path (scenarios.sh's s_admission, on node 1). Pods here failed
# UnexpectedAdmissionError while the operator drained the moment a round's
# pods were done: a drained ENI leaves the kubelet's count before the
# scheduler's, and the next round's pod was bound in between. The
# operator's drain_delay waits a burst out; the count is printed below.
CLOUD_RESTARTS=${CLOUD_RESTARTS:-10}
s_cloud_admission() {
  local rc=0 restarts=$CLOUD_RESTARTS from
  [ "$(pool_mode 1)" = primary ] || { echo "needs node 1 in primary mode"; return 1; }
  cloud_node 1
  from=$(wc -l < "$nw/logs/kubelet.log")
  s_admission kill9 && s_admission rollout || rc=1
  # The kubelet's count of the node's ENIs through it: a drop is a
  # drained ENI (the operator's drain_delay), and a pod bound while the
  # scheduler still counted it fails UnexpectedAdmissionError.
  tail -n +"$from" "$nw/logs/kubelet.log" | grep -o 'State pushed for device plugin" resource="enim.io/eni" resourceCapacity=[0-9]*' |
    awk -F= '{ n = $NF + 0; if (seen && n < last) drops++; last = n; seen = 1; counts = counts (counts ? " " : "") n }
      END { printf "the kubelet'"'"'s enim.io/eni count through it: %s (%d drops)\n", counts ? counts : "unchanged", drops }'
  cloud_cp
  return $rc
}

# (8) A cloud outage: for 60 s every EC2 call of the operator's answers
# 503, 30 s `Unavailable` and then 30 s `RequestLimitExceeded`, while pods
# come and go on the device-plugin nodes: each pod runs from a warm ENI,
# and no pod fails other than with "try again later". The demand that
# outlasts the pool (two pods on a node with one free ENI) waits for the
# cloud; once it is back the pools refill, and moto's ENIs are the sets'.
s_cloud_outage() {
  local i t0 n=0 round bad before faulted
  before=$(grep -c 'fault proxy: outage' "$work/cp/logs/vpcsim.log" || true)
  t0=$(date +%s%N)
  cloud_outage unavailable
  for round in 1 2 3 4; do
    [ "$round" = 3 ] && cloud_outage throttled
    for i in $(plugin_nodes); do pod_on "$i" "out-$i-$round"; n=$((n + 1)); done
    for i in $(plugin_nodes); do ready "out-$i-$round" 120 || { cloud_outage none; return 1; }; done
    for i in $(plugin_nodes); do k delete pod "out-$i-$round" --wait=false >/dev/null; done
    # The rest of each quarter of the minute.
    while [ "$(ms_since "$t0")" -lt $((round * 15000)) ]; do sleep 1; done
  done
  echo "$n pods came and went in $(ms_since "$t0") ms of outage, each on a warm ENI"
  # Demand beyond the pool, still throttled: on the primary-mode
  # device-plugin node with the fewest ENIs (one must fit under its instance type's limit), a
  # pod for every free ENI and one more. The one more waits (Pending: the
  # node has no ENI for it) until the cloud is back and the operator makes
  # one.
  local have j
  i=$(for j in $(primary_plugin_nodes); do echo "$(set_enis "$j" | wc -l) $j"; done | sort -n | sed -n '1s/.* //p')
  [ "$(set_enis "$i" | wc -l)" -lt "$CLOUD_MAX_ENIS" ] || {
    echo "every device-plugin node is at its $CLOUD_MAX_ENIS ENIs: no room for demand beyond the pool"; cloud_outage none; return 1; }
  k wait --for=delete pod -l e2e=1 --timeout=60s >/dev/null 2>&1 || true
  sleep 2
  have=$(cloud_nrs "enim-e2e-node$i" '{.status.summary.available}')
  [ "${have:-0}" -ge 1 ] || { echo "node $i has no free ENI: $(cloud_nrs "enim-e2e-node$i" '{.status.summary}')"; cloud_outage none; return 1; }
  for j in $(seq 1 $((have + 1))); do pod_on "$i" "more-$j"; done
  for j in $(seq 1 "$have"); do ready "more-$j" 120 || { cloud_outage none; return 1; }; done
  sleep 5
  [ "$(k get pod "more-$((have + 1))" -o jsonpath='{.status.phase}')" = Pending ] || {
    echo "more-$((have + 1)) is $(k get pod "more-$((have + 1))" -o jsonpath='{.status.phase}') with the cloud down"; cloud_outage none; return 1; }
  echo "node $i: $have pods on its $have free ENIs (of $(set_enis "$i" | wc -l)); more-$((have + 1)) Pending while the cloud is down"
  cloud_outage none
  t0=$(date +%s%N)
  ready "more-$((have + 1))" 180 || { echo "its set: $(set_enis "$i" | tr '\n' ' ')"; return 1; }
  echo "the cloud back: more-$((have + 1)) runs $(ms_since "$t0") ms later, on an ENI made for it"
  on_moto_eni "more-$((have + 1))" "$i" || return 1
  faulted=$(grep 'fault proxy: outage Throttled -> None' "$work/cp/logs/vpcsim.log" | tail -n 1 | grep -o '([0-9]* calls' | tr -dc 0-9)
  [ "$(grep -c 'fault proxy: outage' "$work/cp/logs/vpcsim.log")" -ge $((before + 3)) ] && [ "${faulted:-0}" -gt 0 ] || {
    echo "the proxy faulted no call: $(grep 'fault proxy' "$work/cp/logs/vpcsim.log" | tail -n 3)"; return 1; }
  echo "the proxy answered $faulted of the operator's calls with a fault"
  bad=$(k get events -A --field-selector reason=FailedCreatePodSandBox -o jsonpath='{range .items[*]}{.involvedObject.name}: {.message}{"\n"}{end}' |
    grep '^out-' | grep -v 'try again later' || true)
  [ -z "$bad" ] || { echo "pods that failed otherwise: $bad"; return 1; }
  t0=$(date +%s%N)
  wait_for "moto and the sets to agree again" 120 sets_agree_with_moto || { sets_agree_with_moto; return 1; }
  for i in $(plugin_nodes); do
    wait_for "enim-e2e-node$i's set to fill again" 120 nrs_filled "$i" || return 1
  done
  echo "after the outage: the sets full and moto's ENIs the sets' $(ms_since "$t0") ms later"
}

# events_of KIND NAME [NAMESPACE]: "TYPE REASON" of each event about KIND
# NAME, as `kubectl get events` lists them.
events_of() {
  k get events -n "${3:-default}" \
    --field-selector "involvedObject.kind=$1,involvedObject.name=$2" \
    -o jsonpath='{range .items[*]}{.type} {.reason}{"\n"}{end}'
}
# refused_pod_event: some ev-* pod has a Warning NoFreeEni event.
refused_pod_event() {
  k get events -n default --field-selector reason=NoFreeEni \
    -o jsonpath='{range .items[*]}{.type} {.involvedObject.name}{"\n"}{end}' | grep '^Warning ev-' >/dev/null
}
# set_event I WHAT: node I's NetResourceSet has an event "TYPE REASON"
# matching the extended regex WHAT.
set_event() { events_of NetResourceSet "enim-e2e-node$1" | grep -E "^($2)\$" >/dev/null; }

# operator_throttled I: a Warning of the operator's throttled calls, on
# node I's set or on an operator Pod.
operator_throttled() {
  set_event "$1" 'Warning (EniCreateFailed|CloudThrottled)' ||
    k get events -n enim-system --field-selector reason=CloudThrottled,involvedObject.kind=Pod \
      -o jsonpath='{range .items[*]}{.type}{"\n"}{end}' | grep '^Warning$' >/dev/null
}

# Events. enimd: with the cloud throttling the operator, pods without the
# resource (the device plugin does not hold them back) on a primary-mode
# node, one more than its free ENIs: the one left over is refused, a
# Warning NoFreeEni on its Pod; the operator's throttled calls a Warning
# CloudThrottled (on the node's set for a create, on the operator's Pod for
# the listing). The cloud back, every pod runs. The operator: an ENI made on demand for a claim
# is told on the claim and on the DRA node's NetResourceSet.
s_cloud_events() {
  local i d j have rc=0 t0 sg claim
  i=$(primary_plugin_nodes | sed -n 1p)
  [ -n "$i" ] || { echo "no primary-mode device-plugin node"; return 1; }
  cloud_outage throttled
  have=$(cloud_nrs "enim-e2e-node$i" '{.status.summary.available}')
  t0=$(date +%s%N)
  for j in $(seq 1 $((${have:-0} + 1))); do pod "ev-$j" "node=enim-e2e-node$i" res=0 probe=none; done
  wait_for "a Warning NoFreeEni event on a refused pod" 120 refused_pod_event || rc=1
  echo "node $i: $have free ENIs, $((${have:-0} + 1)) pods; refused and told within $(ms_since "$t0") ms:"
  k get events -n default --field-selector reason=NoFreeEni
  # The operator's throttled calls: a create for node 1 (on its set), or
  # the listing of the cluster's ENIs (no node's: on the operator's Pod).
  wait_for "a Warning CloudThrottled of the operator" 90 operator_throttled "$i" || rc=1
  k get events -n default --field-selector "involvedObject.kind=NetResourceSet,involvedObject.name=enim-e2e-node$i"
  k get events -n enim-system --field-selector reason=CloudThrottled
  cloud_outage none
  for j in $(seq 1 $((${have:-0} + 1))); do ready "ev-$j" 180 || rc=1; done
  [ "$rc" = 0 ] && echo "the cloud back: every ev-* pod runs"
  d=$(dra_nodes | sed -n 1p)
  [ -n "$d" ] || { echo "no DRA node"; return 1; }
  sg=$(on_vpc python3 "$repo/scripts/cluster/cloud.py" sg "$work/cloud.json" enim-claim-ev)
  claim_template ev-db "device.attributes[\"sg.enim.io\"].?${sg//-/_}.orValue(false)" \
    "{apiVersion: enim.io/v1alpha1, kind: EniParameters, securityGroups: [$sg]}"
  pod ev-claim claim=ev-db
  ready ev-claim 180 || return 1
  wait_for "a ClaimServed event on enim-e2e-node$d's NetResourceSet" 60 set_event "$d" 'Normal ClaimServed' || rc=1
  claim=$(pod_claim ev-claim)
  events_of ResourceClaim "$claim" | grep '^Normal ClaimServed$' >/dev/null || { echo "no ClaimServed event on claim $claim"; rc=1; }
  k get events -n default --field-selector "involvedObject.kind=ResourceClaim,involvedObject.name=$claim"
  k get events -n default --field-selector "involvedObject.kind=NetResourceSet,involvedObject.name=enim-e2e-node$d"
  return $rc
}

# --- performance ----------------------------------------------------------

# on_cloud_node I CMD...: CMD with node.sh's per-node functions (on_node,
# and so scenarios.sh's bridge_on, bridge_off, add_seconds) pointed at node
# I, in a subshell: the caller's stay the VPC's.
on_cloud_node() { (cloud_node "$1"; shift; "$@"); }

# netns_move_times I N: the kernel's cost of the move a primary-mode ADD
# makes, on node I: N veth pairs, each with its far end in a namespace of
# its own (as the simulator plugs an ENI) and its near end on the node,
# each moved into a fresh namespace and renamed eth0 in one rtnetlink
# message, timed in one process (netns-move-times.py). Prints p50 p95 in
# microseconds.
netns_move_times() {
  local i=$1 n=$2 j far=$tag-mvfar args=() out rc=0
  ip netns add "$far"
  for j in $(seq 1 "$n"); do
    ip netns add "$tag-mv$j"
    ip -n "$tag-n$i" link add "enimmv$j" type veth peer name "far$j" netns "$far"
    args+=("enimmv$j:/run/netns/$tag-mv$j")
  done
  out=$(nsenter --net="/run/netns/$tag-n$i" python3 "$repo/scripts/cluster/netns-move-times.py" "${args[@]}") || rc=1
  for j in $(seq 1 "$n"); do ip netns del "$tag-mv$j" 2>/dev/null || true; done
  ip netns del "$far"
  [ $rc = 0 ] && pcts <<<"$out"
}

# Where the phase breakdowns' logs of the agents and the operator go.
PHASE_LOGS=""
# phase_logs I: PHASE_LOGS/agents-nI.log, every enim-system pod's log on
# node I (enimd, its device plugin), and PHASE_LOGS/operator.log, both
# replicas', with the runtime's timestamps.
phase_logs() {
  local p
  PHASE_LOGS=$work/phase-logs
  mkdir -p "$PHASE_LOGS"
  for p in $(k -n enim-system get pods --field-selector "spec.nodeName=enim-e2e-node$1" -o name); do
    k -n enim-system logs "$p" --all-containers --timestamps 2>/dev/null || true
  done > "$PHASE_LOGS/agents-n$1.log"
  k -n enim-system logs -l app.kubernetes.io/component=operator --all-containers --timestamps --tail=-1 \
    > "$PHASE_LOGS/operator.log" 2>/dev/null || true
}

# pod_phases TITLE T0_NS END_NS I POD [--at LABEL FILE REGEX]...: where
# POD's apply (T0) -> Ready (END) on node I went, from the logs of the
# kubelet, containerd and enimd (phases.py), with the caller's milestones
# before these; one line, kept for the results. Call phase_logs I first.
# enim's components log JSON here (deploy/'s log_format): their REGEXes
# match its "message" and fields.
pod_phases() {
  local title=$1 t0=$2 end=$3 i=$4 n=$work/n$4/logs p=$5 line
  shift 5
  line=$(python3 "$repo/scripts/cluster/phases.py" "$title" "$t0" "$end" "$@" \
    --at "the kubelet has it (API server, scheduler)" "$n/kubelet.log" "SyncLoop ADD.*\"default/$p\"" \
    --at "the kubelet asks for its sandbox" "$n/containerd.log" 'RunPodSandbox for name:\\"'"$p"'\\"(?!.*returns)' \
    --at "up to enimd's ADD done (netns, the plugins' exec, the ADD)" "$PHASE_LOGS/agents-n$i.log" "\"message\":\"attached\",.*\"pod\":\"default/$p\"" \
    --at "the rest of RunPodSandbox" "$n/containerd.log" 'RunPodSandbox for name:\\"'"$p"'\\".*returns sandbox id \\"(?P<sid>[0-9a-f]+)' \
    --at "its container made" "$n/containerd.log" 'CreateContainer within sandbox \\"{sid}\\".*returns container id \\"(?P<cid>[0-9a-f]+)' \
    --at "its container started" "$n/containerd.log" 'StartContainer for \\"{cid}\\" returns successfully' \
    --at "the kubelet sees it started (PLEG relist)" "$n/kubelet.log" 'SyncLoop \(PLEG\).*"Type":"ContainerStarted","Data":"{cid}"' \
    --at "?its readiness probe passed" "$n/kubelet.log" 'SyncLoop \(probe\).*status="ready".*pod="default/'"$p"'"') || return 0
  cloud_perf "$line"
}

# One at a time, per plugin and node: 8 keep the scenario near 2 minutes
# on 2 busy cores (about 3 s a pod); their p95 is their maximum (12 would
# give one that is not, for a minute more).
CLOUD_PERF_PODS=8
# A pod that ends at once on SIGTERM (a shell as PID 1 ignores it, and the
# grace period would be waited out).
QUICK_EXIT="trap 'exit 0' TERM; sleep 100000 & wait"

# until_in_log FILE REGEX: waits (100 ms apart, 60 s at most) until a line
# near the end of FILE matches REGEX (grep -E); prints the last such line.
until_in_log() {
  local j line
  for j in $(seq 600); do
    line=$(tail -n 300 "$1" | grep -E "$2" | tail -n 1 || true)
    [ -z "$line" ] || { echo "$line"; return 0; }
    sleep 0.1
  done
  echo "timed out waiting for /$2/ in $1" >&2
  return 1
}

# sandboxes_one_at_a_time PREFIX N I KEY=VALUE...: N pods (pod's keys) on
# node I, one at a time, as RunPodSandbox samples for sandbox-times.py:
# each is deleted as soon as containerd has returned its sandbox, and the
# next applied once that sandbox is stopped (its CNI DEL done), so no two
# overlap. It waits for neither Ready (the kubelet's 1 s PLEG relist) nor
# the API's deletion: a fraction of one_at_a_time's time per pod.
# (containerd's log quotes names as \"NAME\": hence the \\\\ below.)
# Prints where the loop's own time went, to keep the run's time in view.
sandboxes_one_at_a_time() {
  local prefix=$1 n=$2 i=$3 log=$work/n$3/logs/containerd.log j line sid t0 t1 t2 up=0 down=0
  shift 3
  for j in $(seq 1 "$n"); do
    t0=$(date +%s%N)
    pod "$prefix$j" probe=none cmd="$QUICK_EXIT" "node=enim-e2e-node$i" "$@"
    line=$(until_in_log "$log" "RunPodSandbox for name:\\\\\"$prefix$j\\\\\".*returns sandbox id") || return 1
    sid=$(sed -n 's/.*returns sandbox id \\"\([0-9a-f]*\).*/\1/p' <<<"$line")
    t1=$(date +%s%N)
    k delete pod "$prefix$j" --wait=false >/dev/null
    until_in_log "$log" "StopPodSandbox for \\\\\"$sid\\\\\" returns successfully" >/dev/null || return 1
    t2=$(date +%s%N)
    up=$((up + t1 - t0)) down=$((down + t2 - t1))
  done
  echo "$prefix*: $n pods, each apply -> sandbox returned $((up / n / 1000000)) ms, delete -> sandbox stopped $((down / n / 1000000)) ms (means)"
}

# checkpoint_seconds: enimd's checkpoint writes, count and total seconds.
checkpoint_seconds() { timer_seconds http://127.0.0.1:9464/metrics enim_checkpoint_write_duration_seconds; }
# cni_seconds: containerd's count and total seconds of CNI setups (the
# whole chain, its own timer) on this node, from its metrics.
cni_seconds() {
  timer_seconds http://127.0.0.1:1338/v1/metrics containerd_cri_network_plugin_operations_duration_seconds_seconds \
    'operation_type="set_up_pod"'
}

# (perf) RunPodSandbox of enim against the reference bridge on the same
# cloud node, one pod at a time, on node 1 (primary mode, a whole ENI
# moves into the pod) and node 2 (secondary mode); the kernel's cost of
# that move on node 1; containerd's CNI setup and enimd's ADD, server
# side. Against the goals: primary <= (bridge + the move) x 1.05,
# secondary <= bridge x 1.05. Then one pod on a warm ENI (address) of
# each node, its apply -> Running in phases.
s_cloud_perf() {
  local i mode se sb a0 a1 c0 c1 c2 c3 w0 w1 mv t0 t_end rc=0 PERF_TAG=cloud
  local -A sandboxes means
  mv=$(netns_move_times 1 20) || { echo "timing the netns move failed"; return 1; }
  cloud_perf "the kernel's move of a veth (an ENI here) into a fresh netns with its rename, one rtnetlink message timed in one process, 20 on enim-e2e-node1: $(awk '{ printf "p50 %.1f ms p95 %.1f ms", $1 / 1000, $2 / 1000 }' <<<"$mv")"
  for i in 1 2; do
    mode=$(pool_mode "$i")
    a0=$(on_cloud_node "$i" add_seconds)
    c0=$(on_cloud_node "$i" cni_seconds)
    w0=$(on_cloud_node "$i" checkpoint_seconds)
    sandboxes_one_at_a_time "cperf-enim-$i-" "$CLOUD_PERF_PODS" "$i" res=1 || return 1
    a1=$(on_cloud_node "$i" add_seconds)
    w1=$(on_cloud_node "$i" checkpoint_seconds)
    c1=$(on_cloud_node "$i" cni_seconds)
    on_cloud_node "$i" bridge_on
    c2=$(on_cloud_node "$i" cni_seconds)
    sandboxes_one_at_a_time "cperf-bridge-$i-" "$CLOUD_PERF_PODS" "$i" res=0 || rc=1
    c3=$(on_cloud_node "$i" cni_seconds)
    on_cloud_node "$i" bridge_off
    [ $rc = 0 ] || return 1
    se=$(python3 "$repo/scripts/cluster/sandbox-times.py" "$work/n$i/logs/containerd.log" "cperf-enim-$i-") || return 1
    sb=$(python3 "$repo/scripts/cluster/sandbox-times.py" "$work/n$i/logs/containerd.log" "cperf-bridge-$i-") || return 1
    perf_line "one at a time on enim-e2e-node$i ($mode mode)" "$se" "$sb"
    means[$mode]="$(add_since "$c0" "$c1")|$(add_since "$c2" "$c3")|$(add_since "$a0" "$a1")"
    cloud_perf "enim-e2e-node$i ($mode mode), means: containerd's CNI setup (the chain), enim $(cut -d'|' -f1 <<<"${means[$mode]}"), bridge $(cut -d'|' -f2 <<<"${means[$mode]}"); enimd's ADD, server side, $(cut -d'|' -f3 <<<"${means[$mode]}"); its checkpoint writes (ADDs' and DELs'), $(add_since "$w0" "$w1" | sed 's/ADDs/writes/')"
    sandboxes[$mode]="$se|$sb"
  done
  # The goals, and where enim's extra time over bridge goes: the CNI
  # chain's (containerd's timer) and, within it, enimd's ADD.
  cloud_perf "$(python3 -c "
import re, sys
mv = [int(x) / 1000 for x in sys.argv[1].split()]
(pe, pb), (se, sb) = ([[float(x) for x in v.split()[1:]] for v in a.split('|')] for a in sys.argv[2:4])
(pc, pbc, pa), (sc, sbc, sa) = ([float(re.search(r'mean (\\S+) ms', m).group(1)) for m in a.split('|')] for a in sys.argv[4:6])
print(f'goals, RunPodSandbox p50 (p95): primary / (bridge + move) {pe[0] / (pb[0] + mv[0]):.2f} x ({pe[1] / (pb[1] + mv[1]):.2f} x), goal <= 1.05; '
      f'secondary / bridge {se[0] / sb[0]:.2f} x ({se[1] / sb[1]:.2f} x), goal <= 1.05. '
      f'enim - bridge: primary p50 {pe[0] - pb[0]:.0f} ms, CNI setup mean {pc - pbc:.0f} ms (enimd ADD {pa:.1f} ms, the move {mv[0]:.1f} ms); '
      f'secondary p50 {se[0] - sb[0]:.0f} ms, CNI setup mean {sc - sbc:.0f} ms (enimd ADD {sa:.1f} ms)')
" "$mv" "${sandboxes[primary]}" "${sandboxes[secondary]}" "${means[primary]}" "${means[secondary]}")"
  for i in 1 2; do
    mode=$(pool_mode "$i")
    a0=$(on_cloud_node "$i" add_seconds)
    t0=$(date +%s%N)
    pod "cperf-warm-$i" "node=enim-e2e-node$i" probe=none
    ready "cperf-warm-$i" 60 || return 1
    t_end=$(date +%s%N)
    a1=$(on_cloud_node "$i" add_seconds)
    phase_logs "$i"
    pod_phases "phases, a pod on a warm $([ "$mode" = primary ] && echo ENI || echo address) (enim-e2e-node$i, $mode mode, device plugin; enimd's ADD: $(add_since "$a0" "$a1")), apply -> Running" \
      "$t0" "$t_end" "$i" "cperf-warm-$i"
  done
}

cloud_clean() {
  k delete deployment,pod,svc,resourceclaimtemplate,resourceclaim -l e2e=1 --wait=true --timeout=120s >/dev/null 2>&1 || true
}

# cloud_scenario NAME FUNCTION: e2e-cluster.sh's scenario, timed, cleaned
# the cloud's way.
cloud_scenario() {
  local name=$1 f=$2 t0
  wanted "$f" || return 0
  lane_enter "$f"
  step "[$run] $name ($(elapsed))"
  t0=$(date +%s%N)
  if "$f"; then pass "$name"; else fail "$name"; diagnose; fi
  phase_time "scenario $f" "$t0"
  cloud_clean
  lane_leave
}

run_cloud_scenarios() {
  cloud_scenario "each operator pool's node has its NetResourceSet filled from moto ($CLOUD_MIN_ENIS ENIs; secondary: $CLOUD_MIN_ADDRESSES addresses) by an operator with no key (IRSA against moto's STS); each ENI hot-plugs into its node only" s_cloud_nrs
  cloud_scenario "a pod on each device-plugin node runs on an ENI from moto: node 1's pod on a whole ENI with its address, node 2's (secondary mode) on one of an ENI's secondary addresses" s_cloud_pods
  cloud_scenario "migration from AWS VPC CNI: on node 1, whose old CNI's conflist (10-aws) and pod predate enim, enim's 05-enim conflist comes first; the old pod keeps its network and runs on, a new pod runs on an ENI, the old pod is deleted through enim" s_cloud_migration
  cloud_scenario "DRA (pool primary-dra): a pod's claim is allocated an ENI from moto on that node, and the pod runs on it" s_cloud_dra
  cloud_scenario "across nodes and modes (node 1 primary, node 2 secondary): pod to pod, a ClusterIP Service with its backend on the other node, CoreDNS" s_cloud_cross
  cloud_scenario "IPv6: the pod subnet's block gives each ENI an address; pods on a whole ENI (node 1 by the device plugin, the DRA node by a claim) have moto's address on eth0 and in podIPs, and ping each other across nodes" s_cloud_ipv6
  cloud_scenario "performance: RunPodSandbox of enim against bridge on node 1 (primary) and node 2 (secondary), the kernel's netns move; a warm pod's apply -> Running in phases on each" s_cloud_perf
  cloud_scenario "a NodePort from outside the cluster (the VPC namespace) to each node, its backend on node 2" s_cloud_nodeport
  cloud_scenario "metadata: node 1 reads its instance from the VPC's IMDS; a pod on its ENI is refused; an opted-in namespace reaches it" s_cloud_metadata
  cloud_scenario "EniPolicy through the operator's webhook: a pod with no enim field, in a namespace a policy selects, gets enim.io/eni and the policy's annotation and runs on an ENI from moto; the cluster default, priority between two policies, a deleted policy, no replica serving (refused in scope, admitted where ignored), the serving certificate renewed during 2,000 creations with none refused, a policy naming a security group and a subnet per zone: a Deployment's 2 pods get a claim each and run on the DRA node on ENIs made in moto with exactly that group in its zone's subnet; a policy keeping one ENI warm: made before any pod, its pod runs on it, another made in its place, the free one deleted with the policy; a zone with no node and a subnet the cloud refuses: the pod Pending, told why, the policy CloudRefused; a secondary policy of the secondary pool's group: its pod, with no nodeSelector, steered to that pool's node, on an address of an ENI with exactly that group in moto; one of a group no secondary pool has: its pod refused at admission, the policy NotServedYet" s_cloud_policy
  cloud_scenario "on demand: a claim for a security group no ENI has gets an ENI made in moto with exactly it on the DRA node; its pod runs; deleting the pod (and so its claim) deletes the ENI" s_cloud_on_demand
  cloud_scenario "enimd's crashes on a cloud node: on node 1 (primary, ENIs from moto through its NetResourceSet), $CLOUD_RESTARTS kill -9s and $CLOUD_RESTARTS rollout restarts with pods admitted through each; every pod runs" s_cloud_admission
  cloud_scenario "cloud outage: 60 s of 503s (Unavailable, then RequestLimitExceeded) from EC2 while pods come and go: each runs from a warm ENI, none fails but with 'try again later'; after it the sets refill and moto agrees with them" s_cloud_outage
  cloud_scenario "the operator's leader's node powered off: the other replica leads, churn goes on, the new leader makes ENIs; powered on, its pod runs again, no ENI in two sets, moto's ENIs are the sets'" s_cloud_leader_reboot
  cloud_scenario "the late node joins (pool per-node, no operator): its agent's aws provider makes its ENIs in moto, a pod applied before it registered runs on one, and it has no NetResourceSet" s_cloud_late_node
  cloud_scenario "events: the cloud throttling, pods beyond a node's free ENIs: the refused one has a Warning NoFreeEni event on its Pod, the operator a Warning CloudThrottled; the cloud back, every pod runs; an ENI made for a claim has a ClaimServed event on the claim and on the DRA node's NetResourceSet" s_cloud_events
  cloud_scenario "helm upgrade to a new image tag while pods hold ENIs (a whole ENI, a secondary address, a DRA claim): the DaemonSets and the operator roll; each pod keeps its ENI (same pod, eth0, set entry, moto attachment); a new pod runs" s_cloud_helm_upgrade
  # Last: node 2 does not come back.
  cloud_scenario "a node deleted: its ENIs detached and deleted in moto within node_grace, its set gone, nothing of it left" s_cloud_node_deleted
  # Last of all: it removes enim.
  cloud_scenario "helm uninstall, its pods deleted first: the hook cleans every node's conflist and plugin and has the operator release its ENIs; every object of the release gone, the kubelet deletes enim's ResourceSlices, no set and no operator ENI left in moto, the CRD stays" s_cloud_helm_uninstall
}
