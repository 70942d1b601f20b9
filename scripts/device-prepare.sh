#!/bin/sh
# device-prepare.sh - run HERE (the build machine): fills DEST (default
# /work/main/.device) with what scripts/device-run.sh needs on the GPU
# machine, which has no autotools, no Check and no network:
#   the `make dist` tarball, Debian's check/subunit/jansson/sleef packages,
#   the seed kernel (seed_mega.py), the scripts and the racecheck programs.
# Usage: scripts/device-prepare.sh [BUILD_DIR] [DEST]
# With BASE=DIR (a build directory of another commit), its `make dist`
# tarball goes to DEST/base/ for device-run.sh's A/B stage.
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
rm -rf "$dest/base"
if [ -n "${BASE:-}" ]; then
    mkdir -p "$dest/base"
    (cd "$BASE" && make dist >/dev/null)
    cp "$BASE"/hybrid-decode-*.tar.gz "$dest/base/"
fi
cp "$spec/seed_mega.py" "$dest/"
cp "$src/scripts/seed_bench.py" "$src/scripts/device-run.sh" "$src/scripts/racecheck-bulk.cu" \
    "$src/scripts/racecheck-gemv.cu" "$src/scripts/gemv-bench.cu" \
    "$src/scripts/barrier-bench.cu" "$dest/"
ls -la "$dest" "$dest/debs"
