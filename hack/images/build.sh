#!/usr/bin/env bash
# Build one image of images/NAME/Dockerfile with podman (no daemon, no registry) on the local
# Debian base (hack/images/base.sh) and write it as an OCI image layout.
#
#   hack/images/build.sh NAME BASE_TAR OUT_DIR [podman build flags...]
#
# Env: IMAGES_STORAGE (podman's storage root, a cache), LLMBATCH_VERSION. The image is tagged
# localhost/llm-batch-NAME:LLMBATCH_VERSION in that storage and OUT_DIR is an OCI layout whose one
# manifest is named LLMBATCH_VERSION (`umoci unpack --image OUT_DIR:VERSION`, `skopeo copy
# oci:OUT_DIR:VERSION docker://...`).
set -euo pipefail
cd "$(dirname "$0")/../.."
name=$1 base_tar=$2 out=$3
shift 3
storage=${IMAGES_STORAGE:?}
version=${LLMBATCH_VERSION:?}
# runc: crun fails on cgroup v1 hosts; cgroupfs: no systemd; podman wants more open files than
# the default soft limit for its layer copies.
ulimit -n 4096
podman=(podman --root "$storage" --runroot "$storage.run" --runtime runc
        --cgroup-manager cgroupfs --events-backend file --storage-driver overlay)
ref=localhost/llm-batch-$name:$version

# The base is imported once per tarball: its tag names the tarball's digest.
base_ref=localhost/llmbatch-python-base:bookworm-$(sha256sum "$base_tar" | cut -c1-12)
if ! "${podman[@]}" image exists "$base_ref"; then
    start=$(date +%s)
    "${podman[@]}" import --quiet --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
        "$base_tar" "$base_ref" >/dev/null
    echo "images: base imported in $(($(date +%s) - start)) s"
fi

# The host's CA bundle is bound in for the RUN steps only (pip must trust a TLS-inspecting
# egress proxy where there is one); uv reads it through system-certs. Neither is in the image.
uvconf=$(mktemp -d)
trap 'rm -rf "$uvconf"' EXIT
printf 'system-certs = true\n' >"$uvconf/uv.toml"
start=$(date +%s)
"${podman[@]}" build --quiet --pull=never --file "images/$name/Dockerfile" \
    --build-arg PYTHON_IMAGE="$base_ref" \
    --build-arg LLMBATCH_VERSION="$version" \
    --volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro \
    --volume "$uvconf:/etc/uv:ro" \
    --label org.opencontainers.image.revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)" \
    --tag "$ref" "$@" . >/dev/null
built=$(($(date +%s) - start))

# Layers stay uncompressed (what the build stored): no minutes of gzip for the CPU executor's
# ~7 GB, and umoci unpacks them as they are. A push to a registry compresses them.
start=$(date +%s)
rm -rf "$out.partial"
skopeo copy --quiet --dest-oci-accept-uncompressed-layers \
    "containers-storage:[overlay@$storage+$storage.run]$ref" "oci:$out.partial:$version"
rm -rf "$out"
mv "$out.partial" "$out"
size=$("${podman[@]}" image inspect --format '{{.Size}}' "$ref")
echo "images: $name built in $built s, layout written in $(($(date +%s) - start)) s" \
     "($((size / 1000000)) MB unpacked, $(du -sm "$out" | cut -f1) MB in $out)"

# The layout is the result: the image and its build stages leave podman's storage (the CPU
# executor's would hold ~20 GB; its big step reruns whenever the package changes anyway). The
# base stays for the next build.
"${podman[@]}" rmi --force "$ref" >/dev/null
"${podman[@]}" image prune --force >/dev/null
