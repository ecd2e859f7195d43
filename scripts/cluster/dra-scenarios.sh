# shellcheck shell=bash
# Scenarios of the DRA run (scripts/e2e-cluster.sh's "dra"): primary mode
# with [dra] enabled and the device plugin's DaemonSet deleted. enimd
# publishes the node's ENIs as devices of driver enim.io in one
# ResourceSlice, and pods claim them by attribute through
# ResourceClaimTemplates of DeviceClass eni.enim.io (deploy/06-deviceclass.yaml).
# Sourced by scenarios.sh; uses its helpers.
#
# The ENIs' placement, chosen so that each scenario has exactly the
# matches it needs:
#
#   ENI  subnet    zone   groups          network card
#   0    subnet-a  e2e-a  sg-web          0
#   1    subnet-a  e2e-a  sg-web          0
#   2    subnet-b  e2e-b  sg-db           1
#   3    subnet-b  e2e-b  sg-web, sg-db   1
#
# subnet-a: ENI 0 or 1. sg-db without sg-web: 2 alone. subnet-b with
# sg-web: 3 alone. eniId eni-e2e-1: 1 alone.

DRA_SUBNET=(subnet-a subnet-a subnet-b subnet-b)
DRA_ZONE=(e2e-a e2e-a e2e-b e2e-b)
# An ENI's groups, joined by "+".
DRA_GROUPS=(sg-web sg-web sg-db sg-web+sg-db)
DRA_CARD=(0 0 1 1)
# The static provider knows no MTU unless told, and publishes `mtu` only
# when it knows one; a veth's is 1500.
DRA_MTU=1500

# dra_eni_placement I: ENI I's MTU and placement, keys of its static
# inventory entry (net_up's EXTRA).
dra_eni_placement() {
  local groups=${DRA_GROUPS[$1]}
  groups="\"${groups//+/\", \"}\""
  printf 'mtu = %d\nplacement = { subnet = "%s", zone = "%s", security_groups = [%s], network_card = %d }\n' \
    "$DRA_MTU" "${DRA_SUBNET[$1]}" "${DRA_ZONE[$1]}" "$groups" "${DRA_CARD[$1]}"
}

dra_slice_name() { echo "$NODE_NAME-enim.io"; }
# slice JSONPATH: a field of this node's ResourceSlice.
slice() { k get resourceslice "$(dra_slice_name)" -o "jsonpath=$1"; }
slice_devices() { slice '{.spec.devices[*].name}' | tr ' ' '\n' | sort | tr '\n' ' '; }
slice_devices_are() { [ "$(slice_devices)" = "$1" ]; }
ALL_DEVICES="eni-e2e-0 eni-e2e-1 eni-e2e-2 eni-e2e-3 "

# attr_is DEVICE PATH WANT: one attribute of one device, as kubectl's
# JSONPath reads it (PATH: e.g. subnet.string, sg\.enim\.io/sg_db.bool).
attr_is() {
  local got
  got=$(slice "{.spec.devices[?(@.name==\"$1\")].attributes.$2}")
  [ "$got" = "$3" ] || { echo "$1 $2 is '$got', not '$3'"; return 1; }
  echo "  $1 $2 = $got"
}

# The placement table as the slice must show it: every attribute of every
# device, exactly (numaNode and resource.kubernetes.io/pcieRoot never: the
# ENIs are veths, with no PCI device in sysfs).
slice_exact() {
  k get resourceslice "$(dra_slice_name)" -o json | python3 -c '
import json, re, sys
subnets, zones, groups, cards, mtu = sys.argv[1:6]
subnets, zones, groups, cards = (x.split() for x in (subnets, zones, groups, cards))
got = {d["name"]: d.get("attributes", {}) for d in json.load(sys.stdin)["spec"]["devices"]}
bad = 0
for i in range(len(subnets)):
    gs = groups[i].split("+")
    want = {
        "eniId": {"string": f"eni-e2e-{i}"},
        "mac": {"string": f"02:e5:00:00:{i:02x}:01"},
        "mtu": {"int": int(mtu)},
        "deviceIndex": {"int": i + 1},
        "subnet": {"string": subnets[i]},
        "zone": {"string": zones[i]},
        "networkCard": {"int": int(cards[i])},
        "securityGroupCount": {"int": len(gs)},
    }
    for g in gs:
        want["sg.enim.io/" + re.sub("[^A-Za-z0-9]", "_", g)] = {"bool": True}
    have = got.get(f"eni-e2e-{i}")
    if have != want:
        bad = 1
        print(f"eni-e2e-{i}: attributes {have}, want {want}")
sys.exit(bad)
' "${DRA_SUBNET[*]}" "${DRA_ZONE[*]}" "${DRA_GROUPS[*]}" "${DRA_CARD[*]}" "$DRA_MTU"
}

# claim_template NAME [CEL] [PARAMETERS]: a ResourceClaimTemplate for one
# ENI of DeviceClass eni.enim.io, narrowed by CEL (none: any ENI), with
# PARAMETERS (YAML flow map) as its enim.io opaque config.
claim_template() {
  {
    cat <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: $1, labels: {e2e: "1"}}
spec:
  metadata: {labels: {e2e: "1"}}
  spec:
    devices:
      requests:
        - name: eni
          exactly:
            deviceClassName: eni.enim.io
EOF
    if [ -n "${2:-}" ]; then
      echo "            selectors:"
      echo "              - cel:"
      echo "                  expression: >-"
      echo "                    $2"
    fi
    if [ -n "${3:-}" ]; then
      echo "      config:"
      echo "        - requests: [eni]"
      echo "          opaque: {driver: enim.io, parameters: $3}"
    fi
  } | k apply -f - >/dev/null
}

# The claim the controller made for POD from its template, and the device
# the scheduler allocated it; the namespace is default unless NS is given.
pod_claim() { k -n "${2:-default}" get pod "$1" -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}'; }
claim_device() { k -n "${2:-default}" get resourceclaim "$1" -o jsonpath='{.status.allocation.devices.results[0].device}'; }
claim_gone() { ! k get resourceclaim "$1" >/dev/null 2>&1; }

# on_claimed_eni POD [DEVICES...]: POD's claim was allocated one of
# DEVICES (any, if none given), and the pod has that ENI's address and MAC
# on eth0. Sets DEV, I (the ENI's index) and CLAIM.
on_claimed_eni() {
  local pod=$1 ip mac; shift
  CLAIM=$(pod_claim "$pod")
  DEV=$(claim_device "$CLAIM")
  if [ $# -gt 0 ] && [[ " $* " != *" $DEV "* ]]; then
    echo "$pod's claim $CLAIM was allocated '$DEV', not one of: $*"
    return 1
  fi
  I=${DEV##*-}
  ip=$(pod_ip "$pod")
  [ "$ip" = "10.251.$I.10" ] || { echo "$pod has podIP $ip; its claim's ENI $DEV has 10.251.$I.10"; return 1; }
  mac=$(in_pod "$pod" "cat /sys/class/net/eth0/address")
  [ "$mac" = "$(eni_mac "$I")" ] || { echo "$pod's eth0 has MAC $mac, not $DEV's $(eni_mac "$I")"; return 1; }
}

# The claim's status.devices[0] as enimd writes it after ADD.
network_data() {
  k get resourceclaim "$1" -o jsonpath='{.status.devices[0].driver} {.status.devices[0].pool} {.status.devices[0].device} {.status.devices[0].networkData.interfaceName} {.status.devices[0].networkData.ips[*]} {.status.devices[0].networkData.hardwareAddress}'
}
network_data_is() { [ "$(network_data "$1")" = "$2" ]; }

# dra_unschedulable POD: the scheduler says it cannot allocate POD's claim.
dra_unschedulable() {
  k get pod "$1" -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}' | grep "cannot allocate all claims" >/dev/null
}
is_ready() { [ "$(k get pod "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]; }

# enimd's container logs on the node (every container of its pod, the
# killed ones too): LOGGED WHAT CLAIM finds a line with both. Matches are
# looked for in captured text: under pipefail, `... | grep -q` fails when
# grep's early exit cuts the writer off (SIGPIPE).
enimd_logs() { cat "$work"/root/var/log/pods/enim-system_enimd-*/enimd/*.log 2>/dev/null || true; }
has_line() { local text; text=$(cat); text=$(grep -F "$1" <<<"$text") && grep -qF "$2" <<<"$text"; }
logged() { enimd_logs | has_line "$1" "default/$2"; }
prepared_logged() { local c; c=$(pod_claim "$1") && [ -n "$c" ] && logged "prepared claim" "$c"; }

# --- a ---------------------------------------------------------------------

s_dra_ready() {
  local frame
  k -n enim-system rollout status daemonset/enimd --timeout=120s &&
    k wait --for=condition=Ready "node/$NODE_NAME" --timeout=120s &&
    k -n kube-system rollout status deployment/coredns --timeout=120s || return 1
  if k -n enim-system get daemonset enim-device-plugin >/dev/null 2>&1; then
    echo "the device plugin's DaemonSet is still there"; return 1
  fi
  [ -z "$(allocatable)" ] || { echo "the node has allocatable enim.io/eni $(allocatable): a device plugin registered"; return 1; }
  wait_for "ResourceSlice $(dra_slice_name) with devices $ALL_DEVICES" 60 slice_devices_are "$ALL_DEVICES" ||
    { echo "devices: $(slice_devices)"; k get resourceslices -o wide; return 1; }
  frame=$(slice '{.spec.driver} {.spec.pool.name} {.spec.nodeName} {.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}')
  [ "$frame" = "enim.io $NODE_NAME $NODE_NAME Node/$NODE_NAME" ] ||
    { echo "driver, pool, nodeName, owner: $frame"; return 1; }
  echo "ResourceSlice $(dra_slice_name): $frame; devices $(slice_devices)"
  attr_is eni-e2e-2 subnet.string subnet-b &&
    attr_is eni-e2e-2 mac.string 02:e5:00:00:02:01 &&
    attr_is eni-e2e-2 deviceIndex.int 3 &&
    attr_is eni-e2e-3 networkCard.int 1 &&
    attr_is eni-e2e-3 securityGroupCount.int 2 &&
    attr_is eni-e2e-3 'sg\.enim\.io/sg_db.bool' true &&
    attr_is eni-e2e-0 zone.string e2e-a &&
    attr_is eni-e2e-0 mtu.int "$DRA_MTU" || return 1
  slice_exact || return 1
  echo "every device's attributes are exactly its placement; no numaNode or pcieRoot (veths)"
}

# --- b, c ------------------------------------------------------------------

s_dra_subnet() {
  claim_template subnet-a 'device.attributes["enim.io"].subnet == "subnet-a"'
  pod dra-a claim=subnet-a
  ready dra-a || return 1
  on_claimed_eni dra-a eni-e2e-0 eni-e2e-1 || return 1
  local want
  want="enim.io $NODE_NAME $DEV eth0 10.251.$I.10/24 $(eni_mac "$I")"
  wait_for "claim $CLAIM's networkData" 30 network_data_is "$CLAIM" "$want" ||
    { echo "status.devices[0]: '$(network_data "$CLAIM")', want '$want'"; return 1; }
  echo "dra-a: claim $CLAIM (subnet-a) got $DEV; podIP $(pod_ip dra-a) and eth0's MAC are its"
  echo "status.devices[0] (driver pool device ifname ips mac): $(network_data "$CLAIM")"
}

s_dra_group() {
  # eni-e2e-0 and 1 have no sg_db attribute, eni-e2e-2 no sg_web: a
  # missing key would abort the allocation but for .?x.orValue(false).
  claim_template db-only 'device.attributes["sg.enim.io"].?sg_db.orValue(false) && !device.attributes["sg.enim.io"].?sg_web.orValue(false)'
  pod dra-db claim=db-only
  ready dra-db || return 1
  on_claimed_eni dra-db eni-e2e-2 || return 1
  echo "dra-db: claim $CLAIM (sg-db, not sg-web) got $DEV, the one ENI with sg-db alone; podIP $(pod_ip dra-db)"
}

# --- d ---------------------------------------------------------------------

# Two pods for the one ENI in subnet-b with sg-web: one runs, the other
# waits in the scheduler until the first is gone, then runs on it.
s_dra_contention() {
  local first="" second i p msg
  claim_template b-web 'device.attributes["enim.io"].subnet == "subnet-b" && device.attributes["sg.enim.io"].?sg_web.orValue(false)'
  pod dra-one claim=b-web
  pod dra-two claim=b-web
  for i in $(seq 180); do
    for p in dra-one dra-two; do is_ready "$p" && first=$p; done
    [ -n "$first" ] && break
    sleep 0.5
  done
  [ -n "$first" ] || { echo "neither pod became Ready"; return 1; }
  second=$([ "$first" = dra-one ] && echo dra-two || echo dra-one)
  on_claimed_eni "$first" eni-e2e-3 || return 1
  wait_for "$second to be unschedulable (cannot allocate all claims)" 60 dra_unschedulable "$second" ||
    { echo "$second: $(k get pod "$second" -o jsonpath='{.status.phase} {.status.conditions}')"; return 1; }
  msg=$(k get pod "$second" -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}')
  echo "$first runs on $DEV ($(pod_ip "$first")); $second Pending: $msg"
  sleep 5
  [ "$(k get pod "$second" -o jsonpath='{.status.phase}')" = Pending ] || { echo "$second left Pending while $first held the ENI"; return 1; }
  k delete pod "$first" --wait=true >/dev/null
  ready "$second" 120 || return 1
  on_claimed_eni "$second" eni-e2e-3 || return 1
  echo "after deleting $first, $second runs on $DEV ($(pod_ip "$second"))"
}

# --- e ---------------------------------------------------------------------

# hold_adds / release_adds: the node's enim plugin behind a wrapper that
# holds every ADD while a flag file exists (DEL and CHECK pass at once):
# a runtime slow to call CNI, so that enimd dies after the claim is
# prepared and before the pod's ADD, every time. restore_plugin puts the
# plugin back once no held ADD is left.
plugin_dir() { echo "$work/root/opt/cni/bin"; }
hold_adds() {
  local d
  d=$(plugin_dir)
  touch "$work/hold-adds"
  cp -p "$d/enim" "$d/enim.real"
  cat > "$d/.enim.hold" <<EOF
#!/bin/sh
if [ "\$CNI_COMMAND" = ADD ]; then
  while [ -e "$work/hold-adds" ]; do sleep 0.1; done
fi
exec /opt/cni/bin/enim.real "\$@"
EOF
  chmod 755 "$d/.enim.hold"
  mv "$d/.enim.hold" "$d/enim"
}
release_adds() { rm -f "$work/hold-adds"; }
restore_plugin() {
  local d
  d=$(plugin_dir)
  release_adds
  [ -e "$d/enim.real" ] || return 0
  sleep 1
  mv "$d/enim.real" "$d/enim"
}

s_dra_restart() {
  local old rc=0 claims=$work/root/var/lib/enim/dra-claims.json
  claim_template subnet-a 'device.attributes["enim.io"].subnet == "subnet-a"'
  hold_adds
  pod dra-restart claim=subnet-a
  wait_for "enimd to log 'prepared claim' for dra-restart's claim" 90 prepared_logged dra-restart || rc=1
  if [ $rc = 0 ]; then
    old=$(kill_enimd) || rc=1
    echo "claim $(pod_claim dra-restart) prepared; enimd $old killed (-9) before the pod's ADD (held)"
    grep -q "$(pod_claim dra-restart)" "$claims" ||
      { echo "the claim is not in $claims: $(cat "$claims" 2>&1)"; rc=1; }
  fi
  [ $rc = 0 ] && { wait_for "enimd back and ready" 120 enimd_serving "$old" || rc=1; }
  release_adds
  [ $rc = 0 ] && { ready dra-restart 120 || rc=1; }
  restore_plugin
  [ $rc = 0 ] || return 1
  on_claimed_eni dra-restart eni-e2e-0 eni-e2e-1 || return 1
  # The ADD came to the restarted enimd, which found the claim in its
  # record: the kubelet does not prepare a claim twice.
  k -n enim-system logs ds/enimd -c enimd | has_line "claimed ENI allocated" "default/$CLAIM" ||
    { echo "the restarted enimd logged no 'claimed ENI allocated' for $CLAIM"; return 1; }
  echo "the restarted enimd attached $DEV, the claim's ENI, from its record; podIP $(pod_ip dra-restart)"
}

# --- f ---------------------------------------------------------------------

s_dra_claim_deleted() {
  claim_template only-1 'device.attributes["enim.io"].eniId == "eni-e2e-1"'
  pod dra-f1 claim=only-1
  ready dra-f1 || return 1
  on_claimed_eni dra-f1 eni-e2e-1 || return 1
  local c=$CLAIM
  k delete pod dra-f1 --wait=true >/dev/null
  wait_for "claim $c to go with its pod" 60 claim_gone "$c" || return 1
  wait_for "enimd to unprepare $c" 30 logged "unprepared claim" "$c" || return 1
  echo "dra-f1 deleted: claim $c gone and unprepared"
  pod dra-f2 claim=only-1
  ready dra-f2 120 || return 1
  on_claimed_eni dra-f2 eni-e2e-1 || return 1
  echo "dra-f2 (only eni-e2e-1) runs on $DEV ($(pod_ip dra-f2))"
}

# --- g ---------------------------------------------------------------------

# enimd's ConfigMap with its [device_plugin] turned on too (both: DRA is on
# already), or back as it was.
cm_saved() { echo "$work/enimd-config.json"; }
cm_patch() {
  python3 - "$(cm_saved)" "$1" <<'PY'
import json, sys
saved, which = sys.argv[1:]
toml = json.load(open(saved))["data"]["enimd.toml"]
if which == "both":
    off = "[device_plugin]\nenabled = false"
    if off not in toml:
        sys.exit("enimd.toml has no '[device_plugin] enabled = false'")
    toml = toml.replace(off, "[device_plugin]\nenabled = true")
print(json.dumps({"data": {"enimd.toml": toml}}))
PY
}
enimd_pod_cycled() {
  k -n enim-system delete pod -l app.kubernetes.io/component=node-agent --wait=true >/dev/null
}
# The agent's newest pod (`logs ds/enimd` would wait for a running one).
agent_pod() {
  k -n enim-system get pods -l app.kubernetes.io/component=node-agent \
    --sort-by=.metadata.creationTimestamp -o name | tail -n 1
}
# What the agent's pod said: install-cni reads the same config and stops
# on it first (the pod never gets to enimd), then enimd's own container.
agent_said() {
  local c p
  p=$(agent_pod) && [ -n "$p" ] || return 1
  for c in install-cni enimd; do
    k -n enim-system logs "$p" -c "$c" --previous 2>/dev/null | sed "s/^/$c: /"
    k -n enim-system logs "$p" -c "$c" 2>/dev/null | sed "s/^/$c: /"
  done
  return 0
}
both_named() { agent_said | has_line '[dra] enabled = true' 'and [device_plugin] enabled = true'; }
s_dra_both_on() {
  local p rc=0 state
  k -n enim-system get configmap enimd-config -o json > "$(cm_saved)"
  p=$(cm_patch both) || return 1
  k -n enim-system patch configmap enimd-config --type=merge -p "$p" >/dev/null
  enimd_pod_cycled
  wait_for "enimd to exit at start, naming both settings" 120 both_named || rc=1
  state=$(k -n enim-system get "$(agent_pod)" --no-headers 2>&1 | awk '{ print $3, "restarts", $4 }')
  echo "the node meanwhile: $(k get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].message}; taints: {.spec.taints[*].key}')"
  if [ $rc = 0 ]; then
    echo "the agent's pod with both on: $state; it said:"
    agent_said | grep -F '[device_plugin] enabled = true' | tail -n 1
  else
    echo "the agent's pod: $state"; agent_said | tail -n 5
  fi
  k -n enim-system patch configmap enimd-config --type=merge -p "$(cm_patch saved)" >/dev/null
  enimd_pod_cycled
  enimd_ready || return 1
  wait_for "the ResourceSlice back with every ENI" 90 slice_devices_are "$ALL_DEVICES" ||
    { echo "devices: $(slice_devices)"; return 1; }
  # Without enimd the node may go NotReady for a while: leave it Ready.
  k wait --for=condition=Ready "node/$NODE_NAME" --timeout=120s >/dev/null || return 1
  [ $rc = 0 ] && echo "ConfigMap restored: enimd Ready, its ResourceSlice lists $(slice_devices)"
  return $rc
}

# --- h ---------------------------------------------------------------------

# apply->Ready of pods that claim an ENI, one at a time: what the claim
# costs (the claim made from its template, allocated, prepared) over the
# device plugin's count, whose figure the primary run measures (the two
# cannot share a node).
s_dra_perf() {
  local d dp
  claim_template any
  d=$(one_at_a_time perf-dra- 10 claim=any) || return 1
  echo "[dra] apply->Ready one at a time (10 pods), ms p50/p95: enim (DRA claim) $d" | tee -a "$PERF_OUT"
  # Where it went: the whole-second steps of apply->Ready are the kubelet's
  # PLEG relist (once a second), not the claim (pod-phases.py).
  k -n enim-system logs ds/enimd -c enimd > "$work/logs/enimd-dra-perf.log" 2>/dev/null || true
  python3 "$repo/scripts/cluster/pod-phases.py" "$work/logs/kubelet.log" "$work/logs/containerd.log" \
    perf-dra- "$work/logs/enimd-dra-perf.log" | awk '
      { v[$1] = $3 "/" $4; n = $2 }
      END { printf "[dra] where a claim pod'"'"'s start went (%d pods), ms p50/p95: kubelet before the sandbox %s (of it enimd'"'"'s prepare %s), RunPodSandbox %s, containers %s, waiting for the PLEG relist %s\n",
              n, v["kubelet"], v["prepare"], v["sandbox"], v["container"], v["pleg"] }' | tee -a "$PERF_OUT"
  dp=$(grep -F '[primary] apply->Ready one at a time' "$PERF_OUT" | sed 's/.*ms p50\/p95: //' || true)
  if [ -n "$dp" ]; then
    echo "beside the primary run's (device plugin, 20 pods): $dp"
  else
    echo "(no device plugin figure to set it beside: the one-node primary run's s_perf is left out of the default, run it with --mode primary --only s_ready,s_perf)"
  fi
}

# --- i ---------------------------------------------------------------------

# Uninstall: enimd's DaemonSet deleted. enimd removes its plugin sockets on
# SIGTERM; the kubelet unregisters the plugin and deletes the driver's
# ResourceSlices 30 s later (its wipe delay). Then enim is installed again
# and the slice comes back.
slice_gone() { ! k get resourceslice "$(dra_slice_name)" >/dev/null 2>&1; }
s_dra_uninstall() {
  local t0 took
  k -n enim-system delete daemonset enimd --wait=true >/dev/null || return 1
  t0=$(now_ms)
  wait_for "the kubelet to delete the ResourceSlice" 120 slice_gone ||
    { echo "still there: $(slice_devices)"; return 1; }
  took=$(($(now_ms) - t0))
  echo "the DaemonSet deleted: the ResourceSlice gone $took ms later (the kubelet's wipe delay is 30 s)"
  k apply -f - < "$repo/deploy/30-daemonset.yaml" >/dev/null || return 1
  enimd_ready || return 1
  wait_for "the ResourceSlice back with every ENI" 90 slice_devices_are "$ALL_DEVICES" ||
    { echo "devices: $(slice_devices)"; return 1; }
  echo "installed again: the ResourceSlice lists $(slice_devices)"
}

run_dra_scenarios() {
  scenario "enimd Ready; the node's ResourceSlice lists every ENI with its attributes (no device plugin)" s_dra_ready
  scenario "a claim by subnet: the pod runs on the allocated ENI; networkData names eth0, its address and MAC" s_dra_subnet
  scenario "a claim by security group (.?sg_db.orValue(false)): the one ENI with that group alone" s_dra_group
  scenario "two pods, one matching ENI: one runs, the other Pending (cannot allocate) until the first is deleted" s_dra_contention
  scenario "kill -9 of enimd between prepare and ADD: the pod runs on the prepared ENI" s_dra_restart
  scenario "a claim deleted with its pod: the ENI is free again for a claim of it alone" s_dra_claim_deleted
  scenario "performance: apply->Ready of pods with a claim, one at a time" s_dra_perf
  # Last: it takes enimd away for a while.
  scenario "[dra] and [device_plugin] both on: the agent's pod stops at start naming both; restored" s_dra_both_on
  scenario "uninstall: enimd's DaemonSet deleted, the kubelet deletes the ResourceSlice; installed again, it is back" s_dra_uninstall
}
