#!/usr/bin/env bash
# End to end on a throwaway kind cluster: builds the image, installs the Helm chart, runs
# manifests/example-carameljob.yaml to Succeeded and checks that its workers served training
# metrics. The cluster is deleted on exit, whatever happens.
#
#   scripts/kind-e2e.sh
#
# Needs docker and kind on PATH, and kubectl and helm (`make setup` puts them into .venv/bin).
# KIND_CLUSTER names the cluster (default caramel-e2e); KIND_NODE_IMAGE picks a node image.
# None of this can run on the project's own machines: no kind node image can be had there.
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER=${KIND_CLUSTER:-caramel-e2e}
IMAGE=caramel:0.1.0
RELEASE=caramel
OPERATOR_NAMESPACE=caramel-system
JOB_MANIFEST=manifests/example-carameljob.yaml
JOB_NAMESPACE=default
# Rank 0's metrics port (spec.metrics.port, the CRD's default) and a free local port for it.
WORKER_METRICS_PORT=9401
LOCAL_METRICS_PORT=19401
export PATH="$PWD/.venv/bin:$PATH"

for tool in docker kind; do
    command -v "$tool" >/dev/null || { echo "$tool is not installed" >&2; exit 1; }
done
for tool in kubectl helm; do
    command -v "$tool" >/dev/null || { echo "$tool is not installed: run 'make setup'" >&2; exit 1; }
done

job=""
port_forward=""
cleanup() {
    local status=$?
    # Best effort from here on: nothing may stop the cluster's deletion.
    set +e
    [[ -n $port_forward ]] && kill "$port_forward" 2>/dev/null
    if [[ $status -ne 0 ]] && kubectl cluster-info >/dev/null 2>&1; then
        echo "--- failed (exit $status); what the cluster shows"
        kubectl get carameljobs,pods,services --all-namespaces -o wide
        if [[ -n $job ]]; then
            kubectl -n "$JOB_NAMESPACE" describe carameljob "$job"
            kubectl -n "$JOB_NAMESPACE" logs "$job-worker-0" --tail=50
        fi
        kubectl -n "$OPERATOR_NAMESPACE" logs "deployment/$RELEASE-operator" --tail=200
    fi
    echo "--- deleting kind cluster $CLUSTER"
    kind delete cluster --name "$CLUSTER"
    exit "$status"
}
trap cleanup EXIT

phase() {
    kubectl -n "$JOB_NAMESPACE" get carameljob "$job" -o jsonpath='{.status.phase}'
}

echo "--- creating kind cluster $CLUSTER"
kind create cluster --name "$CLUSTER" --wait 180s ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"}

echo "--- building $IMAGE and loading it into the cluster's nodes"
scripts/build-image.sh
kind load docker-image "$IMAGE" --name "$CLUSTER"

echo "--- installing the chart"
helm install "$RELEASE" helm/caramel --namespace "$OPERATOR_NAMESPACE" --create-namespace --wait --timeout 5m
kubectl wait --for=condition=Established crd/carameljobs.caramel.dev --timeout=60s

echo "--- running $JOB_MANIFEST"
job=$(kubectl -n "$JOB_NAMESPACE" apply -f "$JOB_MANIFEST" -o jsonpath='{.metadata.name}')
# Not `kubectl wait` for Running: a short job may pass through Running between two looks.
echo "--- waiting for $job to run (pulling, scheduling and rendezvous)"
for _ in $(seq 300); do
    case $(phase) in Running | Succeeded | Failed) break ;; esac
    sleep 2
done
echo "--- $job is $(phase)"
[[ $(phase) != Failed ]] || { echo "$job failed" >&2; exit 1; }

# While the job runs, scrape rank 0's metrics through a port-forward to its worker pod. A short
# job may finish before the scrape succeeds: the status' progress, written by the operator from
# the same metrics, is then the evidence.
scraped=false
kubectl -n "$JOB_NAMESPACE" port-forward "pod/$job-worker-0" "$LOCAL_METRICS_PORT:$WORKER_METRICS_PORT" >/dev/null 2>&1 &
port_forward=$!
for _ in $(seq 30); do
    if curl -fsS "http://127.0.0.1:$LOCAL_METRICS_PORT/metrics" 2>/dev/null | grep -q '^caramel_steps_total{.*rank="0"'; then
        scraped=true
        echo "--- rank 0 serves caramel_steps_total"
        break
    fi
    [[ $(phase) == Running ]] || break
    sleep 2
done
kill "$port_forward" 2>/dev/null || true
port_forward=""

kubectl -n "$JOB_NAMESPACE" wait --for=jsonpath='{.status.phase}'=Succeeded "carameljob/$job" --timeout=15m
kubectl -n "$JOB_NAMESPACE" get cmj -o wide

step=$(kubectl -n "$JOB_NAMESPACE" get carameljob "$job" -o jsonpath='{.status.progress.step}')
echo "--- $job Succeeded; status.progress.step=${step:-unset}, rank 0 scraped while running: $scraped"
if [[ $scraped != true && ${step:-0} -le 0 ]]; then
    echo "no training metrics: rank 0 could not be scraped and the status shows no progress" >&2
    exit 1
fi
echo "--- end-to-end test passed"
