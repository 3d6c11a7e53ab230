#!/usr/bin/env bash
# Builds the project's image, caramel:0.1.0. No image can be pulled on the project's machines,
# so by default its base is made locally (scripts/build-base-image.sh, skipped if it exists).
# Where images can be pulled, a public base does as well:
#   BASE_IMAGE=python:3.11-slim-bookworm scripts/build-image.sh
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE="caramel:0.1.0"
LOCAL_BASE_IMAGE="caramel-base:bookworm"
BASE_IMAGE="${BASE_IMAGE:-$LOCAL_BASE_IMAGE}"

if [ "$BASE_IMAGE" = "$LOCAL_BASE_IMAGE" ]; then
    scripts/build-base-image.sh
fi
SECONDS=0
echo "--- building $IMAGE on $BASE_IMAGE (a cold build compiles Horovod: 5 to 15 minutes)"
docker build --build-arg BASE_IMAGE="$BASE_IMAGE" -t "$IMAGE" .
echo "--- built $IMAGE in ${SECONDS} s"
