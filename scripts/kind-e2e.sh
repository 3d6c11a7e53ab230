#!/usr/bin/env bash
# End to end on a throwaway kind cluster: builds both images (the operator's and the workers'),
# loads them into the nodes and runs the portable cluster suite (tests/cluster: the chart, jobs,
# restarts, refusals, Pod Security, network policies, RBAC) against it. The cluster is deleted on
# exit, whatever happens.
#
#   scripts/kind-e2e.sh [PYTEST ARGS...]
#
# Needs docker and kind on PATH, and kubectl and helm (`make setup` puts them into .venv/bin).
# KIND_CLUSTER names the cluster (default caramel-e2e); KIND_NODE_IMAGE picks a node image.
# Any other cluster runs the same suite: KUBECONFIG=... .venv/bin/python -m pytest -m cluster tests/cluster
# None of this can run on the project's own machines: no kind node image can be had there.
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER=${KIND_CLUSTER:-caramel-e2e}
OPERATOR_IMAGE=caramel-operator:0.1.0
RUNTIME_IMAGE=caramel-runtime:0.1.0
RELEASE=caramel-suite  # the release tests/cluster installs
OPERATOR_NAMESPACE=$RELEASE-system
export PATH="$PWD/.venv/bin:$PATH"

for tool in docker kind; do
    command -v "$tool" >/dev/null || { echo "$tool is not installed" >&2; exit 1; }
done
for tool in kubectl helm; do
    command -v "$tool" >/dev/null || { echo "$tool is not installed: run 'make setup'" >&2; exit 1; }
done

cleanup() {
    local status=$?
    # Best effort from here on: nothing may stop the cluster's deletion.
    set +e
    if [[ $status -ne 0 ]] && kubectl cluster-info >/dev/null 2>&1; then
        echo "--- failed (exit $status); what the cluster shows"
        kubectl get carameljobs,pods,services,networkpolicies --all-namespaces -o wide
        kubectl -n "$OPERATOR_NAMESPACE" logs "deployment/$RELEASE-operator" --tail=200
    fi
    echo "--- deleting kind cluster $CLUSTER"
    kind delete cluster --name "$CLUSTER"
    exit "$status"
}
trap cleanup EXIT

echo "--- creating kind cluster $CLUSTER"
kind create cluster --name "$CLUSTER" --wait 180s ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"}

echo "--- building $OPERATOR_IMAGE and $RUNTIME_IMAGE and loading them into the cluster's nodes"
scripts/build-image.sh
kind load docker-image "$OPERATOR_IMAGE" "$RUNTIME_IMAGE" --name "$CLUSTER"

echo "--- the cluster suite (tests/cluster)"
KUBECONFIG="$(mktemp)"
export KUBECONFIG
kind get kubeconfig --name "$CLUSTER" >"$KUBECONFIG"
CARAMEL_OPERATOR_IMAGE="$OPERATOR_IMAGE" CARAMEL_RUNTIME_IMAGE="$RUNTIME_IMAGE" \
    .venv/bin/python -m pytest -m cluster tests/cluster -ra "$@"
echo "--- end-to-end suite passed"
