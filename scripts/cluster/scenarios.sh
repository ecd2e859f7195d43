# The e2e cluster's scenarios (scripts/e2e-cluster.sh sources this; each
# s_* function returns 0 for PASS). They drive the cluster as a user does,
# through kubectl, and look at the node (its netns, containerd, enimctl)
# only to check what kubectl cannot show.

# What enim's device plugin advertises in this mode, and how many.
resource() { [ "$mode" = primary ] && echo enim.io/eni || echo enim.io/ip; }
capacity() { [ "$mode" = primary ] && echo 4 || echo 12; }
jsonkey() { echo "$1" | sed 's/\./\\./g'; }
allocatable() { k get node "$NODE_NAME" -o "jsonpath={.status.allocatable.$(jsonkey "$(resource)")}"; }
allocatable_is() { [ "$(allocatable)" = "$1" ]; }

# pod NAME [KEY=VALUE...]: a busybox pod on an enim ENI (or address) that
# serves its own name over HTTP on 8080, with an HTTP readiness probe.
# Keys: cmd (replaces the server), probe (path; "none" for no probe),
# hostport, restart (restartPolicy), res (0: no enim resource), claim (a
# ResourceClaimTemplate: the pod's ENI claimed through DRA instead),
# claimname (likewise, an existing ResourceClaim), ns (its namespace;
# default: default), node (the node it must run on).
pod() {
  local name=$1; shift
  local cmd="mkdir -p /www && echo $name > /www/index.html && exec httpd -f -p 8080 -h /www"
  local probe=/ hostport="" restart=Always res=1 claim="" claim_key="" ns=default on="" kv
  for kv in "$@"; do
    case $kv in
      ns=*) ns=${kv#ns=} ;;
      cmd=*) cmd=${kv#cmd=} ;;
      probe=*) probe=${kv#probe=} ;;
      hostport=*) hostport=${kv#hostport=} ;;
      restart=*) restart=${kv#restart=} ;;
      res=*) res=${kv#res=} ;;
      claim=*) claim=${kv#claim=} claim_key=resourceClaimTemplateName res=0 ;;
      claimname=*) claim=${kv#claimname=} claim_key=resourceClaimName res=0 ;;
      node=*) on=${kv#node=} ;;
    esac
  done
  {
    cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $name
  namespace: $ns
  labels: {app: $name, e2e: "1"}
spec:
  restartPolicy: $restart
  terminationGracePeriodSeconds: 1
  containers:
    - name: c
      image: $BUSYBOX
      imagePullPolicy: Never
      args: ["$cmd"]
      ports: [{containerPort: 8080$([ -n "$hostport" ] && echo ", hostPort: $hostport")}]
EOF
    [ "$probe" = none ] || echo "      readinessProbe: {httpGet: {path: $probe, port: 8080}, periodSeconds: 1}"
    [ "$res" = 0 ] || echo "      resources: {limits: {$(resource): 1}}"
    if [ -n "$claim" ]; then
      echo "      resources: {claims: [{name: eni}]}"
      echo "  resourceClaims: [{name: eni, $claim_key: $claim}]"
    fi
    [ -z "$on" ] || echo "  nodeSelector: {kubernetes.io/hostname: $on}"
  } | k apply -f - >/dev/null
}

pod_ip() { k get pod "$1" -o jsonpath='{.status.podIP}'; }
ready() { k wait --for=condition=Ready "pod/$1" --timeout="${2:-90}s" >/dev/null; }
# clean: every test pod, service and claim gone, and enim holding nothing.
clean() {
  k delete deployment,pod,svc,endpointslice,resourceclaimtemplate,resourceclaim -l e2e=1 --wait=true --timeout=120s >/dev/null 2>&1 || true
  # Any ENI a scenario took from the node (on purpose or by failing midway)
  # is put back, so the next scenario starts from a whole node.
  reattach_enis
  wait_for "enim to hold nothing" 120 holds 0
}
enimctl() { k -n enim-system exec ds/enimd -c enimd -- /usr/local/bin/enimctl "$@"; }
# holds N: enim's checkpoint has exactly N attachments. A failed look (the
# exec refused while the API server or enimd is busy) is not "none".
holds() { local a; a=$(attachments) || return 1; [ "$(printf '%s' "$a" | grep -c .)" = "$1" ]; }
# attachments: the container id of each attachment enim records, a line each.
attachments() {
  enimctl --json attachments | python3 -c '
import json, sys
for a in json.load(sys.stdin)["attachments"]:
    print(a["container_id"])'
}
# in_pod POD CMD: a shell command in the pod.
in_pod() { local p=$1; shift; k exec "$p" -- sh -c "$*"; }
http_get() { printf 'GET / HTTP/1.0\r\n\r\n' | "$@" 2>/dev/null | tail -n 1; }

s_ready() {
  k -n enim-system rollout status daemonset/enimd --timeout=120s &&
    k wait --for=condition=Ready "node/$NODE_NAME" --timeout=120s &&
    k -n kube-system rollout status deployment/coredns --timeout=120s || return 1
  wait_for "allocatable $(resource) = $(capacity)" 60 allocatable_is "$(capacity)" || return 1
  echo "node Ready; allocatable $(resource): $(allocatable)"
}

# The address a pod must get: an ENI's own (primary) or a secondary one.
enim_address() {
  if [ "$mode" = primary ]; then [[ $1 =~ ^10\.251\.[0-3]\.10$ ]]
  else [[ $1 =~ ^10\.251\.[01]\.1[1-6]$ ]]; fi
}

unschedulable() {
  k get pod "$1" -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}' | grep "Insufficient $(resource)" >/dev/null
}

s_scheduling() {
  local n i ip ips=() msg
  n=$(capacity)
  for i in $(seq 0 $((n - 1))); do pod "web-$i"; done
  for i in $(seq 0 $((n - 1))); do
    ready "web-$i" 120 || return 1
    ip=$(pod_ip "web-$i")
    enim_address "$ip" || { echo "web-$i has podIP $ip, not an enim address"; return 1; }
    ips+=("$ip")
  done
  [ "$(printf '%s\n' "${ips[@]}" | sort -u | wc -l)" = "$n" ] || { echo "podIPs not unique: ${ips[*]}"; return 1; }
  echo "$n pods Running on ${ips[*]}"
  pod extra
  wait_for "extra to be unschedulable" 60 unschedulable extra || return 1
  msg=$(k get pod extra -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}')
  echo "pod $((n + 1)): Pending: $msg"
  k delete pod web-0 --wait=true >/dev/null
  ready extra 120 || return 1
  ip=$(pod_ip extra)
  enim_address "$ip" || return 1
  echo "after deleting web-0, extra Runs on $ip"
}

# Services and DNS from a pod on an ENI, with a backend on another ENI and
# one off the node (in the VPC namespace, standing in for another node).
services_check() {
  local svc remote out
  svc=$(k get svc web -o jsonpath='{.spec.clusterIP}')
  remote=$(k get svc remote -o jsonpath='{.spec.clusterIP}')
  out=$(in_pod client "nslookup kubernetes.default.svc.cluster.local $DNS_IP") &&
    grep -q "$SERVICE_IP" <<<"$out" || { echo "DNS: $out"; return 1; }
  out=$(in_pod client "nslookup web.default.svc.cluster.local $DNS_IP") &&
    grep -q "$svc" <<<"$out" || { echo "DNS: $out"; return 1; }
  echo "DNS: kubernetes.default -> $SERVICE_IP, web.default -> $svc"
  out=$(in_pod client "printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 $svc 80 | tail -n 1") || true
  [ "$out" = backend ] || { echo "ClusterIP $svc (backend on an ENI): got '$out'"; return 1; }
  echo "ClusterIP $svc -> backend pod: '$out'"
  out=$(in_pod client "printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 $remote 80 | tail -n 1") || true
  [ "$out" = remote ] || { echo "ClusterIP $remote (backend off the node): got '$out'"; return 1; }
  echo "ClusterIP $remote -> backend off the node: '$out'"
}

services_up() {
  pod backend
  pod client cmd="exec sleep 100000" probe=none
  k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata: {name: web, labels: {e2e: "1"}}
spec:
  selector: {app: backend}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: remote, labels: {e2e: "1"}}
spec:
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: remote-1
  labels: {e2e: "1", kubernetes.io/service-name: remote}
addressType: IPv4
ports: [{port: 8080, protocol: TCP}]
endpoints: [{addresses: ["$GW_IP"], conditions: {ready: true}}]
EOF
  # The backend off the node: busybox httpd in the VPC namespace.
  mkdir -p "$work/remote-www"
  echo remote > "$work/remote-www/index.html"
  ip netns exec "$gw" busybox httpd -p "$GW_IP:8080" -h "$work/remote-www"
  ready backend && ready client
}

# kube_proxy_with CIDR: kube-proxy restarted with clusterCIDR CIDR (empty:
# unset), and its rules for the test Services in place.
kube_proxy_with() {
  stop kube-proxy
  kube_proxy_config "$1"
  start_kube_proxy
  wait_for "kube-proxy's rules" 60 kube_proxy_synced
}

# Synced: the restarted kube-proxy itself has finished a sync (its own
# metrics; the rules of the one before it stay in place across the restart
# and would pass any check of iptables alone), and both test Services have a
# DNAT to their endpoints.
kube_proxy_synced() {
  local web remote rules
  on_node curl -sf http://127.0.0.1:10249/metrics |
    grep -Eq '^kubeproxy_sync_proxy_rules_duration_seconds_count(\{[^}]*\})? [1-9]' || return 1
  web=$(k get svc web -o jsonpath='{.spec.clusterIP}')
  remote=$(k get svc remote -o jsonpath='{.spec.clusterIP}')
  rules=$(on_node iptables -t nat -S KUBE-SERVICES)
  grep -q -- "-d $web/32 .*-j KUBE-SVC-" <<<"$rules" &&
    grep -q -- "-d $remote/32 .*-j KUBE-SVC-" <<<"$rules"
}

# What the node did with a Service connection that failed.
services_diagnose() {
  echo "--- node: nat KUBE-SERVICES"
  on_node iptables -t nat -S KUBE-SERVICES 2>&1 | grep -v '^-N'
  echo "--- node: ip rule"; on_node ip rule 2>&1
  echo "--- client: routes"; in_pod client "ip route; ip addr" 2>&1
}

# services_with CIDR: the Services checked with kube-proxy's clusterCIDR
# CIDR (empty: unset).
services_with() {
  local rc=0
  services_up || rc=1
  [ $rc = 0 ] && kube_proxy_with "$1" || rc=1
  [ $rc = 0 ] && { services_check || { services_diagnose; false; }; } || rc=1
  # This cluster's off-node backend only (another lane's has the same
  # address, in its own namespace).
  local ino p
  ino=$(stat -L -c %i "/run/netns/$gw")
  for p in $(pgrep -f "busybox httpd -p $GW_IP:8080"); do
    [ "$(stat -L -c %i "/proc/$p/ns/net" 2>/dev/null)" = "$ino" ] && kill "$p"
  done
  return $rc
}
s_services_cidr_set() { services_with 10.244.0.0/16; }
s_services_cidr_unset() { services_with ""; }

s_probe() {
  pod probe-ok
  pod probe-bad probe=/missing
  ready probe-ok || return 1
  sleep 5
  [ "$(k get pod probe-bad -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = False ] ||
    { echo "a pod whose probe gets 404 is Ready: the probe proves nothing"; return 1; }
  echo "probe-ok Ready through an HTTP probe to $(pod_ip probe-ok); probe-bad (404) not Ready"
}

s_hostport() {
  local out rc=0
  pod hp hostport=30080
  ready hp || return 1
  out=$(http_get on_node busybox nc -w 5 "$NODE_IP" 30080)
  [ "$out" = hp ] || { echo "hostPort from the node: got '$out'"; rc=1; }
  [ "$rc" = 0 ] && echo "hostPort 30080 from the node: '$out'"
  out=$(http_get ip netns exec "$gw" busybox nc -w 5 "$NODE_IP" 30080)
  [ "$out" = hp ] || { echo "hostPort from another machine: got '$out'"; rc=1; }
  [ "$rc" = 0 ] && echo "hostPort 30080 from another machine: '$out'"
  return $rc
}

# The instance metadata stand-in in the VPC (node.sh's metadata_up): the
# node reaches it; a pod on enim is refused it at once by default; a pod of
# the namespace enim-config.py's [pod_metadata] opts in reaches it.
IMDS_NS=enim-e2e-imds
METADATA_PATH=/latest/meta-data/instance-id
# metadata_get POD [NAMESPACE]: the instance id as the pod reads it (busybox
# nc: its wget dies of SIGSEGV on a refused connect), or nc's error.
metadata_get() {
  k -n "${2:-default}" exec "$1" -- sh -c \
    "printf 'GET $METADATA_PATH HTTP/1.0\r\n\r\n' | nc -w 3 $METADATA_IP 80 2>&1 | tail -n 1"
}
metadata_check() {
  local out
  out=$(on_node curl -fsS -m 3 "http://$METADATA_IP$METADATA_PATH") && [ "$out" = "$NODE_NAME" ] ||
    { echo "the node does not reach the metadata stand-in: $out"; return 1; }
  pod imds-refused && ready imds-refused || return 1
  out=$(metadata_get imds-refused) || true
  case $out in
    "$NODE_NAME") echo "a pod in namespace default reached the metadata service"; return 1 ;;
    *"Permission denied"*) echo "namespace default: refused ($out)" ;;
    *) echo "namespace default: refused, but not by enim's route: $out"; return 1 ;;
  esac
  k create namespace "$IMDS_NS" >/dev/null || return 1
  pod imds-allowed ns="$IMDS_NS" &&
    k -n "$IMDS_NS" wait --for=condition=Ready pod/imds-allowed --timeout=90s >/dev/null || return 1
  out=$(metadata_get imds-allowed "$IMDS_NS") && [ "$out" = "$NODE_NAME" ] ||
    { echo "the opted-in namespace did not reach it: $out"; return 1; }
  echo "namespace $IMDS_NS (opted in): reached, instance-id $out"
}
s_metadata() {
  local rc=0
  metadata_check || rc=1
  k delete namespace "$IMDS_NS" --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1 || true
  return $rc
}

# The ENI's device name in the node netns for a pod address (primary).
s_delete() {
  local ip before
  pod del-me
  ready del-me || return 1
  ip=$(pod_ip del-me)
  holds 1 || return 1
  k delete pod del-me --wait=true >/dev/null
  wait_for "enim to hold nothing" 60 holds 0 || return 1
  if [ "$mode" = primary ]; then
    # The ENI is back in the node under its host name, with its MAC.
    local i=${ip#10.251.}; i=${i%%.*}
    on_node ip -o link show | grep "$(eni_mac "$i")" >/dev/null || { echo "ENI $i is not home"; return 1; }
  fi
  before=$(allocatable)
  [ "$before" = "$(capacity)" ] || { echo "allocatable $before"; return 1; }
  echo "DEL by the kubelet: $ip released, enim holds nothing, allocatable $(allocatable)"
}

# The pod's interface still has its address (the ENI or the secondary).
has_address() { in_pod "$1" "ip -o addr show eth0" | grep " $2/" >/dev/null; }

enimd_ready() { k -n enim-system rollout status daemonset/enimd --timeout=120s >/dev/null; }

s_rollout() {
  local a b ipa ipb
  pod keep-a
  pod keep-b
  ready keep-a && ready keep-b || return 1
  ipa=$(pod_ip keep-a); ipb=$(pod_ip keep-b)
  k -n enim-system rollout restart daemonset/enimd >/dev/null
  enimd_ready || return 1
  for a in keep-a keep-b; do
    ready "$a" 5 || { echo "$a not Ready after the rollout"; return 1; }
  done
  has_address keep-a "$ipa" && has_address keep-b "$ipb" || { echo "an address moved"; return 1; }
  pod after-rollout
  ready after-rollout || return 1
  b=$(pod_ip after-rollout)
  echo "keep-a $ipa and keep-b $ipb kept their ENIs and Ready; a new pod runs on $b"
  holds 3 || return 1
}

# --- faults -------------------------------------------------------------

# enimd_pid: the running agent's pid; fails when none runs. Its process
# in this node's network namespace: pgrep sees every node's agents (there
# is no pid namespace), and another lane's cluster runs one too.
enimd_pid() { node_pid '^/usr/local/bin/enimd --config'; }
# node_pid PATTERN: the first process matching PATTERN (pgrep -f) in this
# node's network namespace.
node_pid() {
  local ino p
  ino=$(stat -L -c %i "/run/netns/$node") || return 1
  for p in $(pgrep -f "$1"); do
    [ "$(stat -L -c %i "/proc/$p/ns/net" 2>/dev/null)" = "$ino" ] && { echo "$p"; return 0; }
  done
  return 1
}
# kill_enimd: kill -9 the running agent and print its pid; fails when none runs.
kill_enimd() { local p; p=$(enimd_pid) && kill -9 "$p" && echo "$p"; }
# enimd_back OLD: an agent other than OLD runs; enimd_serving OLD: and it is ready.
enimd_back() { local p; p=$(enimd_pid) && [ "$p" != "$1" ]; }
enimd_serving() { enimd_back "$1" && on_node curl -fsS -o /dev/null http://127.0.0.1:9464/readyz; }

# settled: every test pod Ready, enim holding exactly one attachment per
# test pod, each for a sandbox containerd runs, and (primary) every other
# ENI home in the node.
running_sandboxes() {
  ctr_node -n k8s.io tasks ls 2>/dev/null | awk '$3 == "RUNNING" { print $1 }'
}
terminating_gone() {
  ! k get pods -l e2e=1 -o jsonpath='{range .items[*]}{.metadata.deletionTimestamp}{"\n"}{end}' | grep . >/dev/null
}
# live_pods: test pods that are not finished (Failed or Succeeded).
live_pods() { k get pods -l e2e=1 --field-selector=status.phase!=Failed,status.phase!=Succeeded -o name; }
# Failed pods a controller did not replace: their names, a line each.
unreplaced_failures() {
  k get pods -l e2e=1 --field-selector=status.phase=Failed \
    -o jsonpath='{range .items[*]}{.metadata.name} {.status.reason} {.metadata.ownerReferences[0].kind}{"\n"}{end}' |
    grep -v ' ReplicaSet$' || true
}
# settled_now: one look at the invariants after a fault; SETTLED_WHY says
# what is off. No failed pod left unreplaced; every live test pod Ready;
# exactly one attachment per live pod, each for a sandbox containerd runs;
# (primary) every other ENI home in the node.
settled_now() {
  local pods n stale failed
  SETTLED_WHY=""
  terminating_gone || { SETTLED_WHY="pods still terminating"; return 1; }
  failed=$(unreplaced_failures)
  [ -z "$failed" ] || { SETTLED_WHY="failed pods nobody recreates: $failed"; return 1; }
  pods=$(live_pods | wc -l)
  [ "$pods" -gt 0 ] || { SETTLED_WHY="no pod left to check"; return 1; }
  n=$(k get pods -l e2e=1 --field-selector=status.phase=Running \
    -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c True || true)
  [ "$n" = "$pods" ] || { SETTLED_WHY="$n of $pods pods Ready"; return 1; }
  n=$(attachments | wc -l)
  [ "$n" = "$pods" ] || { SETTLED_WHY="enim holds $n attachments for $pods pods"; return 1; }
  stale=$(comm -23 <(attachments | sort) <(running_sandboxes | sort))
  [ -z "$stale" ] || { SETTLED_WHY="records for sandboxes that do not run: $stale"; return 1; }
  if [ "$mode" = primary ]; then
    n=$(on_node ip -o link show | grep -c 'link/ether 02:e5:00:00' || true)
    [ "$n" = $(($(capacity) - pods)) ] || { SETTLED_WHY="$n ENIs home, want $(($(capacity) - pods))"; return 1; }
  fi
  SETTLED_PODS=$pods
}
settled() {
  local i
  for i in $(seq 180); do
    settled_now && { echo "settled: $SETTLED_PODS pods Ready, one attachment each, all for running sandboxes"; return 0; }
    sleep 1
  done
  echo "not settled after 180 s: $SETTLED_WHY"
  return 1
}

# churn: pods created and deleted in the background, at most 3 at a time.
churn_start() {
  touch "$work/churn"
  (
    i=0
    while [ -f "$work/churn" ]; do
      pod "churn-$i" >/dev/null 2>&1 || true
      [ $i -ge 3 ] && k delete pod "churn-$((i - 3))" --wait=false >/dev/null 2>&1
      i=$((i + 1))
      sleep 1.5
    done
  ) &
  churn_pid=$!
}
churn_stop() { rm -f "$work/churn"; wait "$churn_pid" 2>/dev/null || true; }

# The reboot-like stop: everything on the node stops at once, the pods'
# namespaces are deleted without DEL, and the node's /run is emptied.
reboot_node() {
  stop kubelet KILL
  stop kube-proxy KILL
  stop containerd KILL
  # The control plane lives on this one node and survives the "reboot".
  kill_node_procs " $(cat "$work"/pids/* 2>/dev/null | tr '\n' ' ') "
  sleep 1
  clear_node_run
  # A physical ENI comes home when its pod's namespace goes; a veth is
  # destroyed instead, so the sandbox's cloud puts it back.
  reattach_enis
  start_containerd
  start_kubelet
  start_kube_proxy
}

s_fault() {
  local what=$1 rc=0
  churn_start
  sleep 4
  case $what in
    kill9) kill_enimd >/dev/null ;;
    kubelet) stop kubelet; start_kubelet ;;
    containerd) stop containerd; start_containerd ;;
    reboot) reboot_node ;;
  esac
  sleep 4
  churn_stop
  enimd_ready || rc=1
  [ $rc = 0 ] && settled || rc=1
  return $rc
}
s_fault_kill9() { s_fault kill9; }
s_fault_kubelet() { s_fault kubelet; }
s_fault_containerd() { s_fault containerd; }
# A reboot restarts the kubelet before any plugin: a pod the kubelet admits
# before the device plugin registers again is refused (UnexpectedAdmissionError,
# the kubelet's rule for extended resources at boot, whatever the plugin).
# So the workload here is what survives a reboot in any cluster: a
# Deployment, rolled during the stop, whose refused pods are replaced.
s_fault_reboot() {
  local failed
  httpd_deployment churn 3
  k rollout status deployment/churn --timeout=120s >/dev/null || return 1
  k rollout restart deployment/churn >/dev/null
  sleep 1
  reboot_node
  enimd_ready || return 1
  k rollout status deployment/churn --timeout=240s >/dev/null || { echo "the Deployment did not recover"; return 1; }
  failed=$(k get pods -l e2e=1 --field-selector=status.phase=Failed -o name | wc -l)
  echo "after the reboot: the Deployment is available again ($failed pods refused at admission and replaced)"
  settled
}


# --- no pod rejected while enimd restarts ---------------------------------

# httpd_deployment NAME REPLICAS [NODE]: a Deployment of busybox pods
# serving their hostname on 8080, each with one $(resource), on NODE when
# given.
httpd_deployment() {
  k apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: $1, labels: {e2e: "1"}}
spec:
  replicas: $2
  selector: {matchLabels: {app: $1}}
  template:
    metadata: {labels: {app: $1, e2e: "1"}}
    spec:
      terminationGracePeriodSeconds: 1
$([ -n "${3:-}" ] && echo "      nodeSelector: {kubernetes.io/hostname: $3}")
      containers:
        - name: c
          image: $BUSYBOX
          imagePullPolicy: Never
          args: ["mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8080 -h /www"]
          readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 1}
          resources: {limits: {$(resource): 1}}
EOF
}

# A short-lived pod that asks for the resource and succeeds once it runs.
adm_pod() { pod "$1" cmd="exit 0" probe=none restart=Never; }

# admission KIND: RESTARTS restarts of enimd of that kind, each with pods
# created in a tight loop through it; every pod must end Succeeded.
s_admission() {
  local kind=$1 r j n=0 p failed old
  for r in $(seq "$(admission_restarts)"); do
    case $kind in
      kill9)
        old=$(kill_enimd) || { echo "no enimd to kill"; return 1; }
        for j in 1 2 3; do adm_pod "adm-$kind-$r-$j"; n=$((n + 1)); sleep 0.2; done
        wait_for "enimd serving again" 120 enimd_serving "$old" || return 1 ;;
      crashloop)
        # Killed again as soon as it is back, three times running.
        for j in 1 2 3; do
          old=$(kill_enimd) || { echo "no enimd to kill"; return 1; }
          adm_pod "adm-$kind-$r-$j"; n=$((n + 1))
          wait_for "enimd back" 120 enimd_back "$old" || return 1
        done
        wait_for "enimd serving again" 120 enimd_serving "$old" || return 1 ;;
      rollout)
        k -n enim-system rollout restart daemonset/enimd >/dev/null
        for j in 1 2 3; do adm_pod "adm-$kind-$r-$j"; n=$((n + 1)); sleep 1; done
        enimd_ready || return 1 ;;
    esac
  done
  wait_for "every pod to finish" 360 all_done "adm-$kind-" || true
  failed=$(k get pods -l e2e=1 -o jsonpath='{range .items[*]}{.metadata.name} {.status.phase} {.status.reason}{"\n"}{end}' | grep "^adm-$kind-" | grep -v ' Succeeded' || true)
  [ -z "$failed" ] || { echo "pods that did not succeed:"; echo "$failed"; return 1; }
  echo "$n pods created across $(admission_restarts) restarts ($kind): all Succeeded"
}
# The device plugin and the kubelet's admission do not depend on the mode:
# the full count runs in primary mode, a few rounds in secondary.
admission_restarts() { if [ "$mode" = primary ] && [ "$provider" != cluster ]; then echo "$restarts"; else echo $((restarts < 3 ? restarts : 3)); fi; }
all_done() {
  ! k get pods -l e2e=1 -o jsonpath='{range .items[*]}{.metadata.name} {.status.phase}{"\n"}{end}' | grep "^$1" | grep -v ' Succeeded\| Failed' >/dev/null
}
s_admission_kill9() { s_admission kill9; }
s_admission_crashloop() { s_admission crashloop; }
s_admission_rollout() { s_admission rollout; }

# --- enimd's restarts under the kubelet's default crash back-off ----------

# The secondary run runs this scenario instead of the admission ones
# above, whose dozens of restarts would take an hour under the default
# back-off; it puts the kubelet's default back-off back first (node.sh
# kubelet_default_backoff), after the scenarios that kill enimd under the
# short one.
default_backoff() { ! grep -q crashLoopBackOff "$work/etc/kubelet.yaml"; }

# node_watch_start / node_watch_stop: the node's Ready condition and its
# taints, sampled every second into $work/node-watch ("ms status taints").
node_watch_start() {
  : > "$work/node-watch"
  touch "$work/node-watching"
  (
    while [ -f "$work/node-watching" ]; do
      k get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status} {.spec.taints[*].key}{"\n"}' 2>/dev/null |
        sed "s/^/$(now_ms) /" >> "$work/node-watch" || true
      sleep 1
    done
  ) &
  NODE_WATCH_PID=$!
}
node_watch_stop() { rm -f "$work/node-watching"; wait "$NODE_WATCH_PID" 2>/dev/null || true; }
# not_ready_samples: samples with Ready other than True, or a not-ready taint.
not_ready_samples() { awk '$2 != "True" || /not-ready|unreachable/' "$work/node-watch" | wc -l; }
# longest_not_ready: the longest run of such samples, in seconds.
longest_not_ready() {
  awk '{ bad = ($2 != "True" || /not-ready|unreachable/) }
    bad && !start { start = $1 } !bad { start = 0 }
    bad && $1 - start > max { max = $1 - start }
    END { printf "%d", max / 1000 }' "$work/node-watch"
}
# events_count REASON [KIND]: what events of REASON (on objects of KIND)
# count, all namespaces, repeats included.
events_count() {
  local sel="reason=$1"
  [ -n "${2:-}" ] && sel="$sel,involvedObject.kind=$2"
  k get events -A --field-selector "$sel" -o jsonpath='{range .items[*]}{.count}{"\n"}{end}' |
    awk '{ n += ($1 == "" ? 1 : $1) } END { print n + 0 }'
}
pod_phase() { k get pod "$1" -o jsonpath='{.status.phase}' 2>/dev/null; }
# until_ms TRIES CMD...: CMD every 0.2 s until it succeeds; prints the time
# (ms) it did, fails after TRIES tries.
until_ms() {
  local tries=$1 i; shift
  for i in $(seq "$tries"); do
    "$@" >/dev/null 2>&1 && { now_ms; return 0; }
    sleep 0.2
  done
  return 1
}
running() { [ "$(pod_phase "$1")" = Running ]; }
ms_s() { awk -v ms="$1" 'BEGIN { printf "%.1f", ms / 1000 }'; }

# 3 rollout restarts and 10 kill -9s of enimd, a pod created at each:
# rollout, 2 kills, rollout, 1 kill, rollout, 7 kills. A rollout's new pod
# starts the kubelet's back-off afresh: its first crash is restarted at
# once, the next ones after 10 s, 20 s, ... 300 s at most. So the last 7
# kills are a crash loop of 10 minutes whose last back-off is the
# kubelet's longest, 300 s: enimd away for 5 minutes, the not-ready
# taint's tolerationSeconds. Throughout,
# the node stays Ready (sampled every second; no NodeNotReady event), a pod
# running before is not evicted and keeps Ready, and each new pod runs
# within a few seconds of enimd's return: 5 s when enimd was away for less
# than the plugin's wait for it (90 s), 20 s otherwise (the ADD gave up;
# the kubelet retries its sandbox 10-15 s later).
s_restarts_default_backoff() {
  local seq=(rollout kill kill rollout kill rollout kill kill kill kill kill kill kill)
  local i kind old t0 t_back t_run away late rc=0 uid ev0 pev0 evict0 lines=() delays=()
  kubelet_default_backoff || return 1
  default_backoff || { echo "the kubelet still shortens the crash back-off (node.sh): not the default"; return 1; }
  # A restarted kubelet counts the plugin's devices as 0 until the plugin
  # registers again, and may post that count in its first status; the next
  # comes 10 s later. A pod created meanwhile is refused for Insufficient
  # $(resource) (rst-0 once was, and ran 6.8 s after enimd's return).
  wait_for "allocatable $(resource) = $(capacity) after the kubelet's restart" 60 allocatable_is "$(capacity)" || return 1
  pod bystander
  ready bystander || return 1
  uid=$(k get pod bystander -o jsonpath='{.metadata.uid}')
  ev0=$(events_count NodeNotReady Node)
  pev0=$(events_count NodeNotReady Pod)
  evict0=$(events_count TaintManagerEviction)
  node_watch_start
  for i in "${!seq[@]}"; do
    kind=${seq[$i]}
    old=$(enimd_pid) || { echo "no enimd to restart"; rc=1; break; }
    t0=$(now_ms)
    case $kind in
      kill) kill -9 "$old" ;;
      rollout) k -n enim-system rollout restart daemonset/enimd >/dev/null ;;
    esac
    pod "rst-$i" cmd="exec sleep 100000" probe=none
    # The kubelet's longest back-off is 300 s; a rollout waits for the old
    # pod's exit first.
    t_back=$(until_ms 2000 enimd_serving "$old") || { echo "enimd not back within 400 s"; rc=1; break; }
    t_run=$(until_ms 600 running "rst-$i") || { echo "rst-$i not running 120 s after enimd's return"; rc=1; break; }
    away=$((t_back - t0))
    late=$((t_run - t_back))
    [ "$late" -lt 0 ] && late=0
    lines+=("$kind $((i + 1)): enimd away $(ms_s "$away") s, rst-$i running $(ms_s "$late") s after its return")
    echo "${lines[-1]}"
    delays+=("$late")
    if [ "$away" -lt 90000 ] && [ "$late" -gt 5000 ]; then rc=1; echo "  more than 5 s"; fi
    if [ "$late" -gt 20000 ]; then rc=1; echo "  more than 20 s"; fi
    k delete pod "rst-$i" --wait=false >/dev/null
  done
  # A last look after the longest absence: the node's status lags by the
  # kubelet's 10 s status period.
  sleep 12
  node_watch_stop
  local nr ev pev evict
  nr=$(not_ready_samples)
  ev=$(($(events_count NodeNotReady Node) - ev0))
  pev=$(($(events_count NodeNotReady Pod) - pev0))
  evict=$(($(events_count TaintManagerEviction) - evict0))
  echo "node: $nr of $(wc -l < "$work/node-watch") samples (1 s apart) not Ready or tainted not-ready, the longest run $(longest_not_ready) s; NodeNotReady events: node $ev, pods $pev; TaintManagerEviction events: $evict"
  [ "$nr" = 0 ] && [ "$ev" = 0 ] && [ "$pev" = 0 ] && [ "$evict" = 0 ] || rc=1
  if [ "$(k get pod bystander -o jsonpath='{.metadata.uid} {.metadata.deletionTimestamp} {.status.conditions[?(@.type=="Ready")].status}')" != "$uid  True" ]; then
    echo "the bystander pod was evicted, replaced or is not Ready: $(k get pod bystander -o wide 2>&1 | tail -n 1)"
    rc=1
  else
    echo "bystander: the same pod, Ready, not evicted"
  fi
  if [ ${#delays[@]} -gt 0 ]; then
    echo "pods created at each restart, running after enimd's return: $(printf '%s\n' "${delays[@]}" | python3 -c '
import sys
v = sorted(int(x) for x in sys.stdin)
print(f"p50 {v[(len(v) - 1) // 2] / 1000:.1f} s, max {v[-1] / 1000:.1f} s ({len(v)} pods)")')" | tee -a "$PERF_OUT"
  fi
  echo "[$mode] restarts under the default crash back-off: NodeNotReady events $ev (node) $pev (pods), not-Ready samples $nr, evictions $evict" >> "$PERF_OUT"
  return $rc
}

# --- containerd 2.x -------------------------------------------------------

s_status_full() {
  local i
  for i in $(seq 1 "$(capacity)"); do pod "full-$i"; done
  k wait --for=condition=Ready pod -l e2e=1 --timeout=120s >/dev/null || return 1
  # The kubelet asks the runtime's status every ~5 s; containerd asks STATUS.
  sleep 12
  [ "$(k get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ] ||
    { echo "node not Ready with every ENI in use"; return 1; }
  grep -q 'STATUS' "$work/logs/containerd.log" && echo "(containerd's log mentions STATUS)"
  echo "all $(capacity) in use for 12 s: node Ready"
}

# A sandbox whose netns is destroyed without DEL: its record goes (GC or
# the DEL the kubelet sends for the dead sandbox), and the pod runs again.
s_netns_gone() {
  local cid ns ino
  pod gone
  ready gone || return 1
  # One record, the pod's: a sandbox of an earlier scenario still being
  # taken apart would be listed too, and the first line could be its.
  wait_for "enim to hold the pod's one attachment" 120 holds 1 || return 1
  cid=$(attachments | sed -n 1p)
  ns=$(enimctl --json attachments | python3 -c 'import json,sys; print(json.load(sys.stdin)["attachments"][0]["netns"])')
  # It is unmounted and removed first, then every process in it dies, so the
  # namespace is destroyed at once (with it the veth standing in for the ENI,
  # which the rig then puts back as a cloud's device would come home). In the
  # other order the kubelet could see the pause process die and send its DEL
  # while the netns was still there: a clean DEL, not the case under test.
  ino=$(on_node stat -L -c %i "$ns")
  on_node sh -c "umount -l '$ns' && rm -f '$ns'" || return 1
  kill_netns_procs "$ino"
  if [ "$mode" = primary ]; then
    wait_for "the ENI's veth to go with the namespace" 20 eni_gone || return 1
  fi
  reattach_enis
  wait_for "the record of $cid to go" 120 not_recorded "$cid" || return 1
  ready gone 120 || return 1
  echo "sandbox ${cid:0:12}: netns destroyed without DEL; record collected; pod Running again on $(pod_ip gone)"
}
not_recorded() { ! attachments | grep "$1" >/dev/null; }
# kill_netns_procs INODE: kill -9 every process in the network namespace
# with that inode.
kill_netns_procs() {
  local ino=$1 p
  for p in /proc/[0-9]*; do
    [ "$(stat -L -c %i "$p/ns/net" 2>/dev/null)" = "$ino" ] && kill -9 "${p#/proc/}" 2>/dev/null
  done
  return 0
}
# eni_gone: some ENI's veth has gone with a pod's namespace.
eni_gone() {
  local i
  for i in $(seq 0 $((ENI_COUNT - 1))); do
    ip -n "$gw" link show "vpc$i" >/dev/null 2>&1 || return 0
  done
  return 1
}

# reattach_enis: any ENI whose veth went with a pod's namespace is put back.
reattach_enis() {
  local i
  for i in $(seq 0 $((ENI_COUNT - 1))); do
    ip -n "$gw" link show "vpc$i" >/dev/null 2>&1 || eni_veth "$i"
  done
}

# --- a broken ENI ---------------------------------------------------------

s_broken_eni() {
  local free want
  # From a whole node: an ENI quarantined earlier (a device seen missing)
  # is freed by enimd's GC once its device is back.
  wait_for "allocatable $(capacity) first" 60 allocatable_is "$(capacity)" || return 1
  # Delete a free ENI's device from the node.
  free=$(on_node ip -o link show | awk -F': ' '/link\/ether 02:e5:00:00/ { print $2 }' | cut -d@ -f1 | sed -n 1p)
  on_node ip link del "$free"
  want=$(($(capacity) - 1))
  wait_for "allocatable $want" 60 allocatable_is "$want" || { echo "allocatable $(allocatable)"; return 1; }
  echo "ENI $free deleted: capacity $(k get node "$NODE_NAME" -o "jsonpath={.status.capacity.$(jsonkey "$(resource)")}"), allocatable $(allocatable) (the kubelet counts it unhealthy)"
  pod after-break
  ready after-break || return 1
  echo "the next pod got $(pod_ip after-break)"
  reattach_enis
  wait_for "allocatable back" 60 allocatable_is "$(capacity)"
}

# A node that really cannot serve: every ENI's device gone from the node,
# and a pod's ADD finding so (each ENI it tries is quarantined, then "no
# free ENI"). Nothing can be handed out and nothing is coming, so STATUS
# answers 50 and the node goes NotReady, naming why. The devices back, GC
# frees the ENIs, the node is Ready again and the pod runs.
node_ready_status() { k get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}'; }
node_ready_message() { k get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].message}'; }
node_not_ready_quarantined() {
  [ "$(node_ready_status)" = False ] && [[ "$(node_ready_message)" == *quarantined* ]]
}
node_is_ready() { [ "$(node_ready_status)" = True ]; }
s_status_unavailable() {
  local dev
  wait_for "allocatable $(capacity) first" 60 allocatable_is "$(capacity)" || return 1
  for dev in $(on_node ip -o link show | awk -F': ' '/link\/ether 02:e5:00:00/ { print $2 }' | cut -d@ -f1); do
    on_node ip link del "$dev"
  done
  # Without the resource: the device plugin counts the ENIs unhealthy.
  pod no-eni-left res=0 probe=none
  if ! wait_for "the node NotReady for enim's STATUS" 120 node_not_ready_quarantined; then
    echo "node Ready=$(node_ready_status): $(node_ready_message)"
    reattach_enis
    return 1
  fi
  echo "every ENI quarantined: node NotReady: $(node_ready_message)"
  reattach_enis
  wait_for "the node Ready again" 120 node_is_ready || { echo "still: $(node_ready_message)"; return 1; }
  ready no-eni-left 120 || return 1
  echo "devices back: node Ready, no-eni-left runs on $(pod_ip no-eni-left)"
}

# --- performance ----------------------------------------------------------

# bridge_on / bridge_off: the reference bridge + host-local (and portmap, as
# enim's conflist chains it) as the node's network, for the baseline: its
# conflist sorts before enim's, so containerd uses it while it is there.
bridge_on() {
  put_conflist 05-bridge.conflist <<'JSON'
{"cniVersion": "1.0.0", "name": "bridge-e2e", "plugins": [
  {"type": "bridge", "bridge": "cni-e2e", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
  sleep 3
}
bridge_off() { on_node rm -f /etc/cni/net.d/05-bridge.conflist; on_node ip link del cni-e2e 2>/dev/null || true; sleep 3; }

now_ms() { echo $(($(date +%s%N) / 1000000)); }
# p50/p95 of numbers on stdin.
pcts() { sort -n | awk '{ v[NR] = $1 } END { i50 = int(0.5 * (NR - 1) + 0.5) + 1; i95 = int(0.95 * (NR - 1) + 0.5) + 1; printf "%d %d", v[i50], v[i95] }'; }

# one_at_a_time PREFIX N KEY=VALUE...: N pods (pod's keys), each created,
# Ready, deleted in turn; prints apply->Ready p50 p95 (ms).
one_at_a_time() {
  local prefix=$1 n=$2 i t0 ready=()
  shift 2
  for i in $(seq 1 "$n"); do
    t0=$(now_ms)
    pod "$prefix$i" probe=none "$@"
    ready "$prefix$i" 60 || return 1
    ready+=($(($(now_ms) - t0)))
    k delete pod "$prefix$i" --wait=true >/dev/null
  done
  printf '%s\n' "${ready[@]}" | pcts
}

# at_once PREFIX RES: 10 pods created together; waits for all.
at_once() {
  local i pids=()
  for i in $(seq 1 10); do pod "$1$i" probe=none res="$2" & pids+=($!); done
  # Not a bare `wait`: the components are this shell's children too.
  wait "${pids[@]}"
  k wait --for=condition=Ready pod -l e2e=1 --timeout=120s >/dev/null || return 1
  k delete pod -l e2e=1 --wait=true >/dev/null
}

# timer_seconds URL NAME [LABELS]: a Prometheus histogram's count and total
# seconds (NAME_count, NAME_sum with exactly LABELS, case aside; none when
# empty) from URL, read on the node.
timer_seconds() {
  on_node curl -fsS "$1" | python3 -c '
import sys
name, labels = sys.argv[1], sys.argv[2].lower()
braces = f"{{{labels}}}" if labels else ""
v = {}
for line in sys.stdin:
    for k in ("sum", "count"):
        if line.lower().startswith(f"{name}_{k}{braces} "):
            v[k] = float(line.split()[1])
print(v.get("count", 0), v.get("sum", 0))' "$2" "${3:-}"
}
# add_seconds: enimd's ADD count and total seconds, from its /metrics.
add_seconds() { timer_seconds http://127.0.0.1:9464/metrics enim_request_duration_seconds 'verb="add"'; }

# add_since "COUNT SECONDS" "COUNT SECONDS": enimd's ADDs between two
# add_seconds readings: how many, and their mean.
add_since() {
  python3 -c "
import sys
c0, s0 = map(float, sys.argv[1].split()); c1, s1 = map(float, sys.argv[2].split())
print(f'{int(c1 - c0)} ADDs, mean {(s1 - s0) / max(c1 - c0, 1) * 1000:.1f} ms')
" "$1" "$2"
}

s_perf() {
  local log=$work/logs/containerd.log e b a0 a1
  a0=$(add_seconds)
  e=$(one_at_a_time "perf-enim-" 20 res=1) || return 1
  a1=$(add_seconds)
  wait_for "enim to hold nothing" 60 holds 0
  bridge_on
  b=$(one_at_a_time "perf-bridge-" 20 res=0) || { bridge_off; return 1; }
  if [ "$mode" = secondary ]; then
    at_once "perfx-bridge-" 0 || { bridge_off; return 1; }
  fi
  bridge_off
  if [ "$mode" = secondary ]; then at_once "perfx-enim-" 1 || return 1; fi
  local se sb
  se=$(python3 "$repo/scripts/cluster/sandbox-times.py" "$log" perf-enim-) || return 1
  sb=$(python3 "$repo/scripts/cluster/sandbox-times.py" "$log" perf-bridge-) || return 1
  perf_line "one at a time" "$se" "$sb"
  # The DRA run compares its claims' figure with this one (device plugin).
  echo "apply->Ready ms p50/p95: enim $e, bridge $b (one at a time)"
  echo "[$mode] apply->Ready one at a time (20 pods), ms p50/p95: enim (device plugin) $e, bridge $b" >> "$PERF_OUT"
  echo "enimd ADD (server side, from its /metrics): $(add_since "$a0" "$a1")" | tee -a "$PERF_OUT"
  if [ "$mode" = secondary ]; then
    se=$(python3 "$repo/scripts/cluster/sandbox-times.py" "$log" perfx-enim-) || return 1
    sb=$(python3 "$repo/scripts/cluster/sandbox-times.py" "$log" perfx-bridge-) || return 1
    perf_line "10 at once" "$se" "$sb"
  fi
}
# perf_line WHAT "N P50 P95" "N P50 P95": the RunPodSandbox comparison,
# kept in PERF_OUT under [PERF_TAG] (default: the mode).
perf_line() {
  local line
  line=$(python3 -c "
import sys
e = sys.argv[2].split(); b = sys.argv[3].split()
print(f'RunPodSandbox {sys.argv[1]} ({e[0]} pods each): enim p50 {e[1]} ms p95 {e[2]} ms; bridge p50 {b[1]} ms p95 {b[2]} ms; enim/bridge p50 {float(e[1]) / float(b[1]):.2f} x, p95 {float(e[2]) / float(b[2]):.2f} x')
" "$@")
  echo "$line"
  echo "[${PERF_TAG:-$mode}] $line" >> "$PERF_OUT"
}

# tests/k8s_cluster.rs against this cluster, through testkit::cluster.
s_rust() {
  (cd "$repo" && ENIM_E2E_CLUSTER=$work ENIM_E2E_MODE=$mode ENIM_E2E_BUSYBOX=$BUSYBOX \
    cargo test -q --all-features --test k8s_cluster -- --nocapture 2>&1) | tail -n 30
  return "${PIPESTATUS[0]}"
}

. "$repo/scripts/cluster/operator-scenarios.sh"
. "$repo/scripts/cluster/dra-scenarios.sh"

run_scenarios() {
  if [ "$provider" = cluster ]; then run_operator_scenarios; return; fi
  if [ "$run" = dra ]; then run_dra_scenarios; return; fi
  scenario "enimd and the node Ready; allocatable $(resource) = $(capacity)" s_ready
  scenario "scheduling: $(capacity) pods on enim, one more Pending (Insufficient $(resource)), runs after a delete" s_scheduling
  scenario "Services and DNS, kube-proxy clusterCIDR set (ENI addresses outside it)" s_services_cidr_set
  scenario "Services and DNS, kube-proxy clusterCIDR unset" s_services_cidr_unset
  scenario "the kubelet's HTTP readiness probe reaches a pod" s_probe
  scenario "hostPort through portmap" s_hostport
  scenario "instance metadata: refused to pods by default, reached by an opted-in namespace" s_metadata
  scenario "DEL from the kubelet releases the ENI" s_delete
  scenario "rollout restart of enimd: pods keep their ENIs, new pods work" s_rollout
  scenario "fault during pod churn: kill -9 enimd" s_fault_kill9
  scenario "fault during pod churn: kubelet restarted" s_fault_kubelet
  scenario "fault during pod churn: containerd restarted" s_fault_containerd
  scenario "fault during pod churn: reboot-like stop, netns deleted without DEL" s_fault_reboot
  scenario "containerd 2.x STATUS: every $(resource) in use, node stays Ready" s_status_full
  scenario "containerd 2.x: a sandbox whose netns was destroyed without DEL is collected" s_netns_gone
  # Primary mode's unit is the ENI itself; secondary mode's are addresses.
  [ "$mode" = primary ] && scenario "a broken ENI: unhealthy in the kubelet, the next pod gets another" s_broken_eni
  [ "$mode" = primary ] && scenario "every ENI quarantined (devices gone): STATUS not available, node NotReady; devices back: Ready" s_status_unavailable
  if [ "$run" = secondary ]; then
    scenario "restarts under the kubelet's default crash back-off: 3 rollouts and 10 kill -9s (the last 7 a 10-minute crash loop, enimd away 5 minutes), a pod at each: node never NotReady, nothing evicted, each pod runs within seconds of enimd's return" s_restarts_default_backoff
  else
    scenario "no pod rejected across $(admission_restarts) kill -9s of enimd" s_admission_kill9
    scenario "no pod rejected across $(admission_restarts) crash loops of enimd (killed again as soon as it is back, 3 times a round)" s_admission_crashloop
    scenario "no pod rejected across $(admission_restarts) rollout restarts of enimd" s_admission_rollout
  fi
  scenario "Rust tests (testkit::cluster): the pod identity the kubelet sends, as enim records it" s_rust
  scenario "performance: RunPodSandbox and apply->Ready, enim against bridge" s_perf
}
