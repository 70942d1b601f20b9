#!/bin/sh
# Tests of the hd-run tool.  Run by `make check` with HD_RUN set to the built
# tools/hd-run.  Exit status: 0 pass, 1 fail, 77 skip.
#
# HD_RUN_WRAPPER, when set, is a command put before every hd-run (split on
# blanks): tests/valgrind-all.sh runs each hd-run under memcheck that way.
# HD_TEST_SCALE=small runs 1 step where the full size runs 2.

if [ -z "${HD_RUN:-}" ] || [ ! -x "$HD_RUN" ]; then
    echo "test_hdrun: HD_RUN is not set to an executable hd-run; skipping" >&2
    exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_hdrun.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM

steps=2
case "${HD_TEST_SCALE:-}" in
    small) steps=1 ;;
    ''|full) ;;
    *) echo "test_hdrun: HD_TEST_SCALE='$HD_TEST_SCALE' is neither small nor full" >&2
       exit 1 ;;
esac
echo "test size: $([ "$steps" = 1 ] && echo small || echo full)"

failures=0
fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}
pass() {
    echo "ok: $*"
}

# run NAME ARGS...: runs hd-run, stdout to $tmp/NAME.out, stderr to
# $tmp/NAME.err, exit status in $rc.
run() {
    name=$1
    shift
    # shellcheck disable=SC2086
    ${HD_RUN_WRAPPER:-} "$HD_RUN" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
    rc=$?
}

# expect_rc NAME WANT DESCRIPTION
expect_rc() {
    if [ "$rc" -eq "$2" ]; then
        pass "$3"
    else
        fail "$3: exit status $rc, expected $2"
        sed 's/^/    /' "$tmp/$1.err" >&2
    fi
}

size_of() {
    if [ -f "$1" ]; then
        wc -c <"$1" | tr -d ' \t'
    else
        echo missing
    fi
}

expect_size() {
    got=$(size_of "$1")
    if [ "$got" = "$2" ]; then
        pass "$(basename "$1") has $2 bytes"
    else
        fail "$(basename "$1") has $got bytes, expected $2"
    fi
}

checksum_of() {
    sed -n 's/^summary: .*checksum=\([0-9a-f]*\)$/\1/p' "$tmp/$1.out"
}

summary_re='^summary: backend=[a-z]+ steps=[0-9]+ median_us=[0-9]+\.[0-9] tokens_per_s=[0-9]+\.[0-9] checksum=[0-9a-f]{16}$'

# ---- usage -------------------------------------------------------------
run help --help
expect_rc help 0 "--help exits 0"
grep -q -- '--steps' "$tmp/help.out" || fail "--help does not mention --steps"

run version --version
expect_rc version 0 "--version exits 0"

run badopt --no-such-option
expect_rc badopt 2 "an unknown option exits 2"
grep -q -- '--help' "$tmp/badopt.err" || fail "a usage error does not point to --help"

run backend --backend nosuch
if [ "$rc" -ne 0 ] && [ -s "$tmp/backend.err" ]; then
    pass "--backend nosuch fails with a message"
else
    fail "--backend nosuch: exit status $rc, stderr: $(cat "$tmp/backend.err")"
fi

for bad in -1 '' 3x ' 3' +3 99999999999999999999999; do
    run badnum --steps "$bad"
    expect_rc badnum 2 "--steps '$bad' is rejected"
done
run badexp --experts 7
expect_rc badexp 2 "--experts 7 is rejected"
run badpat --pattern KXM
expect_rc badpat 2 "--pattern KXM is rejected"
run badsyn --synth 4294967296
expect_rc badsyn 2 "--synth 2^32 is rejected"
run conflict --model "$tmp/none.safetensors" --experts 8
expect_rc conflict 2 "--model with --experts is rejected"
run extra --steps 1 stray
expect_rc extra 2 "a stray argument is rejected"
run nofile --model "$tmp/none.safetensors" --backend ref --steps 1
expect_rc nofile 1 "a missing model file exits 1"
grep -q '^hd-run: ' "$tmp/nofile.err" || fail "a missing model file gives no message"

# ---- runs on the reference backend (E = 8) ------------------------------
base="--synth 1 --experts 8 --backend ref"

# shellcheck disable=SC2086
run r1 $base --steps $steps --dump-out "$tmp/out1.bf16"
expect_rc r1 0 "$steps reference step(s)"
if grep -Eq "$summary_re" "$tmp/r1.out"; then
    pass "the summary line has the documented form"
else
    fail "no well-formed summary line in: $(cat "$tmp/r1.out")"
fi
grep -q "^summary: backend=ref steps=$steps " "$tmp/r1.out" ||
    fail "the summary does not name backend=ref steps=$steps"
expect_size "$tmp/out1.bf16" $((steps * 2304 * 2))
sum1=$(checksum_of r1)
[ -n "$sum1" ] || fail "no checksum in the first run"

# The same run again, also saving the model: same checksum.
# shellcheck disable=SC2086
run r2 $base --steps $steps --save-model "$tmp/m.safetensors" --dump-out "$tmp/out2.bf16"
expect_rc r2 0 "$steps reference step(s) with --save-model"
sum2=$(checksum_of r2)
if [ -n "$sum1" ] && [ "$sum1" = "$sum2" ]; then
    pass "the same run gives the same checksum"
else
    fail "checksums differ between identical runs: '$sum1' '$sum2'"
fi
cmp -s "$tmp/out1.bf16" "$tmp/out2.bf16" || fail "--dump-out files of identical runs differ"
[ -s "$tmp/m.safetensors" ] || fail "--save-model wrote no file"

# The saved model, loaded back: same checksum.
run r3 --model "$tmp/m.safetensors" --backend ref --steps $steps --quiet
expect_rc r3 0 "$steps reference step(s) of the saved model"
sum3=$(checksum_of r3)
if [ -n "$sum1" ] && [ "$sum1" = "$sum3" ]; then
    pass "the saved model gives the checksum of the synth model"
else
    fail "checksum of the saved model '$sum3' differs from the synth model '$sum1'"
fi
lines=$(wc -l <"$tmp/r3.out" | tr -d ' \t')
[ "$lines" = 1 ] || fail "--quiet printed $lines lines, expected 1"

# The state after context 3 + the steps.
# shellcheck disable=SC2086
run r4 $base --context 3 --steps $steps --dump-state "$tmp/state" --quiet
expect_rc r4 0 "--context 3 --steps $steps --dump-state"
expect_size "$tmp/state/S.f32" $((3 * 32 * 128 * 128 * 4))
expect_size "$tmp/state/conv.bf16" $((3 * 3 * 3 * 4096 * 2))
expect_size "$tmp/state/c_kv.bf16" $(((3 + steps) * 512 * 2))
expect_size "$tmp/state/k_rope.bf16" $(((3 + steps) * 64 * 2))

# --check of the reference against itself: error exactly 0.
# shellcheck disable=SC2086
run r5 $base --steps $steps --check
expect_rc r5 0 "--check --backend ref passes"
if grep -q 'max_rel_err=0\.000e+00' "$tmp/r5.out" &&
   [ "$(grep -c 'rel_err=0\.000e+00' "$tmp/r5.out")" -eq $((steps + 1)) ]; then
    pass "--check reports error 0 for ref against ref"
else
    fail "--check does not report error 0: $(cat "$tmp/r5.out")"
fi
sum5=$(checksum_of r5)
[ "$sum1" = "$sum5" ] || fail "--check changed the checksum: '$sum5' vs '$sum1'"

# No steps: only the summary, with zero timings and the empty checksum.
# shellcheck disable=SC2086
run r6 $base --steps 0 --quiet
expect_rc r6 0 "--steps 0"
grep -q '^summary: backend=ref steps=0 median_us=0\.0 tokens_per_s=0\.0 checksum=cbf29ce484222325$' \
    "$tmp/r6.out" || fail "--steps 0 summary: $(cat "$tmp/r6.out")"

if [ "$failures" -ne 0 ]; then
    echo "test_hdrun: $failures failure(s)" >&2
    exit 1
fi
echo "test_hdrun: all passed"
exit 0
