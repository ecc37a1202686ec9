#!/usr/bin/env bash
# Helm post-renderer: reads the chart's rendered manifests on stdin, writes them back with the
# Coherence Guard sidecar added (kustomization.yaml beside this file says what changes).
# Works on a copy of deploy/kubernetes, so concurrent renders do not share files.
# KUBECTL picks the kubectl binary (default: the one on PATH; it needs `kubectl kustomize`).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tree="$(cd "$here/../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -R "$tree/components" "$tree/overlays" "$work/"
cat >"$work/overlays/production-stack/chart/helm-output.yaml"
"${KUBECTL:-kubectl}" kustomize "$work/overlays/production-stack"
