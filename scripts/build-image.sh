#!/usr/bin/env bash
# Builds the enim node image (deploy/Containerfile) without pulling
# anything: the image is FROM scratch and holds the four binaries, this
# machine's `nft` (enimd applies the host path's masquerade table with
# it; Debian's nftables package), plus exactly the shared libraries `ldd`
# says they load, copied from this machine.
#
#   scripts/build-image.sh [--debug] [--no-build] [IMAGE] [-- BUILD-ARGS...]
#
#   IMAGE       default enim:<crate version>
#   --debug     package the dev-profile binaries (faster to build; the
#               deploy test in CI uses them) instead of --release
#   --no-build  do not run cargo; package what is already built
#   BUILD-ARGS  passed to `podman build` (e.g. --no-cache)
#
# Builds with CONTAINER_TOOL (default: podman if installed, else docker).
# Honours CARGO_TARGET_DIR. The binaries are copied with their debug info
# stripped (symbols stay, so backtraces keep function names). Afterwards
# it runs `enimd --version` and `nft --version` in the image, with no
# network, to prove the loader finds every library.
set -euo pipefail

profile=release
build=1
image=""
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --debug) profile=debug; shift ;;
    --no-build) build=0; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "build-image.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) image=$1; shift ;;
  esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | sed -n 1p)
image=${image:-enim:$version}
if [ -z "${CONTAINER_TOOL:-}" ]; then
  if command -v podman >/dev/null; then CONTAINER_TOOL=podman; else CONTAINER_TOOL=docker; fi
fi

cd "$root"
if [ "$build" = 1 ]; then
  if [ "$profile" = release ]; then scripts/build-bins.sh --release; else scripts/build-bins.sh; fi
fi
target=$(realpath -m "${CARGO_TARGET_DIR:-target}")/$profile

# Only what the image holds goes in the context: target/ is gigabytes.
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
bins=(enimd enim enimctl enim-operator)
for b in "${bins[@]}"; do
  [ -x "$target/$b" ] || { echo "build-image.sh: $target/$b is missing" >&2; exit 1; }
  objcopy --strip-debug "$target/$b" "$ctx/$b"
done
# nft, as this machine has it: its libraries join the binaries' below.
nft=$(command -v nft || true)
[ -n "$nft" ] || nft=/usr/sbin/nft
[ -x "$nft" ] || { echo "build-image.sh: nft is missing (apt-get install nftables)" >&2; exit 1; }
mkdir -p "$ctx/rootfs/usr/sbin"
cp -L "$nft" "$ctx/rootfs/usr/sbin/nft"

# The libraries: every path ldd resolves for any of the binaries (and the
# loader itself), copied with symlinks followed to the path the binary
# asks for. The vDSO is the kernel's, not a file.
mkdir -p "$ctx/rootfs"
linked=("${bins[@]/#/$ctx/}" "$ctx/rootfs/usr/sbin/nft")
libs=$(for b in "${linked[@]}"; do ldd "$b"; done |
  awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u)
[ -n "$libs" ] || { echo "build-image.sh: ldd found no libraries" >&2; exit 1; }
if for b in "${linked[@]}"; do ldd "$b"; done | grep 'not found' >/dev/null; then
  echo "build-image.sh: a library is missing on this machine" >&2; exit 1
fi
for lib in $libs; do
  mkdir -p "$ctx/rootfs$(dirname "$lib")"
  cp -L "$lib" "$ctx/rootfs$lib"
done
# /var/run is /run, as on every distribution: runtimes pass pods'
# namespaces as /var/run/netns/... or /run/netns/..., and the pod mounts
# one dir that must answer to both.
mkdir -p "$ctx/rootfs/run" "$ctx/rootfs/var"
ln -s ../run "$ctx/rootfs/var/run"

# The image this tag named before: once the tag moves, nothing names it and
# each rebuild would leave ~200 MiB behind (CI's disk ran out on them).
previous=$("$CONTAINER_TOOL" image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
"$CONTAINER_TOOL" build --pull=never "${extra[@]}" -f "$root/deploy/Containerfile" -t "$image" "$ctx"
current=$("$CONTAINER_TOOL" image inspect --format '{{.Id}}' "$image")
if [ -n "$previous" ] && [ "$previous" != "$current" ]; then
  # Refused (and kept) while a container or another tag still uses it.
  "$CONTAINER_TOOL" rmi "$previous" >/dev/null 2>&1 || true
fi
# Explicit, modest limits: podman's defaults for root (nofile 1048576,
# nproc 4194304) are refused where root may not raise its hard limits (no
# CAP_SYS_RESOURCE, as in some CI sandboxes).
limits=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
"$CONTAINER_TOOL" run --rm --network none "${limits[@]}" "$image" --version
"$CONTAINER_TOOL" run --rm --network none "${limits[@]}" --entrypoint /usr/sbin/nft "$image" --version
size=$("$CONTAINER_TOOL" image inspect --format '{{.Size}}' "$image")
echo "built $image ($profile binaries, $((size / 1024 / 1024)) MiB; libraries: $(echo $libs))"
echo "push it where your nodes pull from and set it in deploy/30-daemonset.yaml"
