#!/usr/bin/env bash
# Builds enim's binaries (enimd, enim, enimctl), with the CNI plugin linked
# statically. Extra arguments go to cargo (e.g. --release, -p enim-bench).
#
#   scripts/build-bins.sh [--release] [cargo build arguments...]
#
# Why the plugin is static: the runtime execs it on the node's own OS
# (install-cni copies it out of the image), whose C library may be older
# than the one it was built against; and with no shared library to load it
# starts about a third faster, which every pod's ADD and DEL pays. enimd and
# enimctl stay dynamic: enimd resolves cloud endpoints through the C
# library's name service switch, which a static glibc program cannot load
# safely.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
profile_flags=()
for a in "$@"; do
  case "$a" in --release) profile_flags=(--release) ;; esac
done
# enimd and enimctl (the `enim` package).
cargo build --quiet "$@" -p enim --bins
# The control plane ships in the same image (deploy/50-operator.yaml).
cargo build --quiet "$@" -p enim-operator --bin enim-operator
# The plugin is its own package (cni/, `enim-cni`), so it links only the
# agent's API and client. Only its final link changes; its dependencies are
# those of `enim-cni` alone, without features other workspace members turn
# on.
cargo rustc --quiet "${profile_flags[@]}" -p enim-cni --bin enim -- -C target-feature=+crt-static
