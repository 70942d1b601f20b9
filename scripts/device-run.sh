#!/bin/bash
# device-run.sh - run THERE (the GPU machine), from the directory that holds
# what scripts/device-prepare.sh made (.device/):
#   unpack the .debs into /tmp/deps, build the dist tarball, then the stages
#   asked for, in order:
#     check     make check (the CUDA tests must pass, not skip)
#     golden    test_cuda's golden case alone, and E 256 against the reference
#     quick     hd-run --check against the reference, E 16, two contexts
#     sanitize  compute-sanitizer memcheck and racecheck on a short run
#     bench     our step time at E 256, contexts 0 / 4096 / 32768
#     seed      the seed's Triton kernel, same contexts (CUDA events)
#     trace     per-CTA trace of layer 0 and the GEMV ring of CTA 5
#               (HD_CUDA_TRACE=N for N in TRACE_CALLS; 0: no ring), context 4096,
#               with each setting of TRACE_ENVS
#     prof      Nsight Compute warp sampling per SASS instruction, one step
#     rcrepro   racecheck on scripts/racecheck-bulk.cu's ten ways of
#               refilling a bulk-copy buffer (is a report the tool's?),
#               and on the GEMV ring alone (racecheck-gemv.cu)
#     sass      the module's SASS (cuobjdump), for instruction counts
#     abvar     module variants of this tarball (AB_VARS: name:NVCCFLAGS)
#               against ours: checksums, a check, alternating bench_cuda
#     gemvbench the GEMV alone (scripts/gemv-bench.cu) on every SM, weights
#               from DRAM: the unit loop's unroll (GEMV_UNROLL), forced
#               splits, bf16 and fp32 x, one-block calls
#     buildvar  build the module variants of AB_VARS only (for abenv), begun
#               beside our own build when the tarball is new
#     barbench  grid barrier with bulk copies in flight (barrier-bench.cu)
#     abenv     settings of ours (AB_ENVS: name:VAR=value) against each
#               other: checksums, a check, alternating bench_cuda
#     primedbg  a module built with -DHDC_PRIME_DEBUG (gemv_run prints,
#               on CTAs 0-2, whether a primed ring matched its call), run
#               one step with HD_CUDA_LATE_PRIME=1, 4, 8 and HD_CUDA_PRIME=1
#     ab        A/B on this machine: the module of another dist tarball
#               (base/, from device-prepare.sh's BASE) built beside ours,
#               then bench_cuda alternating between the two modules,
#               AB_ROUNDS (3) times each, at the contexts AB_CTX
# Logs go to $OUT (as logs.tgz at the end); a summary table is printed last.
# Usage: .device/device-run.sh STAGE...
set -u
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
summary=$OUT/summary.txt
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
# configure the unpacked dist tree $1 in the current directory against the
# unpacked .debs (further arguments go to configure)
deps_configure() {
    local src=$1
    shift
    "$src"/configure CPPFLAGS="-I$deps/usr/include -I$deps/usr/include/x86_64-linux-gnu" \
        LDFLAGS="-L$deps/usr/lib/x86_64-linux-gnu" "$@"
}
# the module of this tarball built with NVCCFLAGS $2 in /tmp/hd-var-$1
# (make -j$3), unless that directory holds one of this tarball and these
# flags already (abvar and primedbg share the dbg variant); logs
# $OUT/var-$1-*.log
build_variant() {
    local d=/tmp/hd-var-$1
    [ "$(cat $d/.tarball-md5 2>/dev/null)" = "$sum $2" ] && [ -f $d/.libs/hd-cuda.so ] && return 0
    (rm -rf $d && mkdir -p $d && cd $d &&
        deps_configure "$(ls -d /tmp/hd-src/hybrid-decode-*)" >"$OUT/var-$1-configure.log" 2>&1 &&
        make -j$3 hd-cuda.la NVCCFLAGS="$2" >"$OUT/var-$1-build.log" 2>&1 &&
        echo "$sum $2" >$d/.tarball-md5)
}
# build_variant for each of AB_VARS (name:NVCCFLAGS, + for a space) in
# the background, make -j$1 each
start_variants() {
    local v fl
    for v in ${AB_VARS:-}; do
        fl=${v#*:}
        (build_variant "${v%%:*}" "${fl//+/ }" $1 || note "variant ${v%%:*}: build failed") &
    done
}
# hd-run with the environment settings $4 (VAR=value ...): the checksum
# of 4 steps (E 256, context 300) and an E 16 check against the reference,
# logged as $OUT/$1-$3-run.log and -check.log, summed up as "$2 $3: ..."
run_checks() {
    local cs
    env $4 timeout 120 $run --backend cuda --experts 256 --context 300 --steps 4 -q \
        >"$OUT/$1-$3-run.log" 2>&1
    cs=$(grep -o 'checksum=[0-9a-f]*' "$OUT/$1-$3-run.log")
    env $4 timeout 120 $run --backend cuda --experts 16 --context 100 --steps 3 --check \
        >"$OUT/$1-$3-check.log" 2>&1
    note "$2 $3: $cs check rc=$? $(tail -1 "$OUT/$1-$3-check.log")"
}
# bench_cuda's figures in log $1 as "context:median_us ..."
bench_pairs() {
    grep -E '^bench' "$1" | sed -E 's/.*context=([0-9]+).*median_us=([0-9.]+).*/\1:\2/' | tr '\n' ' '
}
# bench_cuda (E 256, 20 steps, the contexts AB_CTX) with each of
# "name:what ..." in turn, $1 rounds, where what is a module's path or
# environment settings for ours (VAR=value, + joining several; a setting
# HD_CUDA_MODULE=path there runs that module instead, such as a variant
# that the buildvar stage made, /tmp/hd-var-NAME/.libs/hd-cuda.so); logs
# $OUT/$2-name-round.log, and a summary line "$2 name round: context:median_us ..."
alternate() {
    local rounds=$1 tag=$2 r m mod envs
    shift 2
    for r in $(seq "$rounds"); do
        for m in "$@"; do
            mod=${m#*:} envs=
            case $mod in *=*) envs=${mod//+/ } mod=$b/.libs/hd-cuda.so ;; esac
            env HD_CUDA_MODULE=$mod $envs LD_LIBRARY_PATH=$ld_b timeout 60 $b/tests/.libs/bench_cuda 256 20 cuda \
                ${AB_CTX:-0 4096 32768} >"$OUT/$tag-${m%%:*}-$r.log" 2>&1
            note "$tag ${m%%:*} $r: $(bench_pairs "$OUT/$tag-${m%%:*}-$r.log")"
        done
    done
}

deps=/tmp/deps
if [ ! -d $deps/usr ]; then
    for f in "$here"/debs/*.deb; do dpkg -x "$f" $deps; done
    sed -i -e "s|^prefix=/usr|prefix=$deps/usr|" -e "s|^libdir=/usr|libdir=$deps/usr|" \
        -e "s|^includedir=/usr|includedir=$deps/usr|" $deps/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc
fi
export PKG_CONFIG_PATH=$deps/usr/lib/x86_64-linux-gnu/pkgconfig
export LD_LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$PATH:/usr/local/cuda/bin
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$summary"

b=/tmp/hd-build
# A machine kept warm between calls still has the last build: rebuild when
# the tarball is not the one that build came from.
sum=$(cat "$here"/hybrid-decode-*.tar.gz | md5sum | cut -d' ' -f1)
if [ "$(cat $b/.tarball-md5 2>/dev/null)" != "$sum" ]; then
    rm -rf $b
fi
if [ ! -x $b/tools/.libs/hd-run ] && [ ! -x $b/tools/hd-run ]; then
    rm -rf /tmp/hd-src && mkdir -p /tmp/hd-src && tar xzf "$here"/hybrid-decode-*.tar.gz -C /tmp/hd-src
    srcdir=$(ls -d /tmp/hd-src/hybrid-decode-*)
    # With buildvar among the stages, AB_VARS's variants build beside
    # ours (the module's mega.cu is the long pole of each build, so a
    # call with variants takes about one build's time instead of two)
    case " $* " in *" buildvar "*) start_variants 4 ;; esac
    mkdir -p $b && cd $b
    deps_configure "$srcdir" >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
    grep -A14 "hybrid-decode 0" "$OUT/configure.log" | grep -i "cuda\|check"
    make -j16 >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
    make -j16 tests/bench_cuda >>"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
    echo "$sum" >$b/.tarball-md5
fi
cd $b
export HD_CUDA_MODULE=$b/.libs/hd-cuda.so
run=$b/tools/hd-run
ld_b="$b/.libs:$LD_LIBRARY_PATH"

# CHECK_MODULE=path: check, golden and sanitize run that module (a
# variant that buildvar made, /tmp/hd-var-NAME/.libs/hd-cuda.so), not ours
check_env=()
if [ -n "${CHECK_MODULE:-}" ]; then
    check_env=(HD_CUDA_TESTS_ENV="HD_CUDA_MODULE=$CHECK_MODULE; export HD_CUDA_MODULE;")
    note "check, golden, sanitize: module $CHECK_MODULE"
fi
for stage in "$@"; do
    t0=$(date +%s)
    case $stage in
    check)
        # The other suites passed here before; the CUDA suite is the one
        # that needs this machine.
        timeout 400 make -j16 check TESTS="${CHECK_TESTS:-tests/test_cuda}" "${check_env[@]}" \
            >"$OUT/check.log" 2>&1
        rc=$?
        cp tests/test_cuda.log "$OUT/test_cuda.log" 2>/dev/null
        grep -E "^(PASS|FAIL|SKIP|ERROR):" "$OUT/check.log" | tee -a "$summary"
        grep -E "golden .: output max|Checks|:F:|:E:" tests/test_cuda.log | tail -12 | tee -a "$summary"
        note "check rc=$rc"
        ;;
    quick)
        for c in 0 100; do
            timeout 60 $run --backend cuda --experts 16 --context $c --steps 3 --check 2>&1 | tail -5 | tee -a "$summary"
        done
        ;;
    golden)
        # the short form of check: test_cuda's golden case (golden A and B,
        # determinism, import/export, non-finite input) and one E 256 run
        # against the reference
        CK_RUN_CASE=golden timeout 300 make -j16 check TESTS=tests/test_cuda "${check_env[@]}" \
            >"$OUT/check.log" 2>&1
        rc=$?
        cp tests/test_cuda.log "$OUT/test_cuda.log" 2>/dev/null
        grep -E "^(PASS|FAIL|SKIP|ERROR):" "$OUT/check.log" | tee -a "$summary"
        grep -E "golden .: output max|Checks|:F:|:E:" tests/test_cuda.log | tail -12 | tee -a "$summary"
        note "golden rc=$rc"
        env ${CHECK_MODULE:+HD_CUDA_MODULE=$CHECK_MODULE} timeout 120 $run --backend cuda --experts 256 \
            --context 100 --steps 2 --check 2>&1 | tail -3 | tee -a "$summary"
        ;;
    sanitize)
        for tool in memcheck racecheck; do
            env ${CHECK_MODULE:+HD_CUDA_MODULE=$CHECK_MODULE} LD_LIBRARY_PATH=$ld_b \
                timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 \
                $b/tools/.libs/hd-run --backend cuda --experts 16 --context 40 --steps 2 -q \
                >"$OUT/sanitize-$tool.log" 2>&1
            note "compute-sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize-$tool.log" | head -2 | tr '\n' ' ')"
        done
        ;;
    bench)
        LD_LIBRARY_PATH=$ld_b timeout 120 $b/tests/.libs/bench_cuda 256 40 cuda 0 4096 32768 \
            >"$OUT/bench.log" 2>&1
        grep -E "^bench|^info" "$OUT/bench.log" | tee -a "$summary"
        grep -E "^phases|^step" "$OUT/bench.log"
        # BENCH_SPLITS="2 4 8": the same at context 4096 with every GEMV
        # forced to that many warps a block (HD_CUDA_SPLIT)
        for sp in ${BENCH_SPLITS:-}; do
            HD_CUDA_SPLIT=$sp LD_LIBRARY_PATH=$ld_b timeout 60 $b/tests/.libs/bench_cuda 256 20 cuda 4096 \
                >"$OUT/bench-split$sp.log" 2>&1
            echo "HD_CUDA_SPLIT=$sp: $(grep -E '^bench' "$OUT/bench-split$sp.log")" | tee -a "$summary"
            grep "^phases" "$OUT/bench-split$sp.log"
        done
        # BENCH_ENVS="HD_CUDA_PRIME=1 HD_CUDA_PREFETCH=1": the same at
        # context 4096 with each switch set (a + joins several: A=1+B=1)
        for ev in ${BENCH_ENVS:-}; do
            env ${ev//+/ } LD_LIBRARY_PATH=$ld_b timeout 60 $b/tests/.libs/bench_cuda 256 20 cuda 4096 \
                >"$OUT/bench-$ev.log" 2>&1
            echo "$ev: $(grep -E '^bench' "$OUT/bench-$ev.log")" | tee -a "$summary"
            grep -E "^phases|^step" "$OUT/bench-$ev.log"
        done
        ;;
    trace)
        # HD_CUDA_TRACE=N: the ring events of CTA 5's N-th GEMV call
        # (layer 0: 1 projections, 3 router, 4 experts, 5 down), at context
        # TRACE_CTX (4096 unless set); N = 0: the CTAs' points alone, CTA 5
        # not slowed by recording the ring's events
        # TRACE_ENVS (name:VAR=value, + joining several; "main:" unless
        # set): the same with each setting, e.g. a variant's module
        : >"$OUT/trace.log"
        for te in ${TRACE_ENVS:-main:}; do
            tev=${te#*:}
            for n in ${TRACE_CALLS:-0 1 5}; do
                echo "== trace ${te%%:*} HD_CUDA_TRACE=$n" >>"$OUT/trace.log"
                env ${tev//+/ } HD_CUDA_TRACE=$n LD_LIBRARY_PATH=$ld_b timeout 60 \
                    $b/tests/.libs/bench_cuda 256 5 cuda ${TRACE_CTX:-4096} >>"$OUT/trace.log" 2>&1
            done
        done
        grep -E "^== trace|^bench|^phases|^trace|^gemv" "$OUT/trace.log"
        ;;
    prof)
        # Nsight Compute on one step (E 256, context 4096): warp-state
        # sampling per SASS instruction, exported as CSV
        ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
        LD_LIBRARY_PATH=$ld_b timeout 240 $ncu --clock-control none -k hd_mega --launch-skip 3 \
            --launch-count 1 --section SourceCounters --section WarpStateStats \
            --section SpeedOfLight -f -o /tmp/prof $b/tools/.libs/hd-run --backend cuda \
            --experts 256 --context 4096 --steps 6 -q >"$OUT/prof.log" 2>&1
        note "ncu rc=$?"
        $ncu --import /tmp/prof.ncu-rep --page source --csv --print-source sass \
            >"$OUT/sass.csv" 2>>"$OUT/prof.log"
        $ncu --import /tmp/prof.ncu-rep --page details >"$OUT/details.txt" 2>>"$OUT/prof.log"
        ls -la "$OUT/sass.csv"; grep -E "Duration|Stall|Warp Cycles|Issued" "$OUT/details.txt" | head -20
        ;;
    rcrepro)
        nvcc -gencode arch=compute_90a,code=sm_90a -o /tmp/rc "$here/racecheck-bulk.cu" \
            >"$OUT/rcrepro.log" 2>&1
        for m in 0 1 2 3 4 5 6 7 8 9; do
            timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 /tmp/rc $m \
                >>"$OUT/rcrepro.log" 2>&1
            note "racecheck mode $m: rc=$? $(grep -E '^(ok|BAD)|RACECHECK SUMMARY' "$OUT/rcrepro.log" | tail -2 | tr '\n' ' ')"
        done
        # the module's own GEMV ring in a one-CTA kernel (racecheck-gemv.cu)
        nvcc -gencode arch=compute_90a,code=sm_90a -std=c++17 \
            -I"$(ls -d /tmp/hd-src/hybrid-decode-*)/src/cuda" -o /tmp/rg "$here/racecheck-gemv.cu" \
            >"$OUT/rcgemv.log" 2>&1
        for m in 0 1 2 3 4; do
            timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 /tmp/rg $m \
                >>"$OUT/rcgemv.log" 2>&1
            note "racecheck gemv mode $m: rc=$? $(grep -E '^done|RACECHECK SUMMARY' "$OUT/rcgemv.log" | tail -2 | tr '\n' ' ')"
        done
        ;;
    gemvbench)
        src=$(ls -d /tmp/hd-src/hybrid-decode-*)/src/cuda
        for v in u2:-DGEMV_UNROLL=2 u1:-DGEMV_UNROLL=1 u4:-DGEMV_UNROLL=4; do
            fl=${v#*:}
            nvcc -gencode arch=compute_90a,code=sm_90a -std=c++17 -I"$src" ${fl//+/ } -o /tmp/gb-${v%%:*} \
                "$here/gemv-bench.cu" >"$OUT/gemvbench-build-${v%%:*}.log" 2>&1 &
        done
        wait
        : >"$OUT/gemvbench.log"
        for v in u2 u1 u4; do
            for shape in "2304 8 1" "4096 2 1" "1024 8 3" "2304 1 1" "4096 8 1"; do
                timeout 60 /tmp/gb-$v $shape 0 >>"$OUT/gemvbench.log" 2>&1
            done
        done
        for sp in 1 2 4 8 16; do
            timeout 60 /tmp/gb-u2 2304 8 1 $sp >>"$OUT/gemvbench.log" 2>&1
            timeout 60 /tmp/gb-u2 1024 8 3 $sp >>"$OUT/gemvbench.log" 2>&1
        done
        cat "$OUT/gemvbench.log" | tee -a "$summary"
        for v in u2; do cuobjdump -sass /tmp/gb-$v >"$OUT/gemvbench-$v.sass" 2>&1; done
        ;;
    abvar)
        # module variants built from this tarball with NVCCFLAGS (AB_VARS,
        # name:flags, + for a space), then for each the checksum of 4 steps
        # (E 256, context 300: the same bits as ours expected), an E 16
        # check against the reference, and bench_cuda alternating with
        # ours, AB_ROUNDS (2) times, at the contexts AB_CTX
        vars=${AB_VARS:-u4:-DGEMV_UNROLL=4 u1:-DGEMV_UNROLL=1}
        for v in $vars; do
            fl=${v#*:}
            build_variant "${v%%:*}" "${fl//+/ }" 4 &
        done
        wait
        mods="ours:$b/.libs/hd-cuda.so"
        for v in $vars; do
            n=${v%%:*}
            [ -f /tmp/hd-var-$n/.libs/hd-cuda.so ] || { note "variant $n: build failed"; continue; }
            mods="$mods $n:/tmp/hd-var-$n/.libs/hd-cuda.so"
        done
        for m in $mods; do
            run_checks var variant "${m%%:*}" "HD_CUDA_MODULE=${m#*:}"
        done
        alternate ${AB_ROUNDS:-2} abvar $mods
        ;;
    buildvar)
        # the module variants of AB_VARS (name:flags, + for a space) built
        # into /tmp/hd-var-NAME, for abenv settings that name them: those
        # that began beside our build are waited for; build_variant skips
        # a variant already built from this tarball with these flags
        : "${AB_VARS:?AB_VARS names the variants}"
        wait
        start_variants 6
        wait
        ;;
    barbench)
        # does the grid barrier's release wait for bulk copies in flight
        # (scripts/barrier-bench.cu)?  Modes BAR_MODES (0-6), 1 and 5
        # blocks of 20 KB
        nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a \
            -I"$(ls -d /tmp/hd-src/hybrid-decode-*)/src/cuda" -o /tmp/barbench "$here/barrier-bench.cu" \
            >"$OUT/barbench.log" 2>&1 || { note "barbench: build failed"; continue; }
        for nb in 1 5; do
            for m in ${BAR_MODES:-0 1 2 3 4 5 6}; do
                timeout 60 /tmp/barbench $m $nb 2000 2>&1 | tee -a "$OUT/barbench.log" "$summary"
            done
        done
        ;;
    abenv)
        # settings of ours (AB_ENVS: name:VAR=value, + joining several):
        # for each the checksum of 4 steps (E 256, context 300), an E 16
        # check against the reference, then bench_cuda alternating between
        # them, AB_ROUNDS (2) times, at the contexts AB_CTX
        for v in ${AB_ENVS:?AB_ENVS names the settings}; do
            ev=${v#*:}
            run_checks env setting "${v%%:*}" "${ev//+/ }"
        done
        alternate ${AB_ROUNDS:-2} abenv $AB_ENVS
        ;;
    primedbg)
        build_variant dbg -DHDC_PRIME_DEBUG 16 || { note "primedbg: build failed"; continue; }
        for ev in HD_CUDA_LATE_PRIME=1 HD_CUDA_LATE_PRIME=4 HD_CUDA_LATE_PRIME=8 HD_CUDA_PRIME=1; do
            note "== $ev"
            env $ev HD_CUDA_MODULE=/tmp/hd-var-dbg/.libs/hd-cuda.so timeout 60 $run --backend cuda \
                --experts 16 --context 10 --steps 1 -q 2>&1 | grep '^prime' | sort | uniq -c |
                head -20 | tee -a "$summary"
        done
        ;;
    sass)
        cuobjdump -sass $b/.libs/hd-cuda.so >"$OUT/module.sass" 2>&1
        note "sass rc=$? lines $(wc -l <"$OUT/module.sass")"
        ;;
    ab)
        bb=/tmp/hd-base
        if [ ! -f $bb/.libs/hd-cuda.so ]; then
            rm -rf /tmp/hd-base-src $bb && mkdir -p /tmp/hd-base-src $bb
            tar xzf "$here"/base/hybrid-decode-*.tar.gz -C /tmp/hd-base-src
            (cd $bb && deps_configure "$(ls -d /tmp/hd-base-src/hybrid-decode-*)" \
                >"$OUT/base-configure.log" 2>&1 &&
                make -j16 hd-cuda.la >"$OUT/base-build.log" 2>&1) || { tail -20 "$OUT/base-build.log"; continue; }
        fi
        alternate ${AB_ROUNDS:-3} ab new:$b/.libs/hd-cuda.so base:$bb/.libs/hd-cuda.so
        ;;
    seed)
        PYTHONUNBUFFERED=1 timeout 300 python3 "$here/seed_bench.py" "$here" 256 40 0 4096 32768 \
            >"$OUT/seed.log" 2>&1
        grep "^seed" "$OUT/seed.log" | tee -a "$summary" || tail -20 "$OUT/seed.log"
        ;;
    esac
    echo "[stage $stage: $(( $(date +%s) - t0 )) s]" | tee -a "$summary"
done
# The device tool returns at most 8 files: everything but the summary
# travels as one archive.
(cd "$OUT" && ls | grep -v '^summary.txt$' | grep -v '^logs.tgz$' >/tmp/logs.list &&
    tar czf logs.tgz -T /tmp/logs.list && xargs rm -f </tmp/logs.list)
echo "===== SUMMARY ====="
cat "$summary"
