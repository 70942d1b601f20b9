#!/bin/sh
# device-prepare.sh - run HERE (the build machine): fills DEST (default
# /work/main/.device) with what scripts/device-run.sh needs on the GPU
# machine, which has no autotools, no Check and no network:
#   the `make dist` tarball, Debian's check/subunit/jansson/sleef packages,
#   the seed kernel (seed_mega.py) and the scripts.
# Usage: scripts/device-prepare.sh [BUILD_DIR] [DEST]
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-/tmp/build-cuda}
dest=${2:-/work/main/.device}
spec=${HD_SPEC_DIR:-$src/../shared/spec}
[ -d "$spec" ] || spec=/work/shared/spec

mkdir -p "$dest/debs"
(cd "$build" && make dist >/dev/null)
rm -f "$dest"/hybrid-decode-*.tar.gz
cp "$build"/hybrid-decode-*.tar.gz "$dest/"
if ! ls "$dest"/debs/check_*.deb "$dest"/debs/libsleef-dev_*.deb >/dev/null 2>&1; then
    apt-get update -qq
    (cd "$dest/debs" && apt-get download check libsubunit0 libsubunit-dev \
        libjansson4 libjansson-dev libsleef3 libsleef-dev)
fi
cp "$spec/seed_mega.py" "$dest/"
cp "$src/scripts/seed_bench.py" "$src/scripts/device-run.sh" "$dest/"
ls -la "$dest" "$dest/debs"
