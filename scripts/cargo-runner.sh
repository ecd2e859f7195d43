#!/bin/sh
# Cargo's runner for this workspace (.cargo/config.toml): cargo builds as
# you, and this runs what it built.
#
# - Test and bench binaries (target/<profile>/deps/*) run as root: the kernel
#   tests make network namespaces. Already root (CI), they are exec'd as
#   they are; otherwise through `sudo -E`, which keeps the environment
#   (CI=true among it; PATH becomes sudo's secure_path, which has ip, ping
#   and the other tools the tests run).
# - Everything else (`cargo run`) runs as you.
#
# ENIM_TEST_AS_USER=1 runs tests as you: kernel tests then skip with a
# message (or fail under CI=true).
case "$1" in
  */deps/*) ;;
  *) exec "$@" ;;
esac
if [ "$(id -u)" = 0 ] || [ "${ENIM_TEST_AS_USER:-}" = 1 ]; then
  exec "$@"
fi
if ! command -v sudo >/dev/null 2>&1; then
  echo "cargo-runner.sh: no sudo: running $1 as $(id -un); kernel tests will skip" >&2
  exec "$@"
fi
exec sudo -E "$@"
