#!/usr/bin/env bash
# Prepares what tests/test_container.py needs, once per machine (idempotent, ~2-4 min the
# first time, seconds afterwards):
#   1. a local Debian bookworm base image with Python (base images cannot be pulled from a
#      registry here): debootstrap --variant=minbase + podman import;
#   2. the proxy image built on it (Dockerfile, BASE_IMAGE=that base).
# Usage: scripts/ci-container.sh            (prints the image name on success)
# Env:   CG_BASE_IMAGE  name of the base image   (default localhost/coherence-guard-base:bookworm-2)
#        CG_IMAGE       name of the proxy image  (default localhost/coherence-guard:ci)
#        DEBIAN_MIRROR  (default http://deb.debian.org/debian)
set -euo pipefail
cd "$(dirname "$0")/.."

# Bump the tag when the base recipe below changes, so machines that keep images rebuild it.
BASE=${CG_BASE_IMAGE:-localhost/coherence-guard-base:bookworm-2}
IMAGE=${CG_IMAGE:-localhost/coherence-guard:ci}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PODMAN=(podman --runtime runc)

if ! "${PODMAN[@]}" image exists "$BASE"; then
    rootfs=$(mktemp -d /var/tmp/cg-rootfs.XXXXXX)
    trap 'rm -rf "$rootfs"' EXIT
    echo "ci-container: debootstrap bookworm (minbase + python3) into $rootfs" >&2
    nice debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        bookworm "$rootfs" "$MIRROR" >/tmp/cg-debootstrap.log 2>&1 \
        || { tail -20 /tmp/cg-debootstrap.log >&2; exit 1; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    # This machine's extra CAs (a TLS-intercepting egress proxy, say): the build installs from
    # PyPI and the base's pip (Debian's, 23.x) trusts only the bundle named by PIP_CERT.
    if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
        cp /usr/local/share/ca-certificates/*.crt "$rootfs"/usr/local/share/ca-certificates/
        chroot "$rootfs" update-ca-certificates >/dev/null 2>&1
    fi
    tar -C "$rootfs" -c . | "${PODMAN[@]}" import \
        --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' \
        --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' - "$BASE" >/dev/null
    rm -rf "$rootfs"
    trap - EXIT
fi

# Rebuilt every run (layer cache makes an unchanged tree cost seconds); --format docker keeps
# the HEALTHCHECK (the OCI image format has no field for it); --network host because the build
# installs the package from PyPI and rootful bridge networking may be unavailable in CI sandboxes.
echo "ci-container: building $IMAGE on $BASE" >&2
nice "${PODMAN[@]}" build --format docker --network host \
    --ulimit nofile=1024:1024 --ulimit nproc=1000:1000 \
    --build-arg BASE_IMAGE="$BASE" -t "$IMAGE" . >/tmp/cg-build.log 2>&1 \
    || { tail -30 /tmp/cg-build.log >&2; exit 1; }
echo "$IMAGE"
