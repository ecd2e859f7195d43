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
mac_on_node() { ip -n "$tag-n$1" -o link show | grep -qi "link/ether $2 "; }

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

# pod_on NODE NAME: a pod like scenarios.sh's (busybox serving its name on
# 8080, one enim.io/eni), pinned to node NODE.
pod_on() {
  local i=$1 name=$2
  k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $name
  labels: {app: $name, e2e: "1"}
spec:
  nodeSelector: {kubernetes.io/hostname: enim-e2e-node$i}
  terminationGracePeriodSeconds: 1
  containers:
    - name: c
      image: $BUSYBOX
      imagePullPolicy: Never
      args: ["mkdir -p /www && echo $name > /www/index.html && exec httpd -f -p 8080 -h /www"]
      ports: [{containerPort: 8080}]
      readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 1}
      resources: {limits: {enim.io/eni: 1}}
EOF
}

# (2) A pod on each node runs on an ENI from moto: its podIP is the primary
# address moto assigned to an ENI attached to that node's instance, and
# that ENI's device is the pod's eth0.
s_cloud_pods() {
  local i ip enis line id mac dev rc=0
  for i in $(seq 1 "$CLOUD_NODES"); do pod_on "$i" "web-$i"; done
  for i in $(seq 1 "$CLOUD_NODES"); do ready "web-$i" 120 || return 1; done
  enis=$(moto_enis)
  for i in $(seq 1 "$CLOUD_NODES"); do
    ip=$(pod_ip "web-$i")
    line=$(jq -c --arg ip "$ip" '.[] | select(.addresses[0] == $ip)' <<<"$enis")
    [ -n "$line" ] || { echo "web-$i: podIP $ip is no ENI's primary address in moto"; rc=1; continue; }
    id=$(jq -r .id <<<"$line")
    [ "$(jq -r .instance <<<"$line")" = "$(node_instance "$i")" ] ||
      { echo "web-$i: $ip is $id's, attached to $(jq -r .instance <<<"$line"), not node $i's instance"; rc=1; }
    mac=$(jq -r .mac <<<"$line")
    dev=$(in_pod "web-$i" "cat /sys/class/net/eth0/address")
    [ "$dev" = "$mac" ] || { echo "web-$i: eth0 has MAC $dev, $id has $mac"; rc=1; }
    echo "web-$i on enim-e2e-node$i: $ip = moto's $id ($mac), the pod's eth0"
  done
  return $rc
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
  wait_for "the Service's endpoints" 60 in_pod x-1 "printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 $svc 80 | grep -q x-2" || return 1
  echo "ClusterIP $svc (in $SERVICE_CIDR) from node 1 -> backend x-2 on node 2"
  dns_node=$(k -n kube-system get pod -l k8s-app=kube-dns -o jsonpath='{.items[0].spec.nodeName}')
  for a in 1 2; do
    out=$(in_pod "x-$a" "nslookup across.default.svc.cluster.local $DNS_IP") && grep -q "$svc" <<<"$out" ||
      { echo "DNS from x-$a: $out"; return 1; }
  done
  out=$(in_pod x-1 "cat /etc/resolv.conf" | grep nameserver)
  echo "CoreDNS ($DNS_IP, on $dns_node) from both nodes: across.default -> $svc; x-1's $out"
}

cloud_clean() {
  k delete pod,svc -l e2e=1 --wait=true --timeout=120s >/dev/null 2>&1 || true
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
  cloud_scenario "a pod on each node runs on an ENI from moto, with the address moto assigned" s_cloud_pods
  cloud_scenario "across nodes: pod to pod, a ClusterIP Service with its backend on the other node, CoreDNS" s_cloud_cross
}
