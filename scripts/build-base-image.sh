#!/usr/bin/env bash
# Builds caramel-base:bookworm, a minimal Debian bookworm image made here with debootstrap, for
# machines that cannot pull images. Its python3 (installed by the Dockerfile) is 3.11, as Caramel
# needs. Does nothing if the image exists. Needs root, debootstrap and a running dockerd.
set -euo pipefail

IMAGE="caramel-base:bookworm"
# The certificate authorities this machine trusts. Where the network inspects TLS with its own
# authority, pip inside the image build must trust it too, so the base carries this bundle.
HOST_CA_BUNDLE="/etc/ssl/certs/ca-certificates.crt"
IMAGE_CA_BUNDLE="/etc/caramel-base/ca-certificates.crt"

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "--- base image $IMAGE exists"
    exit 0
fi
command -v debootstrap >/dev/null || { echo "debootstrap is needed: apt-get install debootstrap" >&2; exit 1; }

rootfs="$(mktemp -d)"
cleanup() {
    # A failed debootstrap can leave /proc and /sys mounted inside the root file system:
    # unmount them first, and never let rm cross into another file system.
    awk -v root="$rootfs/" 'index($2, root) == 1 { print $2 }' /proc/mounts | sort -r | xargs -r umount -l
    rm -rf --one-file-system "$rootfs"
}
trap cleanup EXIT

SECONDS=0
echo "--- debootstrap: Debian bookworm (minbase) into $rootfs"
debootstrap --variant=minbase bookworm "$rootfs"
# Whatever builds on this image runs apt-get update itself; stale lists would only add weight.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb
changes=(--change 'CMD ["/bin/bash"]')
if [ -f "$HOST_CA_BUNDLE" ]; then
    install -D -m 644 "$HOST_CA_BUNDLE" "$rootfs$IMAGE_CA_BUNDLE"
    changes+=(--change "ENV SSL_CERT_FILE=$IMAGE_CA_BUNDLE" --change "ENV PIP_CERT=$IMAGE_CA_BUNDLE")
fi
echo "--- importing it as $IMAGE"
tar -C "$rootfs" -c . | docker import "${changes[@]}" - "$IMAGE"
echo "--- built $IMAGE in ${SECONDS} s"
