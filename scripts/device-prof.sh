#!/bin/bash
# device-prof.sh - Nsight Compute on one megakernel launch (E 16, context 0),
# from prebuilt libhd.so.0, hd-cuda.so, hd-run and the libjansson4 .deb
# copied beside it (see docs/PERF-CUDA.md); output under $OUT.
cd "$(dirname "$0")"
dpkg -x libjansson4_*.deb /tmp/j
export LD_LIBRARY_PATH=$PWD:/tmp/j/usr/lib/x86_64-linux-gnu HD_CUDA_MODULE=$PWD/hd-cuda.so
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
./hd-run --backend cuda --experts 16 --steps 2 -q || exit 1
timeout 80 $NCU --launch-skip 1 --launch-count 1 --section SpeedOfLight --section WarpStateStats \
  --section Occupancy --section LaunchStats --section SchedulerStats ./hd-run --backend cuda --experts 16 --steps 2 -q > $OUT/ncu.txt 2>&1
echo rc=$?
grep -vE "^==PROF==|^ *-+ *$" $OUT/ncu.txt | grep -E "Throughput|Duration|Issue|Stall|Warp Cycles|Eligible|Active Warps|Registers|Achieved|Executed Ipc|No Eligible|OPT|Local" | cut -c1-150 | head -60
