#!/usr/bin/env bash
# Builds the e2e cluster's upstream components from their Go modules, at
# pinned versions, into a cache keyed by version (a second run reuses them):
#
#   scripts/cluster/build.sh [--print-dir]
#
#   --print-dir   only print the directory the binaries are (or would be) in
#
# Nothing is downloaded but Go modules. The cache is ENIM_E2E_CACHE (default
# /var/cache/enim-e2e); binaries land in $ENIM_E2E_CACHE/bin-<key>/, where
# <key> hashes every pinned version, this script and the Kubernetes build
# module (scripts/cluster/k8s), so changing any of them builds afresh.
#
# Kubernetes and etcd need a build module: k8s.io/kubernetes replaces its staging
# modules (k8s.io/api, ...) with paths inside its own tree, so
# `go install k8s.io/kubernetes/cmd/kubelet@v1.34.4` is refused.
# scripts/cluster/k8s/go.mod requires it and points each staging module at
# its published v0.34.x release; its go.sum pins every dependency.
# The others build with `go install MODULE/cmd@VERSION`.
set -euo pipefail

K8S_VERSION=v1.34.4
ETCD_VERSION=v3.6.16
COREDNS_VERSION=v1.15.0
CONTAINERD_VERSION=v2.2.9
CNI_PLUGINS_VERSION=v1.9.0
CNITOOL_VERSION=v1.3.1
# Helm installs enim in the cloud run (charts/enim) and renders deploy/ from
# the chart (scripts/render-deploy.sh). Its release builds with the
# Kubernetes minor of its client-go (v0.37 here) as `helm template`'s
# default cluster version; set the same.
HELM_VERSION=v3.22.0
HELM_K8S_MINOR=37

here=$(cd "$(dirname "$0")" && pwd)
cache=${ENIM_E2E_CACHE:-/var/cache/enim-e2e}
key=$( {
  echo "$K8S_VERSION $ETCD_VERSION $COREDNS_VERSION $CONTAINERD_VERSION $CNI_PLUGINS_VERSION $CNITOOL_VERSION $HELM_VERSION"
  go version
  cat "$0" "$here"/k8s/go.* "$here"/etcd/go.*
} | sha256sum | cut -c1-12)
out=$cache/bin-$key

if [ "${1:-}" = --print-dir ]; then
  echo "$out"
  exit 0
fi
if [ -f "$out/.complete" ]; then
  echo "cluster components: cached in $out"
  exit 0
fi

# Static binaries where upstream ships them static; containerd's shim and
# the CNI plugins run on the node like any other binary.
export CGO_ENABLED=0
export GOFLAGS=-trimpath
tmp=$out.partial
rm -rf "$tmp"
mkdir -p "$tmp"
t0=$(date +%s)
phase() { echo "cluster build: $1 ($(($(date +%s) - t0)) s so far)"; }

# Kubernetes: version ldflags as upstream's build sets them, so
# `kubelet --version` prints the release.
phase "kubernetes $K8S_VERSION"
minor=${K8S_VERSION#v1.}
minor=${minor%%.*}
ver=k8s.io/component-base/version
(cd "$here/k8s" && go build -ldflags "-s -w \
  -X $ver.gitVersion=$K8S_VERSION -X $ver.gitMajor=1 -X $ver.gitMinor=$minor \
  -X $ver.gitTreeState=clean -X $ver.buildDate=1970-01-01T00:00:00Z \
  -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION" \
  -o "$tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet \
  k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubectl)

gobin() { GOBIN="$tmp" go install -ldflags "-s -w $2" "$1"; }

phase "etcd $ETCD_VERSION"
# The same pattern: go.etcd.io/etcd/server/v3 (a main package) replaces its
# siblings with paths in its tree; scripts/cluster/etcd requires them all.
(cd "$here/etcd" && go build -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION" \
  -o "$tmp/etcd" go.etcd.io/etcd/server/v3)

phase "coredns $COREDNS_VERSION"
gobin "github.com/coredns/coredns@$COREDNS_VERSION" ""

phase "containerd $CONTAINERD_VERSION"
cver="-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
for c in containerd containerd-shim-runc-v2 ctr; do
  gobin "github.com/containerd/containerd/v2/cmd/$c@$CONTAINERD_VERSION" "$cver"
done

phase "CNI plugins $CNI_PLUGINS_VERSION, cnitool $CNITOOL_VERSION"
mkdir -p "$tmp/cni"
for p in main/bridge main/loopback main/host-device main/ptp \
  ipam/host-local meta/portmap meta/tuning meta/bandwidth meta/sbr; do
  GOBIN="$tmp/cni" go install -ldflags "-s -w" \
    "github.com/containernetworking/plugins/plugins/$p@$CNI_PLUGINS_VERSION"
done
gobin "github.com/containernetworking/cni/cnitool@$CNITOOL_VERSION" ""

phase "helm $HELM_VERSION"
hpkg=helm.sh/helm/v3
gobin "$hpkg/cmd/helm@$HELM_VERSION" "-X $hpkg/internal/version.version=$HELM_VERSION \
  -X $hpkg/internal/version.metadata= -X $hpkg/internal/version.gitTreeState=clean \
  -X $hpkg/pkg/chartutil.k8sVersionMajor=1 -X $hpkg/pkg/chartutil.k8sVersionMinor=$HELM_K8S_MINOR \
  -X $hpkg/pkg/lint/rules.k8sVersionMajor=1 -X $hpkg/pkg/lint/rules.k8sVersionMinor=$HELM_K8S_MINOR"

phase "done"
for b in "$tmp"/kubelet "$tmp"/etcd "$tmp"/containerd; do "$b" --version | sed -n 1p; done
"$tmp/helm" version --short
touch "$tmp/.complete"
rm -rf "$out"
mv "$tmp" "$out"
echo "cluster components: built in $(($(date +%s) - t0)) s into $out"
