# Scenarios of the control plane's run (scripts/e2e-cluster.sh's
# "operator"): enim-operator keeps the node's NetResourceSet from a static
# inventory of the sandbox's ENIs; enimd's `cluster` provider serves it and
# writes its status. Sourced by scenarios.sh; uses its helpers.

# nrs JSONPATH: a field of this node's NetResourceSet.
nrs() { k get nrs "$NODE_NAME" -o "jsonpath=$1"; }
nrs_is() { [ "$(nrs "$1")" = "$2" ]; }
# The status's container ids, one a line.
nrs_users() { nrs '{range .status.used[*]}{.containerId}{"\n"}{end}' | sort; }

s_operator_ready() {
  k -n enim-system rollout status deployment/enim-operator --timeout=120s || return 1
  wait_for "the NetResourceSet's spec to list $(capacity) ENIs" 60 \
    nrs_is '{.status.summary.enis}' "$(capacity)" || return 1
  nrs_is '{.metadata.ownerReferences[0].kind}' Node || { echo "not owned by the Node"; return 1; }
  k get nrs -o wide
}

# Pods' ENIs appear in the status with the pods' names, and leave it on DEL.
s_operator_status() {
  local p
  for p in nrs-a nrs-b; do pod "$p"; done
  for p in nrs-a nrs-b; do ready "$p" || return 1; done
  wait_for "status.summary.used = 2" 30 nrs_is '{.status.summary.used}' 2 || return 1
  [ "$(nrs '{range .status.used[*]}{.podName}{"\n"}{end}' | sort | tr '\n' ' ')" = "nrs-a nrs-b " ] ||
    { echo "status.used names: $(nrs '{.status.used[*].podName}')"; return 1; }
  k get nrs
  k delete pod nrs-a nrs-b --wait=true >/dev/null
  wait_for "status.summary.used = 0" 30 nrs_is '{.status.summary.used}' 0 || return 1
  echo "status.used named both pods, then none; available $(nrs '{.status.summary.available}')"
}

# The operator killed (-9) during pod churn: pods keep their ENIs, new pods
# run, and its restart changes nothing in the spec.
operator_pid() { node_pid '^/usr/local/bin/enim-operator'; }
operator_back() { local p; p=$(operator_pid) && [ -n "$p" ] && [ "$p" != "$1" ]; }
s_operator_kill9() {
  local old enis
  enis=$(nrs '{.spec.enis[*].id}')
  pod op-a; ready op-a || return 1
  old=$(operator_pid); [ -n "$old" ] || { echo "no operator runs"; return 1; }
  kill -9 "$old"
  pod op-b; ready op-b 120 || return 1
  wait_for "a new operator" 120 operator_back "$old" || return 1
  k -n enim-system rollout status deployment/enim-operator --timeout=120s >/dev/null || return 1
  sleep 6 # one resync of the restarted operator
  [ "$(nrs '{.spec.enis[*].id}')" = "$enis" ] || { echo "spec changed: $(nrs '{.spec.enis[*].id}')"; return 1; }
  ready op-a 5 || return 1
  echo "operator $old killed; op-b ran meanwhile; spec unchanged after its restart"
}

# The API server down: the agent serves ADD and DEL from what it holds,
# across its own kill -9, and the status catches up once the API is back.
# The kubelet cannot start pods without the API server, so the runtime's
# part is played by cnitool with the node's conflist.
cni_on_node() {
  on_node env CNI_PATH=/opt/cni/bin NETCONFPATH=/etc/cni/net.d "$bin/cnitool" "$1" enim "/run/netns/$2"
}
apiserver_ready() { k get --raw /readyz; }
s_operator_apiserver_down() {
  local ns_a=e2e-apidown-a ns_b=e2e-apidown-b old rc=0
  on_node ip netns add "$ns_a"; on_node ip netns add "$ns_b"
  stop kube-apiserver
  ! apiserver_ready 2>/dev/null || { echo "the API server still answers"; rc=1; }
  if [ $rc = 0 ]; then
    cni_on_node add "$ns_a" | grep '"ips"' >/dev/null || { echo "ADD with the API server down failed"; rc=1; }
  fi
  if [ $rc = 0 ]; then
    old=$(kill_enimd) || rc=1
    wait_for "enimd back and ready (API server down)" 120 enimd_serving "$old" || rc=1
  fi
  if [ $rc = 0 ]; then
    cni_on_node del "$ns_a" || { echo "DEL after the restart failed"; rc=1; }
    cni_on_node add "$ns_b" | grep '"ips"' >/dev/null || { echo "ADD after the restart failed"; rc=1; }
  fi
  start_apiserver
  wait_for kube-apiserver 240 apiserver_ready || rc=1
  if [ $rc = 0 ]; then
    wait_for "the status to show the one attachment made while the API was down" 60 \
      nrs_is '{.status.summary.used}' 1 || rc=1
    nrs_users | grep '^cnitool-' >/dev/null || { echo "status.used: $(nrs_users)"; rc=1; }
  fi
  cni_on_node del "$ns_b" || true
  on_node ip netns del "$ns_a" 2>/dev/null || true
  on_node ip netns del "$ns_b" 2>/dev/null || true
  [ $rc = 0 ] && wait_for "status.summary.used = 0" 60 nrs_is '{.status.summary.used}' 0 || return 1
  echo "API server down: ADD, kill -9 of enimd, DEL and ADD served; status caught up when it came back"
}

run_operator_scenarios() {
  scenario "enim-operator Ready; the node's NetResourceSet lists $(capacity) ENIs, owned by the Node" s_operator_ready
  scenario "enimd and the node Ready; allocatable $(resource) = $(capacity)" s_ready
  scenario "scheduling: $(capacity) pods on enim, one more Pending (Insufficient $(resource)), runs after a delete" s_scheduling
  scenario "the NetResourceSet's status names the pods that hold ENIs" s_operator_status
  scenario "Services and DNS, kube-proxy clusterCIDR unset" s_services_cidr_unset
  scenario "DEL from the kubelet releases the ENI" s_delete
  scenario "rollout restart of enimd: pods keep their ENIs, new pods work" s_rollout
  scenario "fault during pod churn: kill -9 enimd" s_fault_kill9
  scenario "kill -9 of the operator: pods keep their ENIs, a new pod runs, the spec is unchanged" s_operator_kill9
  scenario "the API server down: enimd serves ADD and DEL (and restarts) from what it holds; status catches up" s_operator_apiserver_down
  scenario "no pod rejected across $(admission_restarts) kill -9s of enimd" s_admission_kill9
}
