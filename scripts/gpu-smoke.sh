#!/usr/bin/env bash
# The GPU image on this machine's GPUs: the quickstart (Caramel's API) and an unchanged Horovod
# script (examples/horovod/keras_mnist.py), each as a job of 2 workers of 1 GPU each under
# `caramel run` inside the image, on both backends, and whether NCCL carried the gradients, by
# NCCL's own log (NCCL_DEBUG=INFO, its collectives). Needs 2 GPUs or more, docker, and NVIDIA's
# container toolkit (`docker run --gpus`); nothing here has run on a GPU yet (docs/gpu.md).
#   scripts/gpu-smoke.sh [IMAGE]      (default caramel-runtime-gpu:0.1.0: scripts/build-image.sh --gpu)
set -euo pipefail
IMAGE=${1:-caramel-runtime-gpu:0.1.0}
JOBS="examples/quickstart.yaml examples/horovod/keras_mnist.yaml"

command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: this machine has no NVIDIA driver" >&2; exit 1; }
gpus=$(nvidia-smi -L | grep -c '^GPU ' || true)
[ "$gpus" -ge 2 ] || { echo "this needs 2 GPUs, the machine has $gpus" >&2; exit 1; }
nvidia-smi -L | head -2
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# The example's job, its script and arguments unchanged, made a GPU job: 2 workers, one GPU each
# (so one rank each), on the backend given.
GPU_JOB='
import sys, yaml
job = yaml.safe_load(open(sys.argv[1]))
job["spec"]["workers"] = {"replicas": 2, "resources": {"limits": {"nvidia.com/gpu": 1}}}
job["spec"].setdefault("caramel", {})["backend"] = sys.argv[2]
yaml.safe_dump(job, open("/tmp/gpu-job.yaml", "w"))
'

failed=0
for job in $JOBS; do
    for backend in horovod tensorflow; do
        log="$logs/$(basename "$job" .yaml)-$backend.log"
        echo "--- $job on 2 GPUs, backend $backend"
        # NCCL keeps its shared memory in /dev/shm, whose docker default (64 MB) is too small for it.
        docker run --rm --gpus 2 --shm-size=1g -e NCCL_DEBUG=INFO -e NCCL_DEBUG_SUBSYS=INIT,COLL "$IMAGE" \
            sh -c "python -c '$GPU_JOB' $job $backend && caramel run /tmp/gpu-job.yaml" > "$log" 2>&1 || true
        grep -E "^(Succeeded|Failed) |trains on|go over|no GPU" "$log" | head -5 || true
        nccl=$(grep -cE "NCCL INFO (AllReduce|Broadcast|AllGather): opCount" "$log" || true)
        if grep -q "^Succeeded " "$log"; then
            echo "Succeeded; NCCL carried the gradients: $([ "$nccl" -gt 0 ] && echo "yes, $nccl collectives in NCCL's log" || echo "no: NCCL logged no collective")"
        else
            failed=1
            echo "did not succeed; its last lines:"
            tail -20 "$log"
        fi
        [ "$nccl" -gt 0 ] || failed=1
    done
done
[ "$failed" = 0 ] && echo "--- every job Succeeded, its gradients over NCCL" || { echo "--- see above"; exit 1; }
