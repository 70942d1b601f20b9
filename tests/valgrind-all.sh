#!/bin/sh
# valgrind-all.sh - run test suites under valgrind memcheck: no invalid
# access, no use of an uninitialised value, no definite or possible leak.
#
# Usage, from the build directory once the test programs are built (`make
# check-valgrind` does both):
#     tests/valgrind-all.sh [TEST...]
# TEST is a test program as `make check` names it (tests/test_api,
# fuzz/replay_load) or tests/test_hdrun.sh, whose hd-run runs are each put
# under memcheck; without TEST, every suite of `make check`, one at a time.
#
# The suites run at their small size (HD_TEST_SCALE=small unless set: fewer
# steps, contexts and experts, every code path kept; tests/testutil.h) and
# with CK_FORK=no, so memcheck follows the tests themselves.  Each suite's
# output goes to valgrind-<name>.log in the current directory (hd-run's
# memcheck reports to valgrind-test_hdrun.<pid>.vg).  Exit status: 0 when
# every suite passed or skipped, 1 otherwise.
#
# Environment: VALGRIND (default valgrind), VALGRIND_OPTS (added to the
# options below), HD_TEST_SCALE, OMP_WAIT_POLICY (default passive).

srcdir=$(cd "$(dirname "$0")/.." && pwd) || exit 1
builddir=$(pwd)
if [ ! -x "$builddir/libtool" ]; then
    echo "valgrind-all.sh: run me from the build directory (no ./libtool here)" >&2
    exit 1
fi
valgrind=${VALGRIND:-valgrind}
if ! command -v "$valgrind" >/dev/null 2>&1; then
    echo "valgrind-all.sh: $valgrind is not installed" >&2
    exit 1
fi

if [ $# -eq 0 ]; then
    tests=$(${MAKE:-make} -s print-tests) || exit 1
    # shellcheck disable=SC2086
    set -- $tests
fi

vg_opts="-q --leak-check=full --errors-for-leak-kinds=definite,possible
    --show-leak-kinds=definite,possible --num-callers=30
    --suppressions=$srcdir/tests/valgrind.supp ${VALGRIND_OPTS:-}"

HD_TEST_SCALE=${HD_TEST_SCALE:-small}
CK_FORK=no
HD_TEST_SLOW=1
HD_TEST_DATA=$srcdir/tests/data
HD_FUZZ_CORPUS=$srcdir/fuzz/corpus
HD_RUN=$builddir/tools/hd-run
export HD_TEST_SCALE CK_FORK HD_TEST_SLOW HD_TEST_DATA HD_FUZZ_CORPUS HD_RUN
# valgrind runs one thread at a time: OpenMP threads that spin while they
# wait at a barrier would only burn the time slices of the thread they wait
# for.  Passive waiting changes no result.
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export OMP_WAIT_POLICY
# As `make check` does: the CUDA module of this build, if it has one.
if [ -f "$builddir/.libs/hd-cuda.so" ]; then
    HD_CUDA_MODULE=$builddir/.libs/hd-cuda.so
    export HD_CUDA_MODULE
fi

passed=0 failed=0 skipped=0
all_start=$(date +%s)
for t in "$@"; do
    name=$(basename "$t")
    log=$builddir/valgrind-${name%.sh}.log
    start=$(date +%s)
    case $t in
    *.sh)
        # Every hd-run the script starts runs under memcheck, reporting to
        # its own file; the suite passes when the script does and every
        # report is empty (-q: memcheck prints only what it finds).
        rm -f "$builddir/valgrind-${name%.sh}".*.vg
        # shellcheck disable=SC2086
        HD_RUN_WRAPPER="$builddir/libtool --mode=execute $valgrind $vg_opts
            --error-exitcode=99
            --log-file=$builddir/valgrind-${name%.sh}.%p.vg" \
            sh "$srcdir/$t" >"$log" 2>&1
        rc=$?
        reports=0
        for f in "$builddir/valgrind-${name%.sh}".*.vg; do
            [ -f "$f" ] || continue
            if [ -s "$f" ]; then
                reports=$((reports + 1))
                { echo "== memcheck report $f:"; cat "$f"; } >>"$log"
            fi
            rm -f "$f"
        done
        [ $rc -eq 0 ] && [ $reports -ne 0 ] && rc=1
        ;;
    *)
        if [ ! -x "$builddir/$t" ]; then
            echo "valgrind-all.sh: $t is not built (make check builds it)" >>"$log"
            rc=1
        else
            # shellcheck disable=SC2086
            "$builddir/libtool" --mode=execute "$valgrind" $vg_opts \
                --error-exitcode=1 "$builddir/$t" >"$log" 2>&1
            rc=$?
        fi
        ;;
    esac
    secs=$(($(date +%s) - start))
    case $rc in
    0) passed=$((passed + 1)); echo "PASS: $t ($secs s)" ;;
    77) skipped=$((skipped + 1)); echo "SKIP: $t ($secs s)" ;;
    *) failed=$((failed + 1)); echo "FAIL: $t ($secs s, exit $rc; see $log)"
       tail -n 40 "$log" ;;
    esac
done
echo "valgrind memcheck ($HD_TEST_SCALE size): $passed passed, $failed failed," \
     "$skipped skipped, $(($(date +%s) - all_start)) s"
[ $failed -eq 0 ]
