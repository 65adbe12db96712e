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
storage=$(realpath -m "${IMAGES_STORAGE:?}")
version=${LLMBATCH_VERSION:?}
# runc: crun fails on cgroup v1 hosts; cgroupfs: no systemd; podman wants more open files than
# the default soft limit for its layer copies.
ulimit -n 4096
podman=(podman --root "$storage" --runroot "$storage.run" --runtime runc
        --cgroup-manager cgroupfs --events-backend file --storage-driver overlay)
ref=localhost/llm-batch-$name:$version

# Free space first: a build that fills the disk fails late with a podman error far from the cause.
# The CPU executor's build peaks at about 19 GB above what it leaves (measured; docs/images.md
# "Disk"): its storage copy of the 7.5 GB image and the layout being written, plus the steps'
# commits. The small images need well under 2 GB.
need_gb=$([ "$name" = executor-cpu ] && echo 20 || echo 2)
mkdir -p "$storage" "$(dirname "$out")"
for dir in "$storage" "$(dirname "$out")"; do
    free_gb=$(($(df --output=avail -B1 "$dir" | tail -1) / 1000000000))
    if [ "$free_gb" -lt "$need_gb" ]; then
        echo "images: building $name needs about $need_gb GB free on the disk of $dir; it has" \
             "$free_gb GB. Free some (or point CACHE at a larger disk) and run make again." >&2
        exit 1
    fi
done

# The storage is a cache that keeps only the imported base between builds. Podman records its
# own path in it, so a storage reached by another path (a moved or symlinked checkout) refuses
# every command: it is dropped and the base imported again (seconds).
if [ -d "$storage" ] && ! "${podman[@]}" image ls --quiet >/dev/null 2>&1; then
    echo "images: podman storage $storage unusable here ($("${podman[@]}" image ls 2>&1 | head -1)); starting it afresh"
    rm -rf "$storage" "$storage.run"
fi

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
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
# The operator and gateway export it as their build-info metric's revision label.
revision_arg=()
case $name in operator | gateway) revision_arg=(--build-arg LLMBATCH_REVISION="$revision") ;; esac
start=$(date +%s)
"${podman[@]}" build --quiet --pull=never --file "images/$name/Dockerfile" \
    --build-arg PYTHON_IMAGE="$base_ref" \
    --build-arg LLMBATCH_VERSION="$version" \
    --volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro \
    --volume "$uvconf:/etc/uv:ro" \
    "${revision_arg[@]}" \
    --label org.opencontainers.image.revision="$revision" \
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
