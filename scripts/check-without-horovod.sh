#!/usr/bin/env bash
# The install without Horovod, as a new user makes it: a clean clone of the commit checked out
# here, `CARAMEL_WITHOUT_HOROVOD=1 make setup`, then `caramel run` of the quickstart, of an
# unchanged Horovod script (examples/horovod/mnist.py) and of an elastic one
# (examples/horovod/mnist_elastic.py, whose gang runs elastic on TensorFlow's collectives), each
# of which must end Succeeded.
# The clone is removed at the end, whatever happens.
#   scripts/check-without-horovod.sh [--keep]     (--keep: leave the clone, for a look inside)
set -euo pipefail
repository=$(cd "$(dirname "$0")/.." && pwd)
commit=$(git -C "$repository" rev-parse HEAD)
workspace=$(mktemp -d "${TMPDIR:-/tmp}/caramel-without-horovod.XXXXXX")
clone="$workspace/caramel"
if [ "${1:-}" = "--keep" ]; then
    echo "--- the clone stays in $clone"
else
    trap 'rm -rf "$workspace"' EXIT
fi

echo "--- a clean clone of $commit"
git clone --quiet --no-checkout "$repository" "$clone"
git -C "$clone" checkout --quiet "$commit"
cd "$clone"

echo "--- CARAMEL_WITHOUT_HOROVOD=1 make setup"
CARAMEL_WITHOUT_HOROVOD=1 make setup
if .venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('horovod') is None)"; then
    echo "Horovod is installed in the clone: the set-up did not leave it out" >&2
    exit 1
fi

for job in examples/quickstart.yaml examples/horovod/mnist.yaml examples/horovod/mnist_elastic.yaml; do
    echo "--- caramel run $job"
    .venv/bin/caramel run "$job" 2>&1 | tee "$workspace/run.log"
    grep -q "^Succeeded " "$workspace/run.log" || { echo "$job did not end Succeeded" >&2; exit 1; }
done
echo "--- without Horovod: every job Succeeded"
