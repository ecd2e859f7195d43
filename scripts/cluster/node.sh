# A one-node Kubernetes cluster in sandbox namespaces, for scripts/e2e-cluster.sh
# (source it; it runs nothing by itself). Every component is the upstream
# one, built by scripts/cluster/build.sh.
#
# Layout (TAG is unique per run):
#
#   $TAG-gw    netns: the "VPC": the node's uplink peer 10.250.0.1/24 and the
#              far ends of the ENIs, each holding its subnet's gateway;
#              forwards between them and goes nowhere else.
#   $TAG-node  netns: the node. eth0 10.250.0.2/24 (its InternalIP, default
#              route via the VPC), veth pairs eniN standing in for ENIs, and
#              every component: etcd and the control plane on the node's
#              addresses, containerd, the kubelet, kube-proxy (iptables).
#              A mount namespace of its own, where per-run dirs are bound over
#              the paths a node uses (/etc/cni/net.d, /opt/cni/bin,
#              /var/lib/kubelet, /var/lib/containerd, /run/containerd,
#              /run/netns, /var/lib/enim, /run/enim, /var/log/pods), so
#              nothing of this machine's own is touched and hostPath volumes
#              resolve to the sandbox. `/` is rshared there: the DaemonSet's
#              /var/run/netns mount has HostToContainer propagation.
#              /sys is this machine's (nsenter does not remount it, unlike
#              `ip netns exec`), so the kubelet finds the cgroup mounts; its
#              pods' cgroups go under a cgroup root of their own.
#
# Needs: ip, nsenter, unshare, openssl, runc, python3, podman (image builds).

# Set by cluster_init. The per-node functions (on_node, start, stop,
# mnt_up, cgroups_up, node_configs, start_containerd, start_kubelet,
# start_kube_proxy, cluster_down) act on the node that node (its netns),
# nw (its dir: mount namespace, root, logs, pids, configs), NODE_NAME,
# NODE_IP and cgroot name; the one-node cluster's nw is $work itself, and
# scripts/cluster/cloud.sh points them at each of its nodes in turn.
tag="" work="" nw="" node="" gw="" bin="" cgroot=""
ENI_COUNT=0
NODE_IP=10.250.0.2
GW_IP=10.250.0.1
SERVICE_CIDR=10.96.0.0/12
SERVICE_IP=10.96.0.1
DNS_IP=10.96.0.10
NODE_NAME=enim-e2e-node
# Paths bound over per run in the node's mount namespace.
# /run/nri: containerd's NRI socket. Shared, a second node's containerd
# died at start ("bind: address already in use") when two came up at once.
NODE_DIRS=(/etc/cni/net.d /opt/cni/bin /var/lib/kubelet /var/lib/containerd
  /run/containerd /run/nri /run/netns /var/lib/enim /run/enim /var/log/pods /var/log/containers)

. "$(dirname "${BASH_SOURCE[0]}")/pki.sh"

# cluster_init BIN_DIR: names for this run (nothing is made yet).
cluster_init() {
  bin=$1
  tag=enimk8s$$
  work=/var/tmp/$tag
  nw=$work
  node=$tag-node
  gw=$tag-gw
  cgroot=/$tag
  mkdir -p "$work"/{logs,pids,pki,etc}
  # For testkit::cluster (Rust tests against this cluster).
  echo "/run/netns/$node" > "$work/node-netns"
  echo "$bin" > "$work/bin-dir"
}

# Runs a command on the node: its network and mount namespaces.
on_node() { nsenter --mount="$nw/ns/mnt" --net="/run/netns/$node" -- "$@"; }
k() { on_node "$bin/kubectl" --kubeconfig "$work/pki/admin.kubeconfig" "$@"; }
# put_conflist NAME: stdin becomes the node's /etc/cni/net.d/NAME, whole
# (written aside, then renamed): the runtime never reads half a conflist.
put_conflist() {
  on_node sh -c "cat > /etc/cni/net.d/.$1.tmp && mv /etc/cni/net.d/.$1.tmp /etc/cni/net.d/$1"
}
ctr_node() { on_node "$bin/ctr" --address /run/containerd/containerd.sock "$@"; }

# start NAME CMD...: a component on the node, in the background, logging to
# $nw/logs/NAME.log. exec, so that $! is the component itself.
start() {
  local name=$1; shift
  (exec nsenter --mount="$nw/ns/mnt" --net="/run/netns/$node" -- "$@") >> "$nw/logs/$name.log" 2>&1 &
  echo $! > "$nw/pids/$name"
}

# stop NAME [SIGNAL]: stops a component and waits for it to exit.
stop() {
  local name=$1 sig=${2:-TERM} pid i
  [ -f "$nw/pids/$name" ] || return 0
  pid=$(cat "$nw/pids/$name")
  kill "-$sig" "$pid" 2>/dev/null || true
  for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -f "$nw/pids/$name"
}

# wait_for WHAT TRIES CMD...: CMD until it succeeds, 0.5 s apart.
wait_for() {
  local what=$1 tries=$2 i; shift 2
  for i in $(seq "$tries"); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "timed out waiting for $what" >&2
  return 1
}

eni_mac() { printf '02:e5:00:00:%02x:01' "$1"; }
# eni_veth I: ENI I's stand-in, eniI on the node (its MAC as the static
# provider knows it) and vpcI in the VPC holding the subnet's gateway.
eni_veth() {
  ip -n "$node" link add "eni$1" address "$(eni_mac "$1")" type veth peer name "vpc$1" netns "$gw"
  ip -n "$gw" addr add "10.251.$1.1/24" dev "vpc$1"
  ip -n "$gw" link set "vpc$1" up
}

# net_up ENIS ADDRS_PER_ENI [EXTRA]: the namespaces, the node's uplink and
# ENIS veth ENIs; ENI i is in 10.251.i.0/24 with address .10 and gateway .1
# (and, with ADDRS_PER_ENI > 0, secondaries .11 on). Writes the static
# provider's entries to $work/etc/enis.toml; EXTRA, a function, prints more
# keys of ENI i's entry (`EXTRA i`), e.g. its placement.
net_up() {
  local n=$1 per=$2 extra=${3:-} i j
  ip netns add "$gw"
  ip netns add "$node"
  ip -n "$gw" link set lo up
  ip -n "$node" link set lo up
  ip netns exec "$gw" sysctl -qw net.ipv4.ip_forward=1
  ip netns exec "$node" sysctl -qw net.ipv4.ip_forward=1
  ip -n "$node" link add eth0 type veth peer name uplink netns "$gw"
  ip -n "$node" addr add "$NODE_IP/24" dev eth0
  ip -n "$gw" addr add "$GW_IP/24" dev uplink
  ip -n "$node" link set eth0 up
  ip -n "$gw" link set uplink up
  ip -n "$node" route add default via "$GW_IP"
  : > "$work/etc/enis.toml"
  ENI_COUNT=$n
  for i in $(seq 0 $((n - 1))); do
    eni_veth "$i"
    printf '\n[[provider.enis]]\nid = "eni-e2e-%d"\nmac = "%s"\nipv4 = "10.251.%d.10/24"\ngateway4 = "10.251.%d.1"\n' \
      "$i" "$(eni_mac "$i")" "$i" "$i" >> "$work/etc/enis.toml"
    if [ "$per" -gt 0 ]; then
      printf 'secondary_ipv4 = [' >> "$work/etc/enis.toml"
      for j in $(seq 1 "$per"); do
        printf '"10.251.%d.%d"%s' "$i" $((10 + j)) "$([ "$j" -lt "$per" ] && echo ', ')" >> "$work/etc/enis.toml"
      done
      printf ']\n' >> "$work/etc/enis.toml"
    fi
    if [ -n "$extra" ]; then "$extra" "$i" >> "$work/etc/enis.toml"; fi
  done
}

# METADATA_IP in the VPC: the instance metadata stand-in, an HTTP server
# answering "instance-id: <node>" (the node reaches it through its default
# route, a pod through its ENI unless enim refuses it; docs/security.md).
METADATA_IP=169.254.169.254
metadata_up() {
  mkdir -p "$work/imds/latest/meta-data"
  echo "$NODE_NAME" > "$work/imds/latest/meta-data/instance-id"
  ip -n "$gw" addr add "$METADATA_IP/32" dev lo
  (exec ip netns exec "$gw" /usr/bin/python3 -m http.server --bind "$METADATA_IP" \
    --directory "$work/imds" 80) >> "$work/logs/metadata.log" 2>&1 &
  echo $! > "$work/pids/metadata"
}

# mnt_up: the node's mount namespace, with per-run dirs over NODE_DIRS.
mnt_up() {
  local d
  mkdir -p "$nw/ns" "$nw/root"
  mount --bind "$nw/ns" "$nw/ns"
  mount --make-private "$nw/ns"
  touch "$nw/ns/mnt"
  unshare --mount="$nw/ns/mnt" --propagation private true
  for d in "${NODE_DIRS[@]}"; do
    mkdir -p "$nw/root$d"
    # The mount point must exist on this machine; an empty dir made here is
    # removed again by cluster_down.
    if [ ! -e "$d" ]; then mkdir -p "$d"; echo "$d" >> "$nw/made-dirs"; fi
  done
  nsenter --mount="$nw/ns/mnt" -- sh -ec "
    for d in ${NODE_DIRS[*]}; do mount --bind '$nw/root'\$d \$d; done
    mount --make-rshared /
  "
}

# cgroups_up: the kubelet's cgroup root in every v1 hierarchy (cpuset needs
# its cpus and mems copied down before it can hold anything).
cgroups_up() {
  local h
  for h in /sys/fs/cgroup/*/; do
    [ "$(basename "$h")" = unified ] && continue
    mkdir -p "$h$cgroot"
    if [ -f "$h/cpuset.cpus" ]; then
      cat "$h/cpuset.cpus" > "$h$cgroot/cpuset.cpus"
      cat "$h/cpuset.mems" > "$h$cgroot/cpuset.mems"
    fi
  done
}

# The component configs.
configs() {
  local server="https://$NODE_IP:6443" c
  pki_make "$work/pki" "$NODE_NAME" "$NODE_IP" "$SERVICE_IP"
  for c in admin kubelet controller-manager scheduler kube-proxy; do
    pki_kubeconfig "$work/pki" "$c" "$server"
  done
  node_configs
}

# node_configs: the node's own configs (resolver, containerd, kubelet) in
# $nw/etc.
node_configs() {
  echo "nameserver $GW_IP" > "$nw/etc/resolv.conf"
  cat > "$nw/etc/containerd.toml" <<EOF
version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
# On the node's loopback: the performance scenarios read its CNI timers.
[metrics]
  address = "127.0.0.1:1338"
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "$PAUSE_IMAGE"
[plugins.'io.containerd.cri.v1.runtime']
  # This machine lacks CAP_SYS_RESOURCE: runc may not lower oom_score_adj.
  restrict_oom_score_adj = true
  enable_selinux = false
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["/opt/cni/bin"]
  conf_dir = "/etc/cni/net.d"
[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "runc"
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "$(command -v runc)"
EOF
  cat > "$nw/etc/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: $cgroot
failSwapOn: false
address: $NODE_IP
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $work/pki/ca.crt}
authorization: {mode: Webhook}
clusterDNS: [$DNS_IP]
clusterDomain: cluster.local
resolvConf: $nw/etc/resolv.conf
# A sandbox on a shared disk: never evict for disk or image space.
evictionHard: {memory.available: "100Mi", nodefs.available: "0%", imagefs.available: "0%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
EOF
  # The admission scenario kills enimd 20 times in a row; the default
  # crash-loop backoff (10 s doubling to 5 min) would stretch that to an
  # hour. A test-rig setting: the window it tests is the same or longer
  # without it. kubelet_default_backoff puts the kubelet's own back
  # (scenarios.sh s_restarts_default_backoff).
  cat >> "$nw/etc/kubelet.yaml" <<EOF
featureGates: {KubeletCrashLoopBackOffMax: true}
crashLoopBackOff: {maxContainerRestartPeriod: 2s}
EOF
}

# kubelet_default_backoff: the kubelet restarted without configs' short
# crash back-off, so the default one (10 s doubling to 5 minutes) starts
# afresh: the scenarios run before it kill enimd often, and under the
# default back-off each kill would leave the next scenario waiting minutes.
# Back means Ready in a status the new kubelet posted: the node stays Ready
# in the API while the kubelet is down, so the old status proves nothing.
kubelet_default_backoff() {
  local since
  sed -i '/^featureGates: {KubeletCrashLoopBackOffMax: true}$/d; /^crashLoopBackOff: /d' "$nw/etc/kubelet.yaml"
  stop kubelet
  # Heartbeats are whole seconds: the old kubelet's last is before `since`.
  sleep 1
  since=$(date +%s)
  start_kubelet
  wait_for "the kubelet back, node Ready" 240 ready_since "$since"
}

# ready_since T: the node is Ready in a status posted at or after T (epoch
# seconds). A restarted kubelet posts its first status at once.
ready_since() {
  local s
  s=$(k get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}') || return 1
  [ "${s%% *}" = True ] && [ "$(date -d "${s#* }" +%s)" -ge "$1" ]
}

kube_proxy_config() { # CLUSTER_CIDR (empty: unset)
  {
    echo "apiVersion: kubeproxy.config.k8s.io/v1alpha1"
    echo "kind: KubeProxyConfiguration"
    echo "mode: iptables"
    echo "clientConnection: {kubeconfig: $work/pki/kube-proxy.kubeconfig}"
    echo "hostnameOverride: $NODE_NAME"
    echo "bindAddress: $NODE_IP"
    echo "metricsBindAddress: 127.0.0.1:10249"
    echo "healthzBindAddress: 127.0.0.1:10256"
    # conntrack's table size is the machine's, not the sandbox's: leave it.
    echo "conntrack: {maxPerCore: 0, min: 0}"
    if [ -n "$1" ]; then echo "clusterCIDR: $1"; fi
  } > "$nw/etc/kube-proxy.yaml"
}

start_etcd() {
  start etcd "$bin/etcd" --name e2e --data-dir "$work/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster e2e=http://127.0.0.1:2380 --unsafe-no-fsync
}

# --enable-aggregator-routing: the API server calls webhooks (enim's
# EniPolicy webhook) at their Service's endpoints, not its ClusterIP: this
# control plane runs outside the nodes, with no kube-proxy of its own.
start_apiserver() {
  local p=$work/pki
  start kube-apiserver "$bin/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
    --advertise-address="$NODE_IP" --bind-address="$NODE_IP" --secure-port=6443 \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --client-ca-file="$p/ca.crt" --tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" \
    --kubelet-client-certificate="$p/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$p/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="" --kubelet-preferred-address-types=InternalIP \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$p/sa.pub" --service-account-signing-key-file="$p/sa.key" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --allow-privileged=true --profiling=false --endpoint-reconciler-type=lease \
    --enable-aggregator-routing=true
}

start_controllers() {
  local p=$work/pki
  start kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig="$p/controller-manager.kubeconfig" --authentication-kubeconfig="$p/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$p/controller-manager.kubeconfig" \
    --service-account-private-key-file="$p/sa.key" --root-ca-file="$p/ca.crt" \
    --use-service-account-credentials=true --leader-elect=false \
    --bind-address=127.0.0.1 --profiling=false
  start kube-scheduler "$bin/kube-scheduler" --kubeconfig="$p/scheduler.kubeconfig" \
    --authentication-kubeconfig="$p/scheduler.kubeconfig" --authorization-kubeconfig="$p/scheduler.kubeconfig" \
    --leader-elect=false --bind-address=127.0.0.1 --profiling=false
}

start_containerd() {
  start containerd env PATH="$bin:$PATH" "$bin/containerd" --config "$nw/etc/containerd.toml"
  # Until it answers, not only until its socket is there: under load it
  # made the socket 30 s before it served, and a kubelet started in
  # between exits (its CRI refused), so the node never registered.
  wait_for containerd 240 ctr_node version ||
    { component_log containerd; return 1; }
}

# component_log NAME: the last lines of a component's log, for a start-up
# that failed (the work dir goes with the run).
component_log() {
  echo "--- the last of $1's log" >&2
  tail -n 25 "$nw/logs/$1.log" >&2 2>/dev/null || true
}

# NODE_LABELS (optional): the labels the kubelet registers its node with.
start_kubelet() {
  start kubelet "$bin/kubelet" --config="$nw/etc/kubelet.yaml" \
    --kubeconfig="$nw/pki/kubelet.kubeconfig" --hostname-override="$NODE_NAME" \
    --node-ip="$NODE_IP" --v=2 ${NODE_LABELS:+"--node-labels=$NODE_LABELS"}
}

start_kube_proxy() {
  start kube-proxy "$bin/kube-proxy" --config="$nw/etc/kube-proxy.yaml"
}

# images_import: the images the cluster runs (IMAGES_DIR/*.tar, built here), imported.
images_import() {
  local i
  for i in "$IMAGES_DIR"/*.tar; do
    ctr_node -n k8s.io images import "$i" 2>&1 >/dev/null | grep -v "support for cgroup v1 is deprecated" >&2 || true
  done
}

# cluster_up ENIS ADDRS_PER_ENI CLUSTER_CIDR [EXTRA] (EXTRA: see net_up)
cluster_up() {
  local t0
  t0=$(date +%s%N)
  net_up "$1" "$2" "${4:-}"
  metadata_up
  mnt_up
  cgroups_up
  configs
  kube_proxy_config "$3"
  # The reference plugins on the node, as on any node: containerd's CRI
  # runs loopback for every sandbox; portmap serves hostPort.
  cp "$bin"/cni/* "$nw/root/opt/cni/bin/"
  start_etcd
  wait_for etcd 60 on_node "$bin/etcd" --version
  start_apiserver
  wait_for kube-apiserver 240 k get --raw /readyz
  start_controllers
  start_containerd
  images_import
  start_kubelet
  start_kube_proxy
  wait_for "node $NODE_NAME" 240 k get node "$NODE_NAME" ||
    { component_log containerd; component_log kubelet; return 1; }
  CLUSTER_START_MS=$((($(date +%s%N) - t0) / 1000000))
}

# Every process of the sandbox: in its namespaces or under its cgroup root.
sandbox_pids() {
  local netns mntns p
  netns=$(stat -L -c %i "/run/netns/$node" 2>/dev/null || echo none)
  mntns=$(stat -L -c %i "$nw/ns/mnt" 2>/dev/null || echo none)
  for p in /proc/[0-9]*; do
    [ "$(stat -L -c %i "$p/ns/net" 2>/dev/null)" = "$netns" ] ||
      [ "$(stat -L -c %i "$p/ns/mnt" 2>/dev/null)" = "$mntns" ] ||
      grep -q ":$cgroot/" "$p/cgroup" 2>/dev/null ||
      continue
    echo "${p#/proc/}"
  done
}

# sandbox_stop: every process of the node ended (its components first, by
# their pids), its namespaces, mounts and cgroups left in place.
sandbox_stop() {
  local p
  for p in kube-proxy kubelet kube-scheduler kube-controller-manager kube-apiserver containerd etcd metadata; do
    stop "$p"
  done
  kill_node_procs
}

# kill_node_procs [KEEP]: kill -9 every process of the node (sandbox_pids)
# but those in KEEP (" pid pid "), again while any is left (at most 3
# rounds: a dying shim may start one more).
kill_node_procs() {
  local keep=${1:- } p i left
  for i in 1 2 3; do
    left=""
    for p in $(sandbox_pids); do [[ $keep == *" $p "* ]] || left+=" $p"; done
    [ -z "$left" ] && break
    # shellcheck disable=SC2086
    kill -KILL $left 2>/dev/null || true
    sleep 0.5
  done
}

# clear_node_run: the node's tmpfs state gone, as a power cut leaves it:
# the pods' netns, containerd's and enimd's run dirs (mounts first).
clear_node_run() {
  on_node sh -c '
    grep -o " /run/[^ ]*" /proc/mounts | sort -r | while read -r m; do
      case $m in /run/netns/cni-*|/run/containerd/*) umount -l "$m" ;; esac
    done
    rm -rf /run/netns/* /run/containerd/* /run/enim/*'
}

cluster_down() {
  local d h
  sandbox_stop
  # Cgroups, deepest first, once their processes are gone.
  for h in /sys/fs/cgroup/*/; do
    [ -d "$h$cgroot" ] || continue
    find "$h$cgroot" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  if [ -e "$nw/ns/mnt" ]; then
    umount "$nw/ns/mnt" 2>/dev/null || true
    umount "$nw/ns" 2>/dev/null || true
  fi
  ip netns del "$node" 2>/dev/null || true
  ip netns del "$gw" 2>/dev/null || true
  if [ -f "$nw/made-dirs" ]; then
    while read -r d; do rmdir -p "$d" 2>/dev/null || true; done < "$nw/made-dirs"
  fi
}
