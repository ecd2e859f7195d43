#!/usr/bin/env bash
# Benchmarks enim on this machine against Debian's reference host-device
# plugin (static IPAM) and the kernel floor, in the same run, interleaved:
# ADD/DEL latency through exec, throughput at 1/4/16 pods in parallel, GC
# and restore at scale, API round trip, enimd memory, binary size.
#
#   sudo scripts/bench.sh               full run: release build, markdown table
#                                       on stdout, every figure as JSON in
#                                       $CARGO_TARGET_DIR/enim-bench/latest.json
#   sudo scripts/bench.sh --smoke       a few cycles of everything (CI): checks
#                                       that it all works, times nothing
#   extra arguments go to enim-bench: --cycles N, --json FILE,
#   --rss-cycles N, --rss-workers N, --seed N, --only PHASE,... (burst,
#   fleet, api, latency, throughput, rss, gc-dead, gc-moved, restore; JSON
#   to partial.json)
#
#   scripts/bench.sh --help             this text
#   scripts/bench.sh --only burst,fleet   the simulated cloud only (a warm
#                                       pool under a burst of pods; a
#                                       1,000-node fleet over one account's
#                                       EC2 buckets): no root, no namespaces
#   scripts/bench.sh admission [--creations N] [--clients N]
#                                       EniPolicy's webhook (release build)
#                                       against a real kube-apiserver: pod
#                                       creations with and without it; JSON
#                                       in $CARGO_TARGET_DIR/enim-bench/admission.json
#
# It makes its own uniquely named namespaces and veth pairs, never touches
# this machine's own interfaces, sends traffic only inside its namespaces,
# and removes everything on exit, pass or fail.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib.sh"
target=${CARGO_TARGET_DIR:-$root/target}

if [ "${1:-}" = admission ]; then
  shift
  echo "== building enim-admission-bench (release)" >&2
  (cd "$root" && cargo build --quiet --release -p enim-bench --bin enim-admission-bench)
  mkdir -p "$target/enim-bench"
  exec "$target/release/enim-admission-bench" --json "$target/enim-bench/admission.json" "$@"
fi

smoke=false
only=false
# Only the simulations (burst, fleet) picked: no root, sandbox or plugins.
sim_only=false
prev=
for a in "$@"; do
  case "$a" in -h|--help) sed -n '2,26p' "$0"; exit 0 ;; esac
  [ "$a" = --smoke ] && smoke=true
  if [ "$a" = --only ]; then only=true; fi
  if [ "$prev" = --only ]; then
    sim_only=true
    IFS=, read -ra picked <<<"$a"
    for p in "${picked[@]}"; do
      case "$p" in burst|fleet|operator) ;; *) sim_only=false ;; esac
    done
  fi
  prev=$a
done
if ! $sim_only; then
  need_root bench.sh "it creates network namespaces"
  for f in /usr/lib/cni/host-device /usr/lib/cni/static; do
    [ -x "$f" ] || { echo "bench.sh: $f is missing: apt-get install containernetworking-plugins" >&2; exit 1; }
  done
fi

# The smoke checks behaviour, so a debug build (mostly built by the tests
# already) will do; figures come from release builds only.
if $smoke; then profile=debug; flags=(); name=smoke; else profile=release; flags=(--release); name=latest; fi
if $sim_only; then
  echo "== building enim-bench ($profile)" >&2
  (cd "$root" && cargo build --quiet "${flags[@]}" -p enim-bench)
else
  echo "== building enim and enim-bench ($profile)" >&2
  "$root/scripts/build-bins.sh" "${flags[@]}" -p enim-bench
fi
bin="$target/$profile"

tag="enimb$$"
work=$(mktemp -d "${TMPDIR:-/tmp}/enim-bench.XXXXXX")
cleanup() {
  # enimd processes the bench started (listed by pid, and checked to be
  # ours by their config path in case a pid was reused).
  if [ -f "$work/enimd.pids" ]; then
    while read -r pid; do
      if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -- "$work/" >/dev/null; then
        kill "$pid" 2>/dev/null || true
      fi
    done <"$work/enimd.pids"
  fi
  # Every namespace of this run (their veths go with them).
  if ! $sim_only; then
    for ns in $(ip netns list | awk '{print $1}' | grep "^$tag-" || true); do
      ip netns del "$ns" 2>/dev/null || true
    done
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A run of some phases only must not replace the last full run's figures.
if $only; then name=partial; fi
json="$target/enim-bench/$name.json"
mkdir -p "$(dirname "$json")"
"$bin/enim-bench" --bin-dir "$bin" --tag "$tag" --work "$work" --json "$json" "$@"
