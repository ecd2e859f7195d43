#!/usr/bin/env bash
# Renders deploy/ from the Helm chart (charts/enim), the one source of the
# manifests: `helm template` with charts/enim/ci/deploy-values.yaml, each
# template's documents into the deploy/ file of the same name. Hooks (the
# uninstall hook) are left out: kubectl apply would run them at once.
#
#   scripts/render-deploy.sh [--check]
#
#   --check   write nothing; exit 1, with the difference, when deploy/ is
#             not what the chart renders (tests/helm_chart.rs runs this)
#
# helm is HELM, else the one scripts/cluster/build.sh builds.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
helm=${HELM:-$("$root/scripts/cluster/build.sh" --print-dir)/helm}
[ -x "$helm" ] || { echo "render-deploy.sh: no helm at $helm (run scripts/cluster/build.sh)" >&2; exit 2; }
check=0
case "${1:-}" in
  --check) check=1 ;;
  "") ;;
  *) echo "usage: render-deploy.sh [--check]" >&2; exit 2 ;;
esac

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$helm" template enim "$root/charts/enim" --namespace enim-system --include-crds --no-hooks \
  --values "$root/charts/enim/ci/deploy-values.yaml" > "$out/all.yaml"
# helm prints each document as "---", "# Source: enim/<dir>/<file>", the
# document; the documents of one file go to deploy/<file>, in helm's order.
python3 - "$out" <<'PY'
import os, re, sys
out = sys.argv[1]
text = open(os.path.join(out, "all.yaml")).read()
files = {}
for doc in re.split(r"^---\n", text, flags=re.M):
    if not doc.strip():
        continue
    m = re.match(r"# Source: enim/(?:templates|crds)/([^\n]+)\n", doc)
    if not m:
        sys.exit(f"render-deploy.sh: a document without its source: {doc[:80]!r}")
    files.setdefault(m.group(1), []).append(doc[m.end():].rstrip("\n") + "\n")
os.mkdir(os.path.join(out, "deploy"))
for name, docs in files.items():
    with open(os.path.join(out, "deploy", name), "w") as f:
        f.write("---\n".join(docs))
PY
rm "$out/all.yaml"

if [ "$check" = 1 ]; then
  # deploy/'s YAML files are all rendered; the others (Containerfile,
  # systemd/) are its own.
  diff -r -u -x Containerfile -x systemd "$root/deploy" "$out/deploy" || {
    echo "render-deploy.sh: deploy/ differs from the chart's rendering: run scripts/render-deploy.sh" >&2
    exit 1
  }
  exit 0
fi
rm -f "$root"/deploy/*.yaml
cp "$out"/deploy/*.yaml "$root/deploy/"
echo "render-deploy.sh: deploy/ rendered from charts/enim"
