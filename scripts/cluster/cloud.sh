# The cloud run of scripts/e2e-cluster.sh (`--mode cloud`): several nodes
# whose ENIs come from the EC2 API (moto) and hot-plug into them through
# the VPC simulator (enim-vpcsim, testkit/src/vpc). Sourced after node.sh,
# whose per-node functions it points at each node in turn (node.sh's
# header: node, nw, NODE_NAME, NODE_IP, cgroot).
#
# Layout (TAG as in node.sh):
#
#   $TAG-vpc   netns: the VPC. moto ($MOTO_IP:5000) and the control plane
#              (etcd on its loopback, kube-apiserver on $API_IP), both on
#              its lo, as a cloud's own endpoints; enim-vpcsim routes every
#              address moto assigned to the far end of its ENI here, holds
#              each subnet's gateway, and serves instance metadata at
#              169.254.169.254 by the caller's source address. Nothing
#              leaves it. A mount namespace of its own ($work/cp, no
#              binds), so that its processes are found and ended as a
#              node's are.
#   $TAG-nI    netns and mount namespace of node I (as node.sh's one node):
#              eth0 is moto's primary ENI of instance I, addressed by
#              enim-vpcsim with moto's address, default route via the node
#              subnet's gateway; every ENI moto attaches to instance I
#              appears here as eth<device index>. containerd, the kubelet
#              (--provider-id aws:///<zone>/<instance>) and kube-proxy
#              (clusterCIDR unset). Its dir is $work/nI.
#
# Every node netns is made before the VPC's mount namespace: a netns
# mounted on /run/netns later would not show in that (private) namespace,
# and enim-vpcsim opens the nodes' netns from there.

CLOUD_NODES=3
# The late node, CLOUD_NODES + 1: its instance runs from the start (the
# simulator plugs its eth0), its kubelet joins in a scenario.
CLOUD_LATE=$((CLOUD_NODES + 1))
# enim's node pools (the node label enim.io/pool), one enimd DaemonSet and
# config each (the chart's pools, cloud-values.py): node 1 primary mode and node 2 secondary
# mode, both through the operator with the device plugin; node 3 primary
# mode with DRA through the operator; the late node primary mode on its
# own agent's `aws` provider, which no operator pool selects.
CLOUD_POOLS=(primary secondary primary-dra per-node)
# ENIs a node can take besides its primary (cloud.py's m5.4xlarge: 8).
CLOUD_MAX_ENIS=7
# Addresses on the VPC's lo: in the VPC's range, in none of its subnets.
API_IP=10.0.255.1
MOTO_IP=10.0.255.2
MOTO_URL=http://$MOTO_IP:5000
# The fault proxy in front of moto (enim-vpcsim's): the operator's EC2
# endpoint. What $work/outage says (cloud_outage) is what it answers.
PROXY_IP=10.0.255.3
# The node subnet's gateway (cloud.py's NODE_SUBNET, first host).
NODE_GW=10.0.1.1
vpc=""

# cloud_perf LINE: prints LINE and keeps it for the results (e2e-cluster.sh
# prints PERF_OUT at the end).
cloud_perf() {
  echo "$1"
  echo "[cloud] $1" >> "$PERF_OUT"
}
# phase_time WHAT T0_NS: how long WHAT took, as cloud_perf.
phase_time() { cloud_perf "time: $1: $((($(date +%s%N) - $2) / 1000000)) ms"; }

# cloud_outage unavailable|throttled|none: what every EC2 call through the
# fault proxy answers from now on (within 200 ms).
cloud_outage() {
  if [ "$1" = none ]; then rm -f "$work/outage"; else echo "$1" > "$work/outage"; fi
}

vpcsim_bin() { echo "${CARGO_TARGET_DIR:-$repo/target}/debug/enim-vpcsim"; }

# cloud_field JQ: a field of cloud.py's state.
cloud_field() { jq -r "$1" "$work/cloud.json"; }

# cloud_cp: the per-node functions act on the VPC namespace (control plane,
# moto, the simulator).
cloud_cp() {
  node=$vpc nw=$work/cp NODE_NAME=enim-e2e-cp NODE_IP=$API_IP cgroot=/$tag-cp
}
# cloud_node I: ... on node I (1-based).
cloud_node() {
  node=$tag-n$1 nw=$work/n$1 NODE_NAME=enim-e2e-node$1 cgroot=/$tag-n$1
  NODE_IP=$(jq -r ".nodes[$(($1 - 1))].ip // empty" "$work/cloud.json" 2>/dev/null || true)
}

# cp_mnt_up: the VPC's mount namespace, with none of a node's binds.
cp_mnt_up() {
  # shellcheck disable=SC2034 # read by mnt_up (dynamic scope)
  local NODE_DIRS=()
  mnt_up
}

vpcsim_config() {
  python3 - "$work/cloud.json" "/run/netns/$vpc" "$tag" <<'EOF'
import json, sys
state, vpc, tag = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
key = state["keys"]["vpcsim"]
print(f'vpc_netns = "{vpc}"')
print("[moto]")
print(f'endpoint = "{state["url"]}"\nregion = "{state["region"]}"')
print(f'access_key_id = "{key["id"]}"\nsecret_access_key = "{key["secret"]}"')
proxy = state["proxy_url"].removeprefix("http://")
print(f'[fault_proxy]\nlisten = "{proxy}"\ncontrol_file = "{state["outage_file"]}"')
for i, n in enumerate(state["nodes"], 1):
    print(f'[[node]]\ninstance_id = "{n["instance_id"]}"\nnetns = "/run/netns/{tag}-n{i}"\nprimary = "address"')
EOF
}

# cloud_logs: the tails of the VPC's logs (moto, the simulator, the control
# plane) and of each node's, when the bring-up fails.
cloud_logs() {
  local f
  for f in "$work"/cp/logs/*.log "$work"/n*/logs/*.log; do
    [ -f "$f" ] || continue
    echo "--- ${f#"$work"/}"
    tail -n 12 "$f"
  done
}

eth0_has() { ip -n "$node" -4 -o addr show dev eth0 | grep " $1/" >/dev/null; }

# node_pki: the node's kubelet client cert (its own CN, as the Node
# authorizer and NodeRestriction want) and kubeconfig, in $nw/pki.
node_pki() {
  (cd "$work/pki" && pki_cert "kubelet-$NODE_NAME" "/O=system:nodes/CN=system:node:$NODE_NAME" "" client)
  mkdir -p "$nw/pki"
  mv "$work/pki/kubelet-$NODE_NAME.crt" "$nw/pki/kubelet.crt"
  mv "$work/pki/kubelet-$NODE_NAME.key" "$nw/pki/kubelet.key"
  cp "$work/pki/ca.crt" "$nw/pki/ca.crt"
  pki_kubeconfig "$nw/pki" kubelet "https://$API_IP:6443"
}

# cloud_node_up I: node I's namespaces, uplink route, configs and
# components (containerd, the kubelet, kube-proxy).
cloud_node_up() {
  local i=$1 zone instance
  cloud_node "$i"
  zone=$(cloud_field ".nodes[$((i - 1))].zone")
  instance=$(cloud_field ".nodes[$((i - 1))].instance_id")
  mkdir -p "$nw"/{logs,pids,etc}
  wait_for "enim-vpcsim to give $NODE_NAME's eth0 $NODE_IP" 120 eth0_has "$NODE_IP" || { cloud_logs; return 1; }
  ip -n "$node" route add default via "$NODE_GW" dev eth0
  mnt_up
  cgroups_up
  node_pki
  node_configs
  echo "providerID: aws:///$zone/$instance" >> "$nw/etc/kubelet.yaml"
  kube_proxy_config ""
  cp "$bin"/cni/* "$nw/root/opt/cni/bin/"
  start_containerd
  images_import
  local NODE_LABELS
  NODE_LABELS=$(cloud_node_labels "$i")
  start_kubelet
  start_kube_proxy
}

# cloud_node_labels I: what node I registers with: what a cloud-aware
# kubelet sets (the operator reads the instance type and zone), and its
# pool.
cloud_node_labels() {
  echo "node.kubernetes.io/instance-type=$(cloud_field ".nodes[$(($1 - 1))].instance_type")\
,topology.kubernetes.io/zone=$(cloud_field ".nodes[$(($1 - 1))].zone"),enim.io/pool=$(cloud_pool "$1")"
}

# cloud_power_off I, cloud_power_on I: node I stopped as by a power cut (every process of it
# killed at once, its tmpfs state gone: pods' netns, containerd's and
# enimd's run dirs) and booted again: containerd, the kubelet, kube-proxy.
# The ENIs in its pods' netns die with them; the simulator plugs them
# again, as the cloud keeps them attached. Two halves, for scenarios that
# act while the node is down.
cloud_power_off() {
  local p
  cloud_node "$1"
  for p in kubelet kube-proxy containerd; do stop "$p" KILL; done
  kill_node_procs
  clear_node_run
  cloud_cp
}
cloud_power_on() {
  local NODE_LABELS
  cloud_node "$1"
  NODE_LABELS=$(cloud_node_labels "$1")
  start_containerd
  start_kubelet
  start_kube_proxy
  cloud_cp
}

# cloud_up: the VPC, moto and its cloud, the simulator, the control plane,
# CLOUD_NODES nodes registered and labelled.
cloud_up() {
  local i c
  vpc=$tag-vpc
  ip netns add "$vpc"
  ip -n "$vpc" link set lo up
  ip netns exec "$vpc" sysctl -qw net.ipv4.ip_forward=1
  ip -n "$vpc" addr add "$API_IP/32" dev lo
  ip -n "$vpc" addr add "$MOTO_IP/32" dev lo
  ip -n "$vpc" addr add "$PROXY_IP/32" dev lo
  for i in $(seq 1 "$CLOUD_LATE"); do
    ip netns add "$tag-n$i"
    ip -n "$tag-n$i" link set lo up
    ip netns exec "$tag-n$i" sysctl -qw net.ipv4.ip_forward=1
  done
  cloud_cp
  mkdir -p "$nw"/{logs,pids,etc}
  cp_mnt_up
  start moto env INITIAL_NO_AUTH_ACTION_COUNT=0 PYTHONUNBUFFERED=1 \
    python3 "$repo/testkit/src/moto/launch.py" -H "$MOTO_IP" -p 5000
  wait_for moto 120 on_node curl -sf "$MOTO_URL/moto-api/data.json" || { cloud_logs; return 1; }
  on_node python3 "$repo/scripts/cluster/cloud.py" setup "$MOTO_URL" "$CLOUD_LATE" "$work/cloud.json"
  jq --arg p "http://$PROXY_IP:5000" --arg f "$work/outage" '.proxy_url = $p | .outage_file = $f' \
    "$work/cloud.json" > "$work/cloud.json.new" && mv "$work/cloud.json.new" "$work/cloud.json"
  vpcsim_config > "$work/vpcsim.toml"
  start vpcsim "$(vpcsim_bin)" --config "$work/vpcsim.toml"

  # The control plane, once.
  pki_make "$work/pki" "$NODE_NAME" "$API_IP" "$SERVICE_IP"
  for c in admin controller-manager scheduler kube-proxy; do
    pki_kubeconfig "$work/pki" "$c" "https://$API_IP:6443"
  done
  start_etcd
  wait_for etcd 60 on_node "$bin/etcd" --version
  start_apiserver
  wait_for kube-apiserver 240 k get --raw /readyz || { cloud_logs; return 1; }
  start_controllers

  for i in $(seq 1 "$CLOUD_NODES"); do cloud_node_up "$i"; done
  cloud_cp
  for i in $(seq 1 "$CLOUD_NODES"); do
    wait_for "node enim-e2e-node$i" 240 k get node "enim-e2e-node$i" || { cloud_logs; return 1; }
  done
}

cloud_pool() { echo "${CLOUD_POOLS[$(($1 - 1))]}"; }

cloud_down() {
  local i
  for i in $(seq 1 "$CLOUD_LATE"); do
    cloud_node "$i"
    if [ -d "$nw" ]; then cluster_down; else ip netns del "$node" 2>/dev/null || true; fi
  done
  [ -n "$vpc" ] || return 0
  cloud_cp
  stop vpcsim
  stop moto
  cluster_down
}

# helm_e2e ARGS...: the cached helm (build.sh's) on the cluster, from the
# VPC namespace as kubectl; its own state under $work/helm.
helm_e2e() {
  (cloud_cp
    on_node env HELM_CACHE_HOME="$work/helm/cache" HELM_CONFIG_HOME="$work/helm/config" \
      HELM_DATA_HOME="$work/helm/data" "$bin/helm" --kubeconfig "$work/pki/admin.kubeconfig" "$@")
}

# cloud_install: enim as a user installs it: the namespace with its Pod
# Security label and the per-node pool's agent's Secret of cloud keys
# (enim-node-cloud; the operator has none: IRSA) first, then
# `helm install` of charts/enim with values from cloud.py's state
# (cloud-values.py: the node pools primary, secondary, primary-dra and
# per-node, the operator on EC2 at moto with 2 replicas); CoreDNS on the
# cluster's DNS address.
cloud_install() {
  python3 "$repo/scripts/cluster/cloud-values.py" "$work/cloud.json" \
    --replicas 2 --tag "${ENIM_IMAGE##*:}" > "$work/etc/values.json"
  k create namespace enim-system >/dev/null
  k label namespace enim-system app.kubernetes.io/name=enim pod-security.kubernetes.io/enforce=privileged >/dev/null
  k -n enim-system create secret generic enim-node-cloud \
    --from-literal=AWS_ACCESS_KEY_ID="$(cloud_field .keys.node.id)" \
    --from-literal=AWS_SECRET_ACCESS_KEY="$(cloud_field .keys.node.secret)" >/dev/null
  # The scenarios' pods live in default: out of the EniPolicy webhook's
  # scope (failurePolicy Fail), so that the outage and leader scenarios,
  # which take replicas away, never have their pods refused by it.
  k label namespace default enim.io/admission=ignore >/dev/null
  helm_e2e install enim "$repo/charts/enim" --namespace enim-system --values "$work/etc/values.json" >/dev/null
  sed "s/clusterIP: 10.96.0.10/clusterIP: $DNS_IP/" "$repo/scripts/cluster/coredns.yaml" | k apply -f - >/dev/null
}

# cloud_legacy_cni: node 1 as a node of a cluster moving from AWS VPC CNI.
# That CNI's conflist, 10-aws.conflist (the reference bridge stands in for
# it), makes the node Ready, and the pod `legacy` runs on it, before enim
# is installed. s_cloud_migration follows that pod through the switch. It
# carries no e2e label: clean() between scenarios leaves it.
LEGACY_SUBNET=10.244.9.0/24
cloud_legacy_cni() {
  (cloud_node 1; put_conflist 10-aws.conflist) <<JSON
{"cniVersion": "1.0.0", "name": "aws-cni", "plugins": [
  {"type": "bridge", "bridge": "cni-aws", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$LEGACY_SUBNET"}]]}}]}
JSON
  k wait --for=condition=Ready node/enim-e2e-node1 --timeout=120s >/dev/null || return 1
  k apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: legacy, namespace: default, labels: {app: legacy}}
spec:
  terminationGracePeriodSeconds: 1
  nodeSelector: {kubernetes.io/hostname: enim-e2e-node1}
  containers:
    - name: c
      image: $BUSYBOX
      imagePullPolicy: Never
      args: ["mkdir -p /www && echo legacy > /www/index.html && exec httpd -f -p 8080 -h /www"]
YAML
  k wait --for=condition=Ready pod/legacy --timeout=120s >/dev/null
}

# cloud_run: the whole run, each phase timed. Its settings are local, so a
# run of another mode after it keeps node.sh's.
cloud_run() {
  local SERVICE_CIDR=10.100.0.0/16 SERVICE_IP=10.100.0.1 DNS_IP=10.100.0.10 GW_IP=$NODE_GW
  local NODE_NAME NODE_IP t0
  mode=primary provider=aws
  down=cloud_down
  t0=$(date +%s%N)
  cloud_up
  phase_time "bring-up: VPC, moto, simulator, control plane, $CLOUD_NODES nodes" "$t0"
  t0=$(date +%s%N)
  cloud_legacy_cni || { echo "the old CNI's pod did not run on enim-e2e-node1"; cloud_logs; return 1; }
  phase_time "node 1 on the old CNI (10-aws.conflist), a pod on it" "$t0"
  t0=$(date +%s%N)
  cloud_install
  phase_time "enim installed (helm install)" "$t0"
  . "$repo/scripts/cluster/cloud-scenarios.sh"
  run_cloud_scenarios
}
