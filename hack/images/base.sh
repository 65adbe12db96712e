#!/usr/bin/env bash
# A Python base image made locally from Debian packages (mmdebstrap), the stand-in for the
# public `python:<version>-slim-bookworm` when images are built here (no registry needed).
#
#   hack/images/base.sh OUT.tar
#
# Debian bookworm's python3 is 3.11.2, not the public tag's 3.11.x patch release; the images only
# need CPython 3.11 (pyproject's requires-python). Like the public image it has `python` (and
# pip, venv) on PATH and no EXTERNALLY-MANAGED marker, so the unchanged Dockerfiles' RUN steps
# work as written. The result is an uncompressed rootfs tarball for `podman import`. Unshare mode:
# the chroot's mounts live in a namespace of their own and vanish with it, even when killed.
set -euo pipefail
out=$1
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
tmp=$out.partial
# What Debian's own container images configure (and so the public python image): apt removes
# the .deb files and its package caches after each install, so `apt-get install` in a Dockerfile
# leaves no cache behind.
export docker_clean='DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";'
start=$(date +%s)
mmdebstrap --mode=unshare --variant=minbase --format=tar --quiet \
    --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates \
    --customize-hook='rm -f "$1"/usr/lib/python3.*/EXTERNALLY-MANAGED' \
    --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*' \
    --customize-hook='printf "%s\n" "$docker_clean" >"$1"/etc/apt/apt.conf.d/docker-clean' \
    "$suite" "$tmp" \
    "deb $mirror $suite main" "deb $mirror $suite-updates main" "deb $security $suite-security main"
mv "$tmp" "$out"
echo "images: base $(basename "$out") made in $(($(date +%s) - start)) s ($(du -m "$out" | cut -f1) MB)"
