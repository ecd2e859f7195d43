# Scenarios of the cloud run (scripts/cluster/cloud.sh): ENIs from moto
# through enim-operator, hot-plugged by enim-vpcsim, pods on them across
# nodes. Sourced by cloud_run after scenarios.sh's helpers (pod, ready,
# in_pod, http_get, clean's parts); each s_* returns 0 for PASS.

. "$repo/scripts/cluster/scenarios.sh"

# What the operator keeps on every node (enim-config.py's PROVIDER aws:
# min_allocate 2, pre_allocate 1).
CLOUD_MIN_ENIS=2

# cloud_nrs NODE JSONPATH: a field of NODE's NetResourceSet.
cloud_nrs() { k get nrs "$1" -o "jsonpath=$2"; }
# moto_enis: every ENI in moto (cloud.py enis), JSON.
moto_enis() { on_vpc python3 "$repo/scripts/cluster/cloud.py" enis "$work/cloud.json"; }
on_vpc() { nsenter --net="/run/netns/$vpc" -- "$@"; }
node_instance() { cloud_field ".nodes[$(($1 - 1))].instance_id"; }

# nrs_filled I: node I's set lists at least CLOUD_MIN_ENIS ENIs and its
# agent counts them all.
nrs_filled() {
  local n=enim-e2e-node$1 spec status
  spec=$(cloud_nrs "$n" '{.spec.enis[*].id}' | wc -w)
  status=$(cloud_nrs "$n" '{.status.summary.enis}')
  [ "$spec" -ge "$CLOUD_MIN_ENIS" ] && [ "$status" = "$spec" ]
}

# mac_on_node I MAC: the device with MAC is in node I's netns (not in a
# pod's).
mac_on_node() { ip -n "$tag-n$1" -o link show | grep -i "link/ether $2 " >/dev/null; }

# (1) Each node's NetResourceSet fills from moto to the watermarks; each
# ENI is in moto attached to that node's instance, tagged for the cluster,
# in the pod subnet, and its device is on that node and on no other.
s_cloud_nrs() {
  local i j id mac enis line rc=0 t0
  k -n enim-system rollout status deployment/enim-operator --timeout=180s || return 1
  k -n enim-system rollout status daemonset/enimd --timeout=180s || return 1
  for i in $(seq 1 "$CLOUD_NODES"); do
    t0=$(date +%s%N)
    wait_for "enim-e2e-node$i's set to fill to $CLOUD_MIN_ENIS ENIs" 240 nrs_filled "$i" || return 1
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
  return $rc
}

# pod_on NODE NAME [NAMESPACE]: scenarios.sh's pod (busybox serving its
# name on 8080, one enim.io/eni), pinned to node NODE.
pod_on() { pod "$2" node="enim-e2e-node$1" ns="${3:-default}"; }

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
# The nodes of pool primary (the device plugin's), and of primary-dra.
plugin_nodes() { local i; for i in $(seq 1 "$CLOUD_NODES"); do [ "$(cloud_pool "$i")" = primary ] && echo "$i"; done; }
dra_nodes() { local i; for i in $(seq 1 "$CLOUD_NODES"); do [ "$(cloud_pool "$i")" = primary-dra ] && echo "$i"; done; }

# on_moto_eni POD I: POD runs on node I, on an ENI moto attached to node
# I's instance: its podIP is that ENI's primary address, eth0 its MAC.
on_moto_eni() {
  local pod=$1 i=$2 ip line id mac dev on
  on=$(k get pod "$pod" -o jsonpath='{.spec.nodeName}')
  [ "$on" = "enim-e2e-node$i" ] || { echo "$pod runs on '$on', not enim-e2e-node$i"; return 1; }
  ip=$(pod_ip "$pod")
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
# of the namespace enim-config.py opts in reaches it.
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
eni_gone_from_moto() { [ -z "$(moto_enis | jq -r --arg id "$1" '.[] | select(.id == $id) | .id')" ]; }
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }

# (7) On demand: a claim asking for a security group no ENI has gets an
# ENI made in moto with exactly that group, hot-plugged into the DRA node,
# and its pod runs on it; deleting the pod (and so its claim) deletes the ENI.
# apply -> Running is compared with a claim pod served from a warm ENI.
s_cloud_on_demand() {
  local i sg t0 warm line id groups claim
  i=$(dra_nodes | sed -n 1p)
  claim_template any-eni
  t0=$(date +%s%N)
  pod warm-1 claim=any-eni
  ready warm-1 120 || return 1
  warm=$(ms_since "$t0")
  echo "apply -> Running of a claim pod from a warm ENI: $warm ms"
  k delete pod warm-1 --wait=true >/dev/null
  sg=$(on_vpc python3 "$repo/scripts/cluster/cloud.py" sg "$work/cloud.json" enim-claim-db)
  claim_template db "device.attributes[\"sg.enim.io\"].?${sg//-/_}.orValue(false)" \
    "{apiVersion: enim.io/v1alpha1, kind: EniParameters, securityGroups: [$sg]}"
  t0=$(date +%s%N)
  pod od-1 claim=db
  ready od-1 180 || { echo "ENIs made for claims: $(claim_enis | tr '\n' ';')"; return 1; }
  echo "apply -> Running of a claim pod whose ENI is made on demand: $(ms_since "$t0") ms (warm: $warm ms)"
  on_moto_eni od-1 "$i" || return 1
  claim=$(pod_claim od-1)
  id=$(claim_device "$claim")
  line=$(moto_enis | jq -c --arg id "$id" '.[] | select(.id == $id)')
  groups=$(jq -r '.groups | join(",")' <<<"$line")
  [ "$groups" = "$sg" ] || { echo "$id has groups $groups in moto, not exactly $sg"; return 1; }
  echo "$id made in moto with exactly $sg, for claim $claim ($(claim_enis | tr '\n' ' '))"
  # The pod's claim goes with it (made from the pod's template).
  k delete pod od-1 --wait=true >/dev/null
  t0=$(date +%s%N)
  wait_for "$id deleted in moto" 240 eni_gone_from_moto "$id" || return 1
  echo "pod and its claim deleted: $id gone from moto $(ms_since "$t0") ms later"
}

# (4) The late node joins: its kubelet starts (its instance ran from the
# start), the operator makes its ENIs, and a pod applied before it
# registered runs on one of them. Timed from registration.
s_cloud_late_node() {
  local i=$CLOUD_LATE t0 t_reg
  pod_on "$i" late-1
  t0=$(date +%s%N)
  cloud_node_up "$i"
  cloud_cp
  wait_for "enim-e2e-node$i to register" 240 k get node "enim-e2e-node$i" || return 1
  t_reg=$(date +%s%N)
  echo "enim-e2e-node$i registered $((($t_reg - t0) / 1000000)) ms after its containerd started"
  ready late-1 240 || return 1
  echo "registration -> first pod Ready: $(ms_since "$t_reg") ms"
  nrs_filled "$i" || { echo "its set: $(cloud_nrs "enim-e2e-node$i" '{.spec.enis[*].id}')"; return 1; }
  on_moto_eni late-1 "$i"
}

cloud_clean() {
  k delete pod,svc,resourceclaimtemplate,resourceclaim -l e2e=1 --wait=true --timeout=120s >/dev/null 2>&1 || true
}

# cloud_scenario NAME FUNCTION: e2e-cluster.sh's scenario, timed, cleaned
# the cloud's way.
cloud_scenario() {
  local name=$1 f=$2 t0
  wanted "$f" || return 0
  step "[$run] $name ($(elapsed))"
  t0=$(date +%s%N)
  if "$f"; then pass "$name"; else fail "$name"; diagnose; fi
  phase_time "scenario $f" "$t0"
  cloud_clean
}

run_cloud_scenarios() {
  cloud_scenario "each node's NetResourceSet fills from moto to $CLOUD_MIN_ENIS ENIs; each ENI hot-plugs into its node only" s_cloud_nrs
  cloud_scenario "a pod on each node of pool primary runs on an ENI from moto, with the address moto assigned" s_cloud_pods
  cloud_scenario "DRA (pool primary-dra): a pod's claim is allocated an ENI from moto on that node, and the pod runs on it" s_cloud_dra
  cloud_scenario "across nodes: pod to pod, a ClusterIP Service with its backend on the other node, CoreDNS" s_cloud_cross
  cloud_scenario "a NodePort from outside the cluster (the VPC namespace) to each node, its backend on node 2" s_cloud_nodeport
  cloud_scenario "metadata: node 1 reads its instance from the VPC's IMDS; a pod on its ENI is refused; an opted-in namespace reaches it" s_cloud_metadata
  cloud_scenario "on demand: a claim for a security group no ENI has gets an ENI made in moto with exactly it on the DRA node; its pod runs; deleting the pod (and so its claim) deletes the ENI" s_cloud_on_demand
  cloud_scenario "the late node joins: the operator makes its ENIs, a pod applied before it registered runs on one" s_cloud_late_node
  # Last: node 2 does not come back.
  cloud_scenario "a node deleted: its ENIs detached and deleted in moto within node_grace, its set gone, nothing of it left" s_cloud_node_deleted
}
