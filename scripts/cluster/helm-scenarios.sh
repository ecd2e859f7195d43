# The cloud run's scenarios of the Helm release itself (cloud.sh's
# cloud_install made it with `helm install`): an upgrade to a new image
# while pods hold ENIs. Sourced by cloud-scenarios.sh; each s_* returns 0
# for PASS.

# The second tag of the run's image, for the upgrade.
HELM_UPGRADE_TAG=e2e-upgrade

# cloud_nodes_up: the nodes registered now (the late node once it joined;
# node 2 not after s_cloud_node_deleted).
cloud_nodes_up() {
  local i
  for i in $(seq 1 "$CLOUD_LATE"); do
    [ -e "$work/n$i/ns/mnt" ] && k get node "enim-e2e-node$i" >/dev/null 2>&1 && echo "$i"
  done
  return 0
}

# holding POD: what must not change while POD keeps its ENI: its uid and
# restarts, its containers, eth0's MAC and addresses.
holding() {
  local p=$1
  printf '%s restarts=%s containers=%s eth0=%s\n' \
    "$(k get pod "$p" -o jsonpath='{.metadata.uid}')" \
    "$(k get pod "$p" -o jsonpath='{.status.containerStatuses[*].restartCount}')" \
    "$(k get pod "$p" -o jsonpath='{.status.containerStatuses[*].containerID}')" \
    "$(in_pod "$p" "cat /sys/class/net/eth0/address; ip addr show dev eth0" |
      awk 'NR == 1 { print } $1 ~ /^inet/ { print $2 }' | tr '\n' ' ')"
}

# held_in_sets: each set's users ("node pod eni ip" a line), as the agents
# report them.
held_in_sets() {
  k get nrs -o json | jq -r '.items[] | .metadata.name as $n
    | .status.used[]? | "\($n) \(.podName) \(.eni) \(.ip // "")"' | sort
}

# moto_of_held SETS: each held ENI of SETS (held_in_sets' lines) in moto:
# id, instance, device index, primary address, and whether the held
# secondary address is still assigned. The ENI's other secondary addresses
# may change meanwhile: a surplus the operator drains is not a pod's.
moto_of_held() {
  moto_enis | jq -r --arg sets "$1" '
    ($sets | split("\n") | map(select(. != "") | split(" "))) as $held
    | .[] as $e | $held[] | select(.[2] == $e.id) | (.[3] // "") as $ip
    | "\($e.id) \($e.instance) \($e.device_index) \($e.addresses[0])"
      + (if $ip != "" then " holds \($ip): \($e.addresses | index($ip) != null)" else "" end)' | sort
}

# enim_images: every enim pod's containers' images, one line each.
enim_images() {
  k -n enim-system get pods -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.spec.containers[*].image}{"\n"}{end}'
}
# on_tag TAG: every enim pod runs TAG and is Ready.
on_tag() {
  [ -z "$(enim_images | awk -v t=":$1" '{ for (f = 2; f <= NF; f++) if (substr($f, length($f) - length(t) + 1) != t) print }')" ] &&
    [ -z "$(k -n enim-system get pods -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -v True)" ]
}

# (helm 1) `helm upgrade` to a second tag of the same image while a pod on
# each kind of node holds an ENI (node 1 a whole ENI by the device plugin,
# node 2 a secondary address, node 3 a whole ENI by a DRA claim): every
# DaemonSet and the operator roll to it, and no pod loses its ENI: the same
# pod (uid, no restart, same sandbox) with the same eth0 MAC and addresses,
# the sets list it on the same ENI, and moto has that ENI on the same
# instance. A pod started afterwards runs on the new agents.
s_cloud_helm_upgrade() {
  local i p t0 before after sets_before sets_after enis moto_before moto_after rc=0
  local pods=(web-1 web-2 dra-1)
  pod_on 1 web-1
  pod_on 2 web-2
  claim_template any-eni
  pod dra-1 claim=any-eni
  for p in "${pods[@]}"; do ready "$p" 120 || return 1; done
  on_moto_eni dra-1 3 || return 1
  before=$(for p in "${pods[@]}"; do echo "$p $(holding "$p")"; done)
  sets_before=$(held_in_sets)
  enis=$(awk '{ print $3 }' <<<"$sets_before" | sort -u | tr '\n' ' ')
  moto_before=$(moto_of_held "$sets_before")
  echo "held before:"; echo "$before"; echo "$sets_before"
  # The new tag, imported as the run imports images: into each node's
  # containerd.
  for i in $(cloud_nodes_up); do
    on_cloud_node "$i" ctr_node -n k8s.io images tag --force "$ENIM_IMAGE" "${ENIM_IMAGE%:*}:$HELM_UPGRADE_TAG" >/dev/null || return 1
  done
  t0=$(date +%s%N)
  helm_e2e upgrade enim "$repo/charts/enim" --namespace enim-system \
    --values "$work/etc/values.json" --set "image.tag=$HELM_UPGRADE_TAG" >/dev/null || return 1
  for p in $(k -n enim-system get daemonset -o name) deployment/enim-operator; do
    k -n enim-system rollout status "$p" --timeout=180s >/dev/null || { echo "$p did not roll"; return 1; }
  done
  wait_for "every enim pod on :$HELM_UPGRADE_TAG and Ready" 120 on_tag "$HELM_UPGRADE_TAG" || { enim_images; return 1; }
  echo "rolled to :$HELM_UPGRADE_TAG in $(ms_since "$t0") ms: $(enim_images | wc -l) pods ($(k -n enim-system get daemonset -o name | tr '\n' ' ')deployment/enim-operator)"
  echo "helm: $(helm_e2e history enim --namespace enim-system --max 1 -o json | jq -r '.[0] | "revision \(.revision), \(.status)"')"
  after=$(for p in "${pods[@]}"; do echo "$p $(holding "$p")"; done)
  [ "$after" = "$before" ] || { echo "a pod changed:"; diff <(echo "$before") <(echo "$after"); rc=1; }
  # The agents restarted write their status anew: wait for each set to
  # have been synced by the new agent before comparing.
  wait_for "the sets to list the same users" 60 test_eq "$sets_before" held_in_sets ||
    { echo "the sets' users changed:"; diff <(echo "$sets_before") <(held_in_sets); rc=1; }
  moto_after=$(moto_of_held "$sets_before")
  [ "$moto_after" = "$moto_before" ] || { echo "moto changed:"; diff <(echo "$moto_before") <(echo "$moto_after"); rc=1; }
  [ "$rc" = 0 ] && echo "the same after: each pod, its eth0, its set's entry and its ENI in moto ($enis)"
  for p in "${pods[@]}"; do on_moto_eni "$p" "$(k get pod "$p" -o jsonpath='{.spec.nodeName}' | sed 's/enim-e2e-node//')" >/dev/null || rc=1; done
  pod_on 1 web-new
  ready web-new 120 || return 1
  on_moto_eni web-new 1 || return 1
  return $rc
}

# release_objects: what the release made that is still there (kind/name).
release_objects() {
  k -n enim-system get daemonset,deployment,job,configmap,serviceaccount,role,rolebinding,pod \
    -l app.kubernetes.io/name=enim -o name
  k get clusterrole,clusterrolebinding,validatingadmissionpolicy,validatingadmissionpolicybinding,deviceclass \
    -l app.kubernetes.io/name=enim -o name
}
enim_slices() { k get resourceslice -o jsonpath='{range .items[?(@.spec.driver=="enim.io")]}{.metadata.name}{"\n"}{end}'; }
# node_enim_files I: enim's files on node I: its conflist and plugin.
node_enim_files() { on_cloud_node "$1" on_node sh -c 'ls /etc/cni/net.d/*enim* /opt/cni/bin/enim 2>/dev/null' || true; }
# node_enim_state I: what enimd keeps on node I: the files in its state
# and run dirs (the dirs stay: they were its mount points), and its
# nftables table.
node_enim_state() {
  on_cloud_node "$1" on_node sh -c 'find /var/lib/enim /run/enim -mindepth 1 2>/dev/null
    nft list table inet enim >/dev/null 2>&1 && echo "table inet enim"' || true
}
late_enis() {
  moto_enis | jq -r --arg late "$(node_instance "$CLOUD_LATE")" \
    '.[] | select(.device_index != 0 and (.instance == $late or .tags["enim.io/node"] == $late)) | .id'
}

# (helm 2) `helm uninstall`, last (it removes enim), with the pods that
# used enim deleted first (docs/install.md, "Uninstalling"). Its
# pre-delete hook cleans every node's conflist and plugin and has the
# operator release every ENI it made, then stops it; then helm deletes the
# release. Checked: every object of the release and of the hook gone, the
# kubelet deletes the DRA ResourceSlices, no NetResourceSet left, every
# node without enim's files, and no ENI the operator made left in moto.
# The late node's agent made its own ENIs (`aws` provider): the hook's
# marker has it give them back when helm stops it. After that no ENI of
# it is left in moto, and no node keeps enimd's state or table.
s_cloud_helm_uninstall() {
  local i t0 rc=0 left late_before
  cloud_clean
  late_before=$(late_enis | wc -l)
  # The late node, when it joined in this run, has ENIs of its own to give back.
  if [[ " $(cloud_nodes_up | tr '\n' ' ') " == *" $CLOUD_LATE "* ]] && [ "$late_before" -eq 0 ]; then
    echo "the late node is up but its agent made no ENI: nothing to test"; rc=1
  fi
  t0=$(date +%s%N)
  helm_e2e uninstall enim --namespace enim-system --wait --timeout 300s ||
    { k -n enim-system logs job/enim-uninstall 2>&1 | tail -n 20; return 1; }
  echo "helm uninstall (its hook included) returned after $(ms_since "$t0") ms"
  wait_for "every object of the release gone" 120 test_eq "" release_objects ||
    { echo "left: $(release_objects | tr '\n' ' ')"; rc=1; }
  wait_for "the kubelet to delete enim's ResourceSlices" 120 test_eq "" enim_slices ||
    { echo "slices left: $(enim_slices | tr '\n' ' ')"; rc=1; }
  k get crd netresourcesets.enim.io >/dev/null || { echo "the CRD went"; rc=1; }
  left=$(k get nrs -o name)
  [ -z "$left" ] || { echo "NetResourceSets left: $(echo $left)"; rc=1; }
  for i in $(cloud_nodes_up); do
    left=$(node_enim_files "$i")
    [ -z "$left" ] || { echo "enim-e2e-node$i keeps: $(echo $left)"; rc=1; }
  done
  left=$(operator_enis)
  [ -z "$left" ] || { echo "ENIs the operator made, left in moto: $(echo $left)"; rc=1; }
  wait_for "the late node's agent to give back its own ENIs" 90 test_eq "" late_enis ||
    { echo "the late node's ENIs left in moto: $(late_enis | tr '\n' ' ')"; rc=1; }
  for i in $(cloud_nodes_up); do
    wait_for "enimd on enim-e2e-node$i to remove its state" 90 test_eq "" node_enim_state "$i" ||
      { echo "enim-e2e-node$i keeps: $(node_enim_state "$i" | tr '\n' ' ')"; rc=1; }
  done
  echo "gone $(ms_since "$t0") ms after: the release's objects, its hook's, enim's ResourceSlices, the sets, every node's CNI files, state and table, the operator's ENIs and the late node's own ($late_before); the CRD stays"
  return $rc
}
