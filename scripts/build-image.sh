#!/usr/bin/env bash
# Builds the enim node image (deploy/Containerfile) from release binaries.
#
#   scripts/build-image.sh [IMAGE]        default IMAGE: enim:<crate version>
#
# Runs `cargo build --release --bins`, copies enimd, enim and enimctl into an
# otherwise empty build context, and builds with CONTAINER_TOOL (default:
# podman if installed, else docker). Honours CARGO_TARGET_DIR.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n1)
image=${1:-enim:$version}
if [ -z "${CONTAINER_TOOL:-}" ]; then
  if command -v podman >/dev/null; then CONTAINER_TOOL=podman; else CONTAINER_TOOL=docker; fi
fi

cd "$root"
cargo build --release --bins
target=$(realpath -m "${CARGO_TARGET_DIR:-target}")

# Only the binaries go in the context: target/ is gigabytes.
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp "$target/release/enimd" "$target/release/enim" "$target/release/enimctl" "$ctx/"
"$CONTAINER_TOOL" build -f "$root/deploy/Containerfile" -t "$image" "$ctx"
echo "built $image; push it where your nodes pull from and set it in deploy/30-daemonset.yaml"
