/* test_cpu.c - the CPU backend against the reference backend (not against
 * itself): random synthetic models over several seeds, E, patterns and MLA
 * contexts, every step's output and the final state compared with the
 * tolerances of SEMANTICS.md, on each instruction-set path this CPU runs
 * (HD_CPU_ISA) and with 1 and 2 threads; then golden cases A and B through
 * the CPU backend.  The measured maxima are printed for the docs.
 *
 * At the small size (tu_small: valgrind, where a step of the CPU backend
 * takes seconds) each configuration runs fewer steps on some of the (path,
 * threads) pairs, chosen so that every pair still meets each layer kind,
 * E > 8 and a long context, and the context sweep keeps one context per
 * branch of the token split; golden B runs on one pair and golden A and
 * the E 64 configuration not at all (golden B is KKKM at E 64).
 * Exits 77 (skip) when the CPU backend is not part of the build. */
#include "config.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#ifdef HD_HAVE_CPU_BACKEND
#include "cpu/cpu.h"
#include "util.h"
#endif

#define TOL_OUT 1e-2
#define TOL_S 1e-2
#define TOL_CACHE 5e-3

#define N_ISA 5
static const char *const ISA[N_ISA] = { "portable", "avx2", "avx512", "avx512bf16", "amx" };
static int isa_ok[N_ISA];

/* Sets of (path, threads) pairs, threads 1 or 2. */
#define PAIR(isa, threads) (1u << ((isa) * 2 + (threads) - 1))
#define ALL_PAIRS 0x3ffu
#define TWO_THREADS (PAIR(0, 2) | PAIR(1, 2) | PAIR(2, 2) | PAIR(3, 2) | PAIR(4, 2))

/* The size of one configuration: steps and pairs, full and small (no pair
 * at the small size: not run). */
typedef struct cfg_size {
    int steps, small_steps;
    unsigned small_pairs;
} cfg_size;

/* Largest errors seen, per tensor class, over the whole run. */
static double worst_out, worst_s, worst_conv, worst_ckv, worst_kr;

static hd_model *synth_cpu(uint32_t seed, int experts, const char *pattern,
                           int isa, int threads)
{
    hd_options o;
    hd_model *m = NULL;
    char err[256] = "";
    setenv("HD_CPU_ISA", ISA[isa], 1);
    hd_options_init(&o);
    o.backend = HD_BACKEND_CPU;
    o.threads = threads;
    hd_status st = hd_model_synth(seed, experts, pattern, &o, &m, err, sizeof err);
    unsetenv("HD_CPU_ISA");
    ck_assert_msg(st == HD_OK, "cpu model (%s, %d threads): %s", ISA[isa],
                  threads, err);
    return m;
}

static void prefill(hd_state *st, uint32_t seed, const hd_model *m,
                    size_t context)
{
    int n_mla = tu_n_mla(m);
    if (context == 0)
        return;
    uint16_t *ckv = tu_xmalloc((size_t)(n_mla ? n_mla : 1) * context * HD_MLA_KV_LORA * 2);
    uint16_t *kr = tu_xmalloc((size_t)(n_mla ? n_mla : 1) * context * HD_MLA_QK_ROPE * 2);
    for (int i = 0; i < n_mla; i++)
        ck_assert_int_eq(hd_synth_cache(seed + (uint32_t)i, context,
                                        ckv + (size_t)i * context * HD_MLA_KV_LORA,
                                        kr + (size_t)i * context * HD_MLA_QK_ROPE),
                         HD_OK);
    ck_assert_int_eq(hd_state_prefill(st, context, ckv, kr), HD_OK);
    free(ckv);
    free(kr);
}

static double note(double *worst, double e)
{
    if (!(e <= *worst))
        *worst = e;
    return e;
}

/* Compares two snapshots per tensor class; returns via the worst_* maxima
 * and asserts the tolerances. */
static void compare_state(const tu_snapshot *a, const tu_snapshot *r,
                          const char *what)
{
    for (int l = 0; l < r->n_layers; l++)
        for (int w = 0; w < TU_N_STATE_TENSORS; w++) {
            if (!tu_layer_has(r->pattern[l], (hd_state_tensor)w) || !r->bytes[l][w])
                continue;
            double e, tol = TOL_CACHE;
            double *worst;
            if (w == HD_STATE_S) {
                e = tu_rel_l2_f32(a->data[l][w], r->data[l][w], r->bytes[l][w] / 4);
                tol = TOL_S;
                worst = &worst_s;
            } else {
                e = tu_rel_l2_bf16(a->data[l][w], r->data[l][w], r->bytes[l][w] / 2);
                worst = w == HD_STATE_C_KV ? &worst_ckv
                      : w == HD_STATE_K_ROPE ? &worst_kr : &worst_conv;
            }
            note(worst, e);
            ck_assert_msg(e <= tol, "%s: layer %d tensor %d rel L2 %.3e > %.0e",
                          what, l, w, e, tol);
        }
}

/* One configuration: the reference once, then every ISA x {1, 2} threads
 * (at the small size, those of z.small_pairs). */
static void check_config(uint32_t seed, int experts, const char *pattern,
                         size_t context, cfg_size z)
{
    const int steps = tu_size(z.steps, z.small_steps);
    const unsigned pairs = tu_small() ? z.small_pairs : ALL_PAIRS;
    if (pairs == 0) {
        printf("seed %u E %d %s ctx %zu: not run at the small size\n",
               (unsigned)seed, experts, pattern, context);
        return;
    }
    hd_model *ref = tu_synth_ref(seed, experts, pattern);
    hd_state *rs = tu_state_new(ref, context + (size_t)steps + 1);
    uint16_t *rout = tu_xmalloc((size_t)steps * HD_HIDDEN * 2);
    uint16_t in[HD_HIDDEN], out[HD_HIDDEN];

    prefill(rs, seed, ref, context);
    for (int t = 0; t < steps; t++) {
        tu_input(seed, (uint64_t)t, in);
        tu_step(ref, rs, in, rout + (size_t)t * HD_HIDDEN);
    }
    tu_snapshot *rsnap = tu_snapshot_take(ref, rs);

    for (int isa = 0; isa < N_ISA; isa++) {
        if (!isa_ok[isa])
            continue;
        for (int threads = 1; threads <= 2; threads++) {
            char what[160];
            /* The scalar portable path is slow: on the long KKKM runs it
             * runs with 2 threads only (1 thread is covered elsewhere). */
            if (isa == 0 && threads == 1 && steps >= 16 && strlen(pattern) >= 4)
                continue;
            if (!(pairs & PAIR(isa, threads)))
                continue;
            double max_out = 0.0;
            hd_model *m = synth_cpu(seed, experts, pattern, isa, threads);
            hd_state *st = tu_state_new(m, context + (size_t)steps + 1);
            prefill(st, seed, m, context);
            snprintf(what, sizeof what, "seed %u E %d %s ctx %zu, %s, %d thread(s)",
                     (unsigned)seed, experts, pattern, context, ISA[isa], threads);
            for (int t = 0; t < steps; t++) {
                tu_input(seed, (uint64_t)t, in);
                tu_step(m, st, in, out);
                ck_assert_msg(tu_all_finite_bf16(out, HD_HIDDEN),
                              "%s step %d: output not finite", what, t);
                double e = tu_rel_l2_bf16(out, rout + (size_t)t * HD_HIDDEN, HD_HIDDEN);
                note(&max_out, e);
                note(&worst_out, e);
                ck_assert_msg(e <= TOL_OUT, "%s step %d: output rel L2 %.3e > %.0e",
                              what, t, e, TOL_OUT);
            }
            tu_snapshot *snap = tu_snapshot_take(m, st);
            ck_assert_uint_eq(snap->context, rsnap->context);
            compare_state(snap, rsnap, what);
            printf("%s: %d steps, output max %.3e\n", what, steps, max_out);
            tu_snapshot_free(snap);
            hd_state_free(st);
            hd_model_free(m);
        }
    }
    printf("worst so far: output %.3e S %.3e conv %.3e c_kv %.3e k_rope %.3e\n",
           worst_out, worst_s, worst_conv, worst_ckv, worst_kr);
    fflush(stdout);
    tu_snapshot_free(rsnap);
    free(rout);
    hd_state_free(rs);
    hd_model_free(ref);
}

/* Pattern M, E 8: every context edge of the token split (2 threads: the
 * halves of 1, 5, ... tokens; 0 and 1: a thread with no token).  The small
 * size runs 2 threads, 1 step, at context 0 (1 token: a thread with no
 * token), 5 (3 tokens each: the odd tail of the two-token loop) and 97 (49
 * each: a full 32-token chunk and a partial one, the running max
 * rescaled); one thread over many chunks is test_kkkm_e8_long's. */
START_TEST(test_contexts)
{
    static const size_t ctx_full[] = { 0, 1, 5, 95, 96, 97, 128, 129, 300, 1000, 4096 };
    static const size_t ctx_small[] = { 0, 5, 97 };
    const size_t *ctx = tu_small() ? ctx_small : ctx_full;
    const size_t n = tu_small() ? sizeof ctx_small / sizeof ctx_small[0]
                                : sizeof ctx_full / sizeof ctx_full[0];
    const cfg_size z = { 2, 1, TWO_THREADS };
    for (size_t i = 0; i < n; i++)
        check_config(3 + (uint32_t)i, 8, "M", ctx[i], z);
}
END_TEST

/* At the small size the one configuration that takes 2 steps (the state a
 * step leaves is read by the next) on every pair. */
START_TEST(test_km_e16)
{
    const cfg_size z = { 16, 2, ALL_PAIRS };
    check_config(11, 16, "KM", 97, z);
}
END_TEST

START_TEST(test_kkkm_e64)
{
    const cfg_size z = { 6, 1, 0 };
    check_config(12, 64, "KKKM", 129, z);
}
END_TEST

START_TEST(test_kkkm_e8_long)
{
    const cfg_size z = { 16, 1, PAIR(0, 2) | PAIR(1, 1) | PAIR(2, 1) | PAIR(3, 2) | PAIR(4, 1) };
    check_config(13, 8, "KKKM", 1000, z);
}
END_TEST

START_TEST(test_mk_e16_short)
{
    const cfg_size z = { 4, 1, PAIR(0, 1) | PAIR(1, 2) | PAIR(2, 2) | PAIR(3, 1) | PAIR(4, 2) };
    check_config(14, 16, "MKK", 5, z);
}
END_TEST

/* ---- golden A and B through the CPU backend ---- */
#define S_ELEMS ((size_t)HD_KDA_HEADS * HD_KDA_HEAD_DIM * HD_KDA_HEAD_DIM)
#define CONV_ELEMS ((size_t)(HD_KDA_CONV - 1) * HD_KDA_HEADS * HD_KDA_HEAD_DIM)

static void *golden(const char *name, const char *file, size_t bytes)
{
    char rel[256];
    snprintf(rel, sizeof rel, "golden/%s/%s", name, file);
    return tu_load_data_sized(rel, bytes);
}

/* small_pairs: the pairs run at the small size (none: not run). */
static void golden_case(const char *name, uint32_t seed, int experts,
                        size_t context, size_t steps, unsigned small_pairs)
{
    const unsigned pairs = tu_small() ? small_pairs : ALL_PAIRS;
    if (pairs == 0) {
        printf("golden %s via cpu: not run at the small size\n", name);
        return;
    }
    const size_t rows = context + steps;
    uint16_t *g_out = golden(name, "out.bf16", steps * HD_HIDDEN * 2);
    float *g_s = golden(name, "S.f32", 3 * S_ELEMS * 4);
    uint16_t *g_conv = golden(name, "conv.bf16", 9 * CONV_ELEMS * 2);
    uint16_t *g_ckv = golden(name, "c_kv.bf16", rows * HD_MLA_KV_LORA * 2);
    uint16_t *g_kr = golden(name, "k_rope.bf16", rows * HD_MLA_QK_ROPE * 2);
    tu_le16_to_host(g_out, steps * HD_HIDDEN);
    tu_le32_to_host((uint32_t *)g_s, 3 * S_ELEMS);
    tu_le16_to_host(g_conv, 9 * CONV_ELEMS);
    tu_le16_to_host(g_ckv, rows * HD_MLA_KV_LORA);
    tu_le16_to_host(g_kr, rows * HD_MLA_QK_ROPE);

    for (int isa = 0; isa < N_ISA; isa++) {
        if (!isa_ok[isa])
            continue;
        for (int threads = 1; threads <= 2; threads++) {
            if (!(pairs & PAIR(isa, threads)))
                continue;
            hd_model *m = synth_cpu(seed, experts, "KKKM", isa, threads);
            hd_state *st = tu_state_new(m, rows + 1);
            uint16_t in[HD_HIDDEN], out[HD_HIDDEN];
            double e_out = 0, e_s = 0, e_conv = 0, e_ckv, e_kr;
            prefill(st, seed, m, context);
            for (size_t t = 0; t < steps; t++) {
                tu_input(seed, t, in);
                tu_step(m, st, in, out);
                note(&e_out, tu_rel_l2_bf16(out, g_out + t * HD_HIDDEN, HD_HIDDEN));
            }
            float *s = tu_xmalloc(S_ELEMS * 4);
            uint16_t *c = tu_xmalloc(CONV_ELEMS * 2);
            for (int l = 0; l < 3; l++) {
                ck_assert_int_eq(hd_state_export(st, l, HD_STATE_S, s, S_ELEMS * 4), HD_OK);
                note(&e_s, tu_rel_l2_f32(s, g_s + (size_t)l * S_ELEMS, S_ELEMS));
                for (int j = 0; j < 3; j++) {
                    ck_assert_int_eq(hd_state_export(st, l, (hd_state_tensor)(HD_STATE_CONV_Q + j),
                                                     c, CONV_ELEMS * 2), HD_OK);
                    note(&e_conv, tu_rel_l2_bf16(c, g_conv + ((size_t)l * 3 + (size_t)j) * CONV_ELEMS,
                                                 CONV_ELEMS));
                }
            }
            free(s);
            free(c);
            uint16_t *ckv = tu_xmalloc(rows * HD_MLA_KV_LORA * 2);
            uint16_t *kr = tu_xmalloc(rows * HD_MLA_QK_ROPE * 2);
            ck_assert_int_eq(hd_state_export(st, 3, HD_STATE_C_KV, ckv, rows * HD_MLA_KV_LORA * 2), HD_OK);
            ck_assert_int_eq(hd_state_export(st, 3, HD_STATE_K_ROPE, kr, rows * HD_MLA_QK_ROPE * 2), HD_OK);
            e_ckv = tu_rel_l2_bf16(ckv + context * HD_MLA_KV_LORA, g_ckv + context * HD_MLA_KV_LORA,
                                   steps * HD_MLA_KV_LORA);
            e_kr = tu_rel_l2_bf16(kr + context * HD_MLA_QK_ROPE, g_kr + context * HD_MLA_QK_ROPE,
                                  steps * HD_MLA_QK_ROPE);
            free(ckv);
            free(kr);
            printf("golden %s via cpu (%s, %d thread(s)): output max %.3e, S %.3e, conv %.3e, "
                   "new c_kv rows %.3e, new k_rope rows %.3e\n", name, ISA[isa], threads,
                   e_out, e_s, e_conv, e_ckv, e_kr);
            fflush(stdout);
            ck_assert_msg(e_out <= TOL_OUT, "golden %s: output %.3e", name, e_out);
            ck_assert_msg(e_s <= TOL_S, "golden %s: S %.3e", name, e_s);
            ck_assert_msg(e_conv <= TOL_CACHE, "golden %s: conv %.3e", name, e_conv);
            ck_assert_msg(e_ckv <= TOL_CACHE, "golden %s: c_kv %.3e", name, e_ckv);
            ck_assert_msg(e_kr <= TOL_CACHE, "golden %s: k_rope %.3e", name, e_kr);
            hd_state_free(st);
            hd_model_free(m);
        }
    }
    free(g_out);
    free(g_s);
    free(g_conv);
    free(g_ckv);
    free(g_kr);
}

START_TEST(test_golden_a)
{
    golden_case("A", 1, 16, 0, 8, 0);
}
END_TEST

START_TEST(test_golden_b)
{
    golden_case("B", 2, 64, 300, 4, TWO_THREADS & ~PAIR(0, 2));
}
END_TEST

#ifdef HD_HAVE_CPU_BACKEND
/* ---- the vdpbf16ps GEMV (avx512bf16) against an exact sum ---- */
static uint32_t lcg(uint32_t *r)
{
    *r = *r * 1664525u + 1013904223u;
    return *r >> 8;
}

/* y = W x in double, W the exact weights bf((q - z) * s) of the raw
 * matrix (SEMANTICS.md); tol, each column's allowed error: 1e-5 of its
 * sum of |w x| (fp32 accumulation of exact products; any lost bf16
 * rounding or rounded x would be ~1e-3, a subnormal weight flushed to
 * zero ~1 in the tiny columns), plus FLT_MIN for each product below
 * FLT_MIN in magnitude: vdpbf16ps and the tile unit flush such a product
 * to zero whatever MXCSR says (cpu_kern_avx512bf16.c, cpu_kern_amx.c), an
 * error below FLT_MIN each, seen only in the columns of tiny scales. */
static void gemv_exact(const uint8_t *w_q, const uint16_t *sc, const uint16_t *ze,
                       int K, int N, const float *x, double *y, double *tol)
{
    for (int n = 0; n < N; n++) {
        double a = 0, m = 0;
        int tiny = 0;
        for (int k = 0; k < K; k++) {
            uint8_t b = w_q[(size_t)(k / 2) * N + n];
            int q = (k & 1) ? b >> 4 : b & 15;
            float s = hd_bf16_to_f32(sc[(size_t)(k / 128) * N + n]);
            float z = hd_bf16_to_f32(ze[(size_t)(k / 128) * N + n]);
            double p = (double)hd_bf(((float)q - z) * s) * x[k];
            a += p;
            m += fabs(p);
            tiny += p != 0.0 && fabs(p) < FLT_MIN;
        }
        y[n] = a;
        tol[n] = 1e-5 * m + (double)tiny * FLT_MIN;
    }
}

/* Every output within its allowed error (gemv_exact). */
static void check_close(const float *y, const double *ref, const double *tol,
                        int N, const char *what)
{
    for (int n = 0; n < N; n++)
        ck_assert_msg(fabs((double)y[n] - ref[n]) <= tol[n],
                      "%s: column %d: %.9g vs %.9g (allowed %.3g)", what, n,
                      (double)y[n], ref[n], tol[n]);
}

/* Random int4 weights, K x N: bytes (lcg's bits 16-23: its low byte
 * repeats every 2^16 draws, so that with N = 8192 every eighth row of w_q
 * would repeat); scales 2^-12 .. 2^-4 and zero points
 * 0 .. 15.5 (ties in bf rounding).  With `subnormal`, every third column's
 * scales are 2^-126 .. 2^-124 (subnormal weights), with `z_nonzero` also
 * its zero points not 0. */
static void rand_qweights(uint32_t *r, int K, int N, int subnormal, int z_nonzero,
                          uint8_t *w_q, uint16_t *sc, uint16_t *ze)
{
    for (size_t i = 0; i < (size_t)K / 2 * N; i++)
        w_q[i] = (uint8_t)(lcg(r) >> 16);
    for (size_t i = 0; i < (size_t)K / 128 * N; i++) {
        sc[i] = (uint16_t)(((127 - 12 + (int)(lcg(r) % 9)) << 7) | (lcg(r) & 127));
        ze[i] = hd_f32_to_bf16(0.5f * (float)(lcg(r) % 32));
        if (subnormal && i % N % 3 == 0) {
            sc[i] = (uint16_t)((1 + (int)(lcg(r) % 3)) << 7 | (lcg(r) & 127));
            if (z_nonzero)
                ze[i] = hd_f32_to_bf16(0.5f * (float)(1 + lcg(r) % 31));
        }
    }
}

/* A bf16 value +-(1 + m / 128) 2^e, e in [lo, hi]. */
static float rand_bf16(uint32_t *r, int lo, int hi)
{
    const float m = 1.0f + (float)(lcg(r) % 128) / 128.0f;
    const float v = ldexpf(m, lo + (int)(lcg(r) % (uint32_t)(hi - lo + 1)));
    return lcg(r) & 1 ? -v : v;
}

/* The kernels that HD_CPU_ISA=ISA[isa] chooses (the path must run here:
 * isa_ok[isa]). */
static const cpu_kernels *path_kernels(int isa)
{
    cpu_isa got;
    char err[256];
    setenv("HD_CPU_ISA", ISA[isa], 1);
    ck_assert_msg(cpu_choose_isa(&got, err, sizeof err) == HD_OK, "%s: %s", ISA[isa], err);
    unsetenv("HD_CPU_ISA");
    return cpu_kernels_for(got);
}

/* dot_bf16_f64 of every path this machine runs against the plain sum in
 * double, for lengths 0 to 100 (every rest after the vector loops) and
 * around 2304 (a router row).  The products of bf16 values are exact in
 * fp32 (16 significant bits), and with magnitudes within 2^-12 .. 2^6
 * every partial sum of up to 2336 of them fits in a double's 53 bits, so
 * any order of the additions gives the same bits.  x[0] is -0 and one w
 * a negative zero. */
START_TEST(test_dot_f64)
{
    static const int extra[] = { 2304, 2303, 2336 };
    float x[2336];
    uint16_t w[2336];
    uint32_t r = 4242u;
    for (int i = 0; i < 2336; i++) {
        x[i] = rand_bf16(&r, -6, 3);
        w[i] = hd_f32_to_bf16(rand_bf16(&r, -6, 2));
    }
    x[0] = -0.0f;
    w[7] = 0x8000;
    for (int isa = 0; isa < N_ISA; isa++) {
        if (!isa_ok[isa])
            continue;
        const cpu_kernels *k = path_kernels(isa);
        for (int c = 0; c <= 100 + 3; c++) {
            const int n = c <= 100 ? c : extra[c - 101];
            double want = 0.0;
            for (int i = 0; i < n; i++)
                want += (double)(x[i] * hd_bf16_to_f32(w[i]));
            const double have = k->dot_bf16_f64(x, w, n);
            ck_assert_msg(have == want, "%s: dot of %d values %.17g, want %.17g", ISA[isa],
                          n, have, want);
        }
        printf("dot_bf16_f64 %s: ok\n", ISA[isa]);
    }
}
END_TEST

/* The absorbed query from the int4 W_k (cpu_pack_wk, cpu_kernels.absorb)
 * of every path this machine runs, against the sum made here from kv_b
 * itself: w = bf((q - z) s) as the reference makes it, times a bf16 qn
 * (exact in fp32), added in fp32 in the order of n.  The products being
 * exact, a fused multiply-add rounds as a multiply then an add, so the
 * bits must be equal on every path.  Heads 0, 13 and 31 (a misplaced
 * column, group or nibble picks another weight); kv_b with scales of
 * 2^-12 .. 2^-4, then with special columns: a subnormal scale, a zero
 * point of 1e30 (products beyond bf16's range: infinities), a NaN scale
 * (a NaN must come out NaN). */
START_TEST(test_absorb)
{
    const int K = HD_MLA_KV_LORA, N = HD_MLA_HEADS * (HD_MLA_QK_NOPE + HD_MLA_V_HEAD);
    static const int heads[] = { 0, 13, 31 };
    uint32_t r = 777u;
    uint8_t *w_q = tu_xmalloc((size_t)K / 2 * N);
    uint16_t *sc = tu_xmalloc((size_t)K / 128 * N * 2), *ze = tu_xmalloc((size_t)K / 128 * N * 2);
    uint8_t *wk_q = tu_xmalloc(HD_MLA_HEADS * CPU_WK_HEAD_Q);
    uint16_t *wk_sz = tu_xmalloc(HD_MLA_HEADS * CPU_WK_HEAD_SZ * 2);
    float qn[HD_MLA_QK_NOPE], ql[HD_MLA_KV_LORA], want[HD_MLA_KV_LORA];

    /* (the bytes from lcg's bits 16-23: from its low byte, which repeats
     * every 2^16 draws, every eighth row of w_q would repeat with N =
     * 8192, and an input misplaced by 16 or 64 could pick an equal weight;
     * such a mutation passed) */
    rand_qweights(&r, K, N, 0, 0, w_q, sc, ze);
    for (int n = 0; n < HD_MLA_QK_NOPE; n++)
        qn[n] = rand_bf16(&r, -4, 2);
    qn[5] = -0.0f;
    for (int round = 0; round < 2; round++) {
        if (round == 1) {   /* columns of head 13: group 1 col 3, group 2 col 70, group 3 col 9 */
            const int c0 = 13 * (HD_MLA_QK_NOPE + HD_MLA_V_HEAD);
            sc[(size_t)1 * N + c0 + 3] = 0x0003;
            ze[(size_t)2 * N + c0 + 70] = hd_f32_to_bf16(1e30f);
            sc[(size_t)2 * N + c0 + 70] = 0x7f00;   /* 2^127 */
            sc[(size_t)3 * N + c0 + 9] = 0x7fc1;
        }
        const hd_qlinear kv_b = { w_q, sc, ze, K, N, 1 };
        cpu_pack_wk(wk_q, wk_sz, &kv_b);
        for (size_t hi = 0; hi < sizeof heads / sizeof heads[0]; hi++) {
            const int h = heads[hi];
            for (int k = 0; k < K; k++) {
                float a = 0.0f;
                for (int n = 0; n < HD_MLA_QK_NOPE; n++) {
                    const size_t col = (size_t)h * (HD_MLA_QK_NOPE + HD_MLA_V_HEAD) + (size_t)n;
                    const uint8_t b = w_q[(size_t)(k / 2) * N + col];
                    const int q = k & 1 ? b >> 4 : b & 15;
                    const float s = hd_bf16_to_f32(sc[(size_t)(k / 128) * N + col]);
                    const float z = hd_bf16_to_f32(ze[(size_t)(k / 128) * N + col]);
                    a += qn[n] * hd_bf(((float)q - z) * s);
                }
                want[k] = a;
            }
            if (round == 1 && h == 13)  /* the special columns show */
                ck_assert(isinf(want[300]) && isnan(want[400]) && isfinite(want[200]));
            for (int isa = 0; isa < N_ISA; isa++) {
                if (!isa_ok[isa])
                    continue;
                path_kernels(isa)->absorb(wk_q + (size_t)h * CPU_WK_HEAD_Q,
                                          wk_sz + (size_t)h * CPU_WK_HEAD_SZ, qn, ql);
                for (int k = 0; k < K; k++)
                    ck_assert_msg(isnan(want[k]) ? isnan(ql[k])
                                                 : memcmp(&ql[k], &want[k], 4) == 0,
                                  "%s, round %d, head %d: ql[%d] %a, want %a", ISA[isa], round,
                                  h, k, (double)ql[k], (double)want[k]);
            }
        }
    }
    printf("absorb: ok on every path\n");
    free(w_q);
    free(sc);
    free(ze);
    free(wk_q);
    free(wk_sz);
}
END_TEST

/* cpu_sweep_next, the scheduling of a sweep's chunks: for 1 to 5 threads
 * and several chunk counts, under three orders of the threads' calls (in
 * turn, one thread alone, random), every chunk is handed out exactly
 * once; a thread gets its own run's chunks first and in order, and then
 * other runs' from their back (each run's in decreasing order).  Then
 * real threads race for 1000 chunks, 200 times. */
#define SWEEP_MAXT 5
#define SWEEP_MAXC 81
static void sweep_order(int nt, size_t nchunks, int order, uint32_t *rng)
{
    uint64_t runs[SWEEP_MAXT] = { 0 };
    int seen[SWEEP_MAXC] = { 0 }, done[SWEEP_MAXT] = { 0 }, left = nt;
    size_t last_own[SWEEP_MAXT], last_other[SWEEP_MAXT][SWEEP_MAXT];
    int stole[SWEEP_MAXT] = { 0 };
    size_t handed = 0;
    for (int t = 0; t < nt; t++) {
        last_own[t] = SIZE_MAX;
        for (int r = 0; r < nt; r++)
            last_other[t][r] = SIZE_MAX;
    }
    for (int step = 0; left > 0; step++) {
        int t;
        size_t c;
        if (order == 0)
            t = step % nt;
        else if (order == 1)
            t = done[0] ? step % nt : 0;
        else
            t = (int)((*rng = *rng * 1664525u + 1013904223u) >> 16) % nt;
        if (done[t])
            continue;
        if (!cpu_sweep_next(runs, nchunks, t, nt, &c)) {
            done[t] = 1;
            left--;
            continue;
        }
        ck_assert_msg(c < nchunks, "chunk %zu of %zu", c, nchunks);
        ck_assert_msg(!seen[c], "chunk %zu handed out twice (nt %d, %zu chunks, order %d)", c,
                      nt, nchunks, order);
        seen[c] = 1;
        handed++;
        int run = -1;
        for (int q = 0; q < nt; q++)
            if (c >= nchunks * (size_t)q / (size_t)nt && c < nchunks * (size_t)(q + 1) / (size_t)nt)
                run = q;
        ck_assert_int_ge(run, 0);
        if (run == t) {
            ck_assert_msg(!stole[t], "thread %d took chunk %zu of its own run after stealing", t, c);
            ck_assert_msg(last_own[t] == SIZE_MAX ? c == nchunks * (size_t)t / (size_t)nt
                                                  : c == last_own[t] + 1,
                          "thread %d: own chunk %zu out of order", t, c);
            last_own[t] = c;
        } else {
            stole[t] = 1;
            ck_assert_msg(last_other[t][run] == SIZE_MAX || c < last_other[t][run],
                          "thread %d: chunk %zu of run %d not from its back", t, c, run);
            last_other[t][run] = c;
        }
    }
    ck_assert_msg(handed == nchunks, "%zu of %zu chunks handed out", handed, nchunks);
}

typedef struct sweep_race {
    uint64_t *runs;
    int *count;
    size_t nchunks;
    int t, nt;
} sweep_race;

static void *sweep_racer(void *arg)
{
    sweep_race *a = arg;
    size_t c;
    while (cpu_sweep_next(a->runs, a->nchunks, a->t, a->nt, &c))
        __atomic_add_fetch(&a->count[c], 1, __ATOMIC_RELAXED);
    return NULL;
}

START_TEST(test_sweep_next)
{
    static const size_t counts[] = { 0, 1, 2, 3, 4, 5, 7, 8, 9, 16, 33, 80, 81 };
    uint32_t rng = 99u;
    for (int nt = 1; nt <= SWEEP_MAXT; nt++)
        for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
            for (int order = 0; order < 3; order++)
                sweep_order(nt, counts[i], order, &rng);
    for (int nt = 2; nt <= 4; nt += 2) {
        enum { NC = 1000 };
        static int count[NC];
        uint64_t runs[4];
        pthread_t th[4];
        sweep_race a[4];
        for (int rep = 0; rep < 200; rep++) {
            memset(count, 0, sizeof count);
            memset(runs, 0, sizeof runs);
            for (int t = 0; t < nt; t++) {
                a[t] = (sweep_race){ runs, count, NC, t, nt };
                ck_assert_int_eq(pthread_create(&th[t], NULL, sweep_racer, &a[t]), 0);
            }
            for (int t = 0; t < nt; t++)
                pthread_join(th[t], NULL);
            for (int c = 0; c < NC; c++)
                ck_assert_msg(count[c] == 1, "%d threads: chunk %d handed out %d times", nt, c,
                              count[c]);
        }
    }
}
END_TEST

/* cpu_qmat.normal, the flag that lets the vdpbf16ps kernels skip their
 * per-tile test: set after packing normal weights, cleared by one column
 * whose weights may be subnormal in any part of a concatenation (the
 * part packed first or last), and cpu_table_normal at its edges. */
START_TEST(test_qmat_normal)
{
    enum { K = 256, N = 32 };
    static uint8_t w_q[K / 2 * N];
    static uint16_t sc[K / 128 * N], ze[K / 128 * N];
    uint32_t r = 5u;
    const hd_qlinear q = { w_q, sc, ze, K, N, 1 };

    /* the bound: es + min(ez - 134, 0) >= 1 */
    ck_assert_int_eq(cpu_table_normal(0x0080, 0x0000), 1);  /* 2^-126, z 0 */
    ck_assert_int_eq(cpu_table_normal(0x0040, 0x0000), 0);  /* subnormal s */
    ck_assert_int_eq(cpu_table_normal(0x0000, 0x0000), 0);  /* s 0 */
    ck_assert_int_eq(cpu_table_normal(0x3c00, 0x3f00), 1);  /* 2^-7, z 0.5 */
    ck_assert_int_eq(cpu_table_normal(0x0400, 0x4300), 1);  /* z 128: ulp 1 */
    /* s 2^-119, z 0.5: all it assumes is |v - z| >= ulp(z) = 2^-8 */
    ck_assert_int_eq(cpu_table_normal(0x0400, 0x3f00), 0);
    ck_assert_int_eq(cpu_table_normal(0x3f80, 0x8000), 1);  /* z -0 */
    rand_qweights(&r, K, N, 0, 0, w_q, sc, ze);
    /* the three layouts (the flag does not depend on the order of the
     * bytes or the tiles), and the part with a bad column: none, the
     * first, the second */
    for (int lb = 0; lb < 9; lb++) {
        const cpu_layout layout = lb < 3 ? CPU_LAYOUT_PAIRED
                                : lb < 6 ? CPU_LAYOUT_SLICED : CPU_LAYOUT_BLOCKED;
        const int bad = lb % 3 - 1;
        cpu_qmat m;
        ck_assert_int_eq(cpu_qmat_alloc(&m, K, 2 * N, 1, layout), HD_OK);
        ck_assert_int_eq(m.normal, 1);
        for (int part = 0; part < 2; part++) {
            const uint16_t keep = sc[N + 17];
            if (part == bad)
                sc[N + 17] = 0x0003;            /* group 1, column 17: subnormal */
            cpu_repack_part(&m, 0, part * N, &q, 0, 0, N);
            sc[N + 17] = keep;
        }
        ck_assert_msg(m.normal == (bad < 0), "subnormal column in part %d: normal %d", bad,
                      m.normal);
        cpu_qmat_free(&m);
    }
}
END_TEST

/* The P pairs of m times x through kern against ref; then the pairs
 * [1, P - 1) alone, which must leave the outer columns untouched.  Where
 * m is normal (cpu_qmat.normal: the kernels skip their per-tile test),
 * the kernel told to test every tile must give the same bits (not the AMX
 * kernels, which leave a matrix that is not normal to the avx512bf16
 * ones). */
static void check_pairs_ranges(const cpu_kernels *kern, const cpu_qmat *m, int P,
                               const cpu_xq *xq, float *y, const double *ref,
                               const double *tol, int N, const char *what)
{
    memset(y, 0, (size_t)N * 4);
    cpu_gemv_pairs(kern, m->tiles, 0, P, m->groups, m->normal, xq, y);
    check_close(y, ref, tol, N, what);
    if (m->normal && !kern->gemv_pairs_x3) {
        float *yc = tu_xmalloc((size_t)N * 4);
        cpu_gemv_pairs(kern, m->tiles, 0, P, m->groups, 0, xq, yc);
        ck_assert_msg(memcmp(y, yc, (size_t)N * 4) == 0, "%s: checked tiles differ", what);
        free(yc);
    }
    if (P >= 3) {
        memset(y, 0, (size_t)N * 4);
        cpu_gemv_pairs(kern, m->tiles, 1, P - 1, m->groups, m->normal, xq, y);
        ck_assert(y[0] == 0.0f && y[1] == 0.0f && y[N - 1] == 0.0f);
        check_close(y + 2, ref + 2, tol + 2, N - 4, what);
    }
}

/* The path choice of cpu_prepare_x and cpu_gemv_pairs: a bf16-exact x
 * goes through x's bf16 words (the floats are poisoned to prove it) and
 * matches the exact sum; an x that is not (one low bit set, a subnormal)
 * goes through the fp32 kernel on its xd floats (xq has no xe), the same
 * bits as on its xe floats (the bf16 words poisoned); without bf16 words
 * never the bf16 path.  The tiles are in the kernels' layout (sliced).  Odd pair counts and ranges cover the
 * kernel's one-pair tail; the last shape has columns with scales near
 * 2^-126 (subnormal weights: the kernel's fp32 tiles). */
START_TEST(test_bf16_gemv)
{
    static const int shapes[][2] = { { 128, 2 }, { 512, 34 }, { 1024, 256 },
                                     { 4096, 98 }, { 2304, 64 }, { 1024, 66 } };
    const size_t n_shapes = sizeof shapes / sizeof shapes[0];
    const int isa = 3;
    cpu_isa got;
    char err[256];
    if (!isa_ok[isa]) {
        printf("bf16 gemv: SKIP (no %s path)\n", ISA[isa]);
        return;
    }
    setenv("HD_CPU_ISA", ISA[isa], 1);
    ck_assert_int_eq(cpu_choose_isa(&got, err, sizeof err), HD_OK);
    unsetenv("HD_CPU_ISA");
    ck_assert_int_eq(got, CPU_ISA_AVX512BF16);
    const cpu_kernels *kb = cpu_kernels_for(got);
    const cpu_kernels *k5 = cpu_kernels_for(CPU_ISA_AVX512);
    ck_assert_str_eq(kb->name, "avx512bf16");
    ck_assert_ptr_nonnull(kb->gemv_pairs_bf16);
    ck_assert_ptr_null(k5->gemv_pairs_bf16);

    for (size_t sh = 0; sh < n_shapes; sh++) {
        const int K = shapes[sh][0], N = shapes[sh][1], P = N / 2;
        uint32_t r = 99u + (uint32_t)sh;
        uint8_t *w_q = tu_xmalloc((size_t)K / 2 * N);
        uint16_t *sc = tu_xmalloc((size_t)K / 128 * N * 2);
        uint16_t *ze = tu_xmalloc((size_t)K / 128 * N * 2);
        float *x = tu_xmalloc((size_t)K * 4);
        float *y = tu_xmalloc((size_t)N * 4), *y5 = tu_xmalloc((size_t)N * 4);
        double *ref = tu_xmalloc((size_t)N * 8), *tol = tu_xmalloc((size_t)N * 8);
        cpu_xq xq = { tu_xmalloc((size_t)K * 8), tu_xmalloc((size_t)K * 2), NULL, NULL, K, 0, 0, 0, 0 };
        cpu_qmat m;
        char what[96];

        rand_qweights(&r, K, N, sh == n_shapes - 1, 0, w_q, sc, ze);
        for (int k = 0; k < K; k++)     /* bf16, signed, 2^-8 .. 2^4 */
            x[k] = hd_bf(((float)(lcg(&r) % 65536) / 32768.0f - 1.0f) *
                         ldexpf(1.0f, (int)(lcg(&r) % 13) - 8));
        x[1] = 0.0f;
        x[2] = -0.0f;
        ck_assert_int_eq(cpu_qmat_alloc(&m, K, N, 1, kb->layout), HD_OK);
        cpu_repack_raw(&m, 0, w_q, sc, ze);
        /* the last shape's tiny scales make subnormal weights */
        ck_assert_int_eq(m.normal, sh != n_shapes - 1);

        /* bf16-exact: the bf16 words, all pairs and an odd range */
        gemv_exact(w_q, sc, ze, K, N, x, ref, tol);
        cpu_prepare_x(x, K, &xq);
        ck_assert_int_eq(xq.bf16, 1);
        for (int i = 0; i < 2 * K; i++)
            xq.xd[i] = NAN;
        snprintf(what, sizeof what, "bf16 x, K %d N %d", K, N);
        check_pairs_ranges(kb, &m, P, &xq, y, ref, tol, N, what);

        /* not bf16 (one fp32 ulp on one x; then a subnormal): the fp32
         * kernel on the xd floats (xq has no xe), the same bits as on the
         * xe floats */
        for (int v = 0; v < 2; v++) {
            float *xv = tu_xmalloc((size_t)K * 4);
            cpu_xq xe = { tu_xmalloc((size_t)K * 8), NULL, tu_xmalloc((size_t)K * 4), NULL, K, 0, 0, 0, 0 };
            memcpy(xv, x, (size_t)K * 4);
            if (v == 0)
                xv[K / 3] = nextafterf(xv[K / 3] == 0.0f ? 1.0f : xv[K / 3], INFINITY);
            else
                xv[K - 1] = hd_bf16_to_f32(0x0005);   /* bf16 subnormal */
            gemv_exact(w_q, sc, ze, K, N, xv, ref, tol);
            cpu_prepare_x(xv, K, &xq);
            ck_assert_int_eq(xq.bf16, 0);
            ck_assert_int_eq(xq.f32, 0);
            for (int i = 0; i < K; i++)
                xq.xb[i] = 0x7fc0;              /* NaN */
            cpu_gemv_pairs(kb, m.tiles, 0, P, m.groups, m.normal, &xq, y);
            cpu_prepare_x(xv, K, &xe);
            ck_assert_int_eq(xe.f32, 1);
            for (int i = 0; i < 2 * K; i++)
                xe.xd[i] = NAN;
            cpu_gemv_pairs(kb, m.tiles, 0, P, m.groups, m.normal, &xe, y5);
            ck_assert_msg(memcmp(y, y5, (size_t)N * 4) == 0,
                          "non-bf16 x (%d), K %d N %d: xd and xe paths differ", v, K, N);
            free(xe.xd);
            free(xe.xe);
            snprintf(what, sizeof what, "non-bf16 x (%d), K %d N %d", v, K, N);
            check_close(y, ref, tol, N, what);
            free(xv);
        }

        /* no bf16 words: never the bf16 path */
        {
            uint16_t *xb = xq.xb;
            xq.xb = NULL;
            cpu_prepare_x(x, K, &xq);
            ck_assert_int_eq(xq.bf16, 0);
            xq.xb = xb;
        }
        printf("bf16 gemv K %d N %d: ok\n", K, N);
        cpu_qmat_free(&m);
        free(w_q);
        free(sc);
        free(ze);
        free(x);
        free(y);
        free(y5);
        free(ref);
        free(tol);
        free(xq.xd);
        free(xq.xb);
    }
}
END_TEST

#ifdef HD_CPU_HAVE_AVX512BF16
/* The fp32-x kernel (cpu_xq.xe: x per 16 inputs, even ones then odd ones)
 * and its path choice, through cpu_gemv_pairs with the avx512bf16
 * kernels: an fp32 x with 24 significant bits (zeros, values near 2^-126
 * and a subnormal among them) goes through the xe floats (the xd floats
 * poisoned) to within 1e-5 of sum |w x| of the exact sum, flagged and
 * checked (check_pairs_ranges); a single nonzero x at input k gives each
 * column exactly w[k][n] x rounded once, for k at the edges of the
 * layout's blocks (a misplaced input would pick another weight); an
 * infinity or a NaN gives what the double sum gives; a bf16 x keeps the
 * bf16 kernel; without xe, the xd floats give the xe floats' bits.  The
 * inputs placed alone cover the sliced layout's slices (16 inputs) and
 * chunks (64) and the group's end (128).  The last
 * shape has subnormal weights (normal 0: tile_table's words, fp32 FMAs). */
START_TEST(test_f32_gemv)
{
    static const int shapes[][2] = { { 128, 2 }, { 512, 128 }, { 512, 34 },
                                     { 1024, 2304 }, { 4096, 98 }, { 1024, 66 } };
    static const int one_at[] = { 0, 1, 7, 8, 9, 14, 15, 16, 17, 31, 32, 47, 48, 63, 64,
                                  65, 79, 80, 111, 112, 127, 128, 129, 191, 192 };
    const size_t n_shapes = sizeof shapes / sizeof shapes[0];
    if (!isa_ok[3]) {
        printf("f32 gemv: SKIP (no %s path)\n", ISA[3]);
        return;
    }
    const cpu_kernels *k5 = cpu_kernels_for(CPU_ISA_AVX512);
    const cpu_kernels *kx = cpu_kernels_for(CPU_ISA_AVX512BF16);
    ck_assert_ptr_eq(kx->gemv_pairs_f32, cpu_avx512bf16_gemv_pairs_f32);
    ck_assert_ptr_null(k5->gemv_pairs_f32);

    for (size_t sh = 0; sh < n_shapes; sh++) {
        const int K = shapes[sh][0], N = shapes[sh][1], P = N / 2;
        uint32_t r = 7u + (uint32_t)sh;
        uint8_t *w_q = tu_xmalloc((size_t)K / 2 * N);
        uint16_t *sc = tu_xmalloc((size_t)K / 128 * N * 2);
        uint16_t *ze = tu_xmalloc((size_t)K / 128 * N * 2);
        float *x = tu_xmalloc((size_t)K * 4), *xv = tu_xmalloc((size_t)K * 4);
        float *y = tu_xmalloc((size_t)N * 4), *y5 = tu_xmalloc((size_t)N * 4);
        double *ref = tu_xmalloc((size_t)N * 8), *tol = tu_xmalloc((size_t)N * 8);
        cpu_xq xq = { tu_xmalloc((size_t)K * 8), tu_xmalloc((size_t)K * 2),
                      tu_xmalloc((size_t)K * 4), NULL, K, 0, 0, 0, 0 };
        cpu_qmat m;
        char what[96];

        /* subnormal weights, and zero points that are not 0 */
        rand_qweights(&r, K, N, sh == n_shapes - 1, 1, w_q, sc, ze);
        /* fp32, 24 significant bits, signed, 2^-8 .. 2^4 */
        for (int k = 0; k < K; k++)
            x[k] = (float)((int)(lcg(&r) & 0xffffff) - 0x800000) / 0x800000 *
                   ldexpf(1.0f, (int)(lcg(&r) % 13) - 8);
        x[1] = 0.0f;
        x[2] = -0.0f;
        x[3] = 1.5f;
        x[4] = -0x1p-100f * (1.0f + 0x1p-9f + 0x1p-20f);
        x[5] = 1e-40f;                                      /* subnormal */
        ck_assert_int_eq(cpu_qmat_alloc(&m, K, N, 1, kx->layout), HD_OK);
        cpu_repack_raw(&m, 0, w_q, sc, ze);
        ck_assert_int_eq(m.normal, sh != n_shapes - 1);

        /* fp32 x: the xe floats */
        gemv_exact(w_q, sc, ze, K, N, x, ref, tol);
        cpu_prepare_x(x, K, &xq);
        ck_assert_int_eq(xq.bf16, 0);
        ck_assert_int_eq(xq.f32, 1);
        for (int i = 0; i < 2 * K; i++)
            xq.xd[i] = NAN;
        snprintf(what, sizeof what, "fp32 x, K %d N %d", K, N);
        check_pairs_ranges(kx, &m, P, &xq, y, ref, tol, N, what);

        /* one nonzero x: w x rounded once (an FMA onto zeros) */
        for (size_t i = 0; i < sizeof one_at / sizeof one_at[0] && one_at[i] < K; i++) {
            const int k1 = one_at[i];
            memset(xv, 0, (size_t)K * 4);
            xv[k1] = 1.0f + 0x1p-10f + 0x1p-20f;
            gemv_exact(w_q, sc, ze, K, N, xv, ref, tol);
            cpu_prepare_x(xv, K, &xq);
            ck_assert_int_eq(xq.f32, 1);
            cpu_gemv_pairs(kx, m.tiles, 0, P, m.groups, m.normal, &xq, y);
            for (int n = 0; n < N; n++)
                ck_assert_msg(y[n] == (float)ref[n], "one x at %d, K %d N %d: column %d: %a vs %a",
                              k1, K, N, n, (double)y[n], ref[n]);
        }

        /* an infinity, a NaN: as the double sum */
        for (int v = 0; v < 2; v++) {
            memcpy(xv, x, (size_t)K * 4);
            xv[K / 3] = v ? NAN : -INFINITY;
            gemv_exact(w_q, sc, ze, K, N, xv, ref, tol);
            cpu_prepare_x(xv, K, &xq);
            ck_assert_int_eq(xq.f32, 1);
            cpu_gemv_pairs(kx, m.tiles, 0, P, m.groups, m.normal, &xq, y);
            for (int n = 0; n < N; n++)
                ck_assert_msg(isnan(ref[n]) ? isnan(y[n]) : (double)y[n] == ref[n],
                              "x with %s, K %d N %d: column %d: %a vs %a", v ? "NaN" : "-inf",
                              K, N, n, (double)y[n], ref[n]);
        }

        /* bf16 x: the bf16 kernel; no xe: the xd floats, the same bits as
         * the xe floats (y from the NaN case above is overwritten) */
        for (int k = 0; k < K; k++)
            xv[k] = hd_bf(x[k]);
        xv[5] = 0.0f;
        cpu_prepare_x(xv, K, &xq);
        ck_assert_int_eq(xq.bf16, 1);
        ck_assert_int_eq(xq.f32, 0);
        {
            float *xe = xq.xe;
            xq.xe = NULL;
            cpu_prepare_x(x, K, &xq);
            ck_assert_int_eq(xq.f32, 0);
            cpu_gemv_pairs(kx, m.tiles, 0, P, m.groups, m.normal, &xq, y);
            xq.xe = xe;
            cpu_prepare_x(x, K, &xq);
            ck_assert_int_eq(xq.f32, 1);
            cpu_gemv_pairs(kx, m.tiles, 0, P, m.groups, m.normal, &xq, y5);
            ck_assert_msg(memcmp(y, y5, (size_t)N * 4) == 0,
                          "no xe, K %d N %d: not the xe kernel's bits", K, N);
        }

        printf("f32 gemv K %d N %d: ok\n", K, N);
        cpu_qmat_free(&m);
        free(w_q);
        free(sc);
        free(ze);
        free(x);
        free(xv);
        free(y);
        free(y5);
        free(ref);
        free(tol);
        free(xq.xd);
        free(xq.xb);
        free(xq.xe);
    }
}
END_TEST
#ifdef HD_CPU_HAVE_AMX
/* Where input k of x lies in cpu_xq.xt with P parts (cpu.h), found by
 * walking its group's tiles in their order: group g, tile n, position p
 * holds input 128 g + 64 (p / 16) + 16 n + p % 16, in row p / 2 of the
 * group's 16 rows of 4 tiles x 2 P words. */
static size_t amx_x_at(int k, int parts)
{
    const int g = k / 128;
    for (int n = 0; n < 4; n++)
        for (int p = 0; p < 32; p++)
            if (128 * g + 64 * (p / 16) + 16 * n + p % 16 == k)
                return ((size_t)(16 * g + p / 2) * 4 + (size_t)n) * (size_t)(2 * parts) +
                       (size_t)(p & 1);
    ck_abort_msg("input %d not in any tile", k);
    return 0;
}

/* The AMX kernels (cpu_kern_amx.c) through cpu_gemv_pairs: a bf16 x (its
 * words in the tiles' order, cpu_xq.xt, checked to be x's) and an fp32 x
 * (its three bf16 parts in that order, checked to sum to x) within
 * 1e-5 of sum |w x| of the exact sum, all pairs and the pairs [1, P - 1)
 * (8-pair blocks, the pairs around them on the avx512bf16 kernels); one
 * nonzero x at input k gives w[k][n] x, exactly for a bf16 x and within
 * an ulp for a three-part one (two sums), for k at the edges of the
 * tile's 32 inputs, the layout's slices and chunks and the group (a
 * misplaced input picks another weight); an x with an infinity, with a
 * NaN whose bf16 rounding wraps to zero, with a subnormal part, with parts
 * that underflow and one whose third part rounds away stay on the fp32
 * FMAs (x3 0); a matrix with subnormal weights (normal 0) on the avx512bf16
 * kernels.  Pair counts not multiples of 8 cover the tails; K 128 N 48,
 * three blocks of one group, the pipeline of blocks where a block's sums
 * wait a whole block to be added up (cpu_kern_amx.c). */
START_TEST(test_amx_gemv)
{
    static const int shapes[][2] = { { 128, 16 }, { 128, 48 }, { 512, 34 }, { 1024, 256 },
                                     { 4096, 98 }, { 2304, 64 }, { 1024, 66 } };
    static const int one_at[] = { 0, 1, 15, 16, 31, 32, 33, 47, 48, 63, 64, 65, 95, 96,
                                  127, 128, 129, 160, 191, 192, 255, 256 };
    const size_t n_shapes = sizeof shapes / sizeof shapes[0];
    if (!isa_ok[4]) {
        printf("amx gemv: SKIP (no %s path)\n", ISA[4]);
        return;
    }
    const cpu_kernels *ka = cpu_kernels_for(CPU_ISA_AMX);
    ck_assert_str_eq(ka->name, "amx");
    ck_assert_ptr_eq(ka->gemv_pairs_x1, cpu_amx_gemv_pairs_x1);
    ck_assert_ptr_eq(ka->gemv_pairs_x3, cpu_amx_gemv_pairs_x3);
    ck_assert_ptr_null(cpu_kernels_for(CPU_ISA_AVX512BF16)->gemv_pairs_x1);
    ck_assert_ptr_null(cpu_kernels_for(CPU_ISA_AVX512BF16)->gemv_pairs_x3);

    for (size_t sh = 0; sh < n_shapes; sh++) {
        const int K = shapes[sh][0], N = shapes[sh][1], P = N / 2;
        const int sub = sh == n_shapes - 1;
        uint32_t r = 31u + (uint32_t)sh;
        uint8_t *w_q = tu_xmalloc((size_t)K / 2 * N);
        uint16_t *sc = tu_xmalloc((size_t)K / 128 * N * 2);
        uint16_t *ze = tu_xmalloc((size_t)K / 128 * N * 2);
        float *x = tu_xmalloc((size_t)K * 4), *xv = tu_xmalloc((size_t)K * 4);
        float *y = tu_xmalloc((size_t)N * 4);
        double *ref = tu_xmalloc((size_t)N * 8), *tol = tu_xmalloc((size_t)N * 8);
        cpu_xq xq = { tu_xmalloc((size_t)K * 8), tu_xmalloc((size_t)K * 2),
                      tu_xmalloc((size_t)K * 4), tu_xmalloc((size_t)K * 6), K, 0, 0, 0, 0 };
        cpu_qmat m;
        char what[96];

        rand_qweights(&r, K, N, sub, 1, w_q, sc, ze);
        for (int k = 0; k < K; k++)     /* fp32, 24 significant bits, 2^-8 .. 2^4 */
            x[k] = (float)((int)(lcg(&r) & 0xffffff) - 0x800000) / 0x800000 *
                   ldexpf(1.0f, (int)(lcg(&r) % 13) - 8);
        x[1] = 0.0f;
        x[2] = -0.0f;
        x[3] = -0x1p-90f * (1.0f + 0x1p-9f + 0x1p-20f);   /* parts near 2^-110 */
        ck_assert_int_eq(cpu_qmat_alloc(&m, K, N, 1, ka->layout), HD_OK);
        cpu_repack_raw(&m, 0, w_q, sc, ze);
        ck_assert_int_eq(m.normal, !sub);

        /* fp32 x: three parts that sum to x, the xd floats poisoned */
        gemv_exact(w_q, sc, ze, K, N, x, ref, tol);
        cpu_prepare_x(x, K, &xq);
        ck_assert_int_eq(xq.bf16, 0);
        ck_assert_int_eq(xq.f32, 1);
        ck_assert_int_eq(xq.x3, 1);
        for (int k = 0; k < K; k++) {
            const uint16_t *t = xq.xt + amx_x_at(k, 3);
            ck_assert_msg((double)hd_bf16_to_f32(t[0]) + (double)hd_bf16_to_f32(t[2]) +
                          (double)hd_bf16_to_f32(t[4]) == (double)x[k],
                          "K %d: x[%d] = %a: parts do not sum to it", K, k, (double)x[k]);
        }
        for (int i = 0; i < 2 * K; i++)
            xq.xd[i] = NAN;
        snprintf(what, sizeof what, "amx, fp32 x, K %d N %d", K, N);
        check_pairs_ranges(ka, &m, P, &xq, y, ref, tol, N, what);

        /* bf16 x: its words */
        for (int k = 0; k < K; k++)
            xv[k] = hd_bf(x[k]);
        xv[3] = 0.0f;
        gemv_exact(w_q, sc, ze, K, N, xv, ref, tol);
        cpu_prepare_x(xv, K, &xq);
        ck_assert_int_eq(xq.bf16, 1);
        ck_assert_int_eq(xq.x1, 1);
        ck_assert_int_eq(xq.x3, 0);
        for (int k = 0; k < K; k++)
            ck_assert_msg(xq.xt[amx_x_at(k, 1)] == xq.xb[k], "K %d: x[%d] misplaced", K, k);
        for (int i = 0; i < 2 * K; i++)
            xq.xd[i] = NAN;
        snprintf(what, sizeof what, "amx, bf16 x, K %d N %d", K, N);
        check_pairs_ranges(ka, &m, P, &xq, y, ref, tol, N, what);

        /* one nonzero x, bf16 (exact) and in three parts (within an ulp) */
        for (size_t i = 0; i < sizeof one_at / sizeof one_at[0] && one_at[i] < K; i++)
            for (int v = 0; v < 2; v++) {
                const int k1 = one_at[i];
                memset(xv, 0, (size_t)K * 4);
                xv[k1] = v ? 1.0f + 0x1p-10f + 0x1p-20f : 1.0f + 0x1p-3f + 0x1p-7f;
                gemv_exact(w_q, sc, ze, K, N, xv, ref, tol);
                cpu_prepare_x(xv, K, &xq);
                ck_assert_int_eq(xq.bf16, !v);
                ck_assert_int_eq(xq.x3, v);
                memset(y, 0, (size_t)N * 4);
                cpu_gemv_pairs(ka, m.tiles, 0, P, m.groups, m.normal, &xq, y);
                for (int n = 0; n < N; n++) {
                    const double e = fabs((double)y[n] - ref[n]);
                    const double ulp = ref[n] == 0.0 ? 0.0
                                       : ldexp(1.0, ilogb(ref[n]) - 23);
                    ck_assert_msg(v ? e <= ulp : (double)y[n] == ref[n],
                                  "one x (%s) at %d, K %d N %d: column %d: %a vs %a",
                                  v ? "three parts" : "bf16", k1, K, N, n, (double)y[n],
                                  ref[n]);
                }
            }

        /* an infinity; a subnormal part; parts that underflow: x3 0, the
         * fp32 FMAs, as the double sum (or within 1e-5) */
        for (int v = 0; v < 5; v++) {
            const uint32_t nan_bits = 0x7fffffffu;  /* rounds to bf16 -0 */
            memcpy(xv, x, (size_t)K * 4);
            xv[K / 3] = v == 0 ? -INFINITY : v == 1 ? 0x1p-120f * (1.0f + 0x1p-12f)
                      : v == 2 ? 0x1p-126f * (1.0f + 0x1p-20f)
                      : 0x1p-120f + 0x1p-140f;      /* v 3: the third part rounds away */
            if (v == 4)
                memcpy(&xv[K / 3], &nan_bits, 4);
            gemv_exact(w_q, sc, ze, K, N, xv, ref, tol);
            cpu_prepare_x(xv, K, &xq);
            ck_assert_int_eq(xq.f32, 1);
            ck_assert_msg(xq.x3 == 0, "x case %d, K %d: three parts taken", v, K);
            cpu_gemv_pairs(ka, m.tiles, 0, P, m.groups, m.normal, &xq, y);
            if (v == 0 || v == 4) {
                for (int n = 0; n < N; n++)
                    ck_assert_msg(isnan(ref[n]) ? isnan(y[n]) : (double)y[n] == ref[n],
                                  "x with %s, K %d N %d: column %d: %a vs %a",
                                  v ? "NaN" : "-inf", K, N, n, (double)y[n], ref[n]);
            } else {
                snprintf(what, sizeof what, "amx, tiny x (%d), K %d N %d", v, K, N);
                check_close(y, ref, tol, N, what);
            }
        }

        printf("amx gemv K %d N %d: ok\n", K, N);
        cpu_qmat_free(&m);
        free(w_q);
        free(sc);
        free(ze);
        free(x);
        free(xv);
        free(y);
        free(ref);
        free(tol);
        free(xq.xd);
        free(xq.xb);
        free(xq.xe);
        free(xq.xt);
    }
}
END_TEST
#endif
#endif
#endif

/* Every path's MLA softmax partials (mla_range: per head the maximum m,
 * the sum l of exp(score - m) and acc = sum exp(score - m) c_kv) against
 * the same in double, over ranges that start and end inside the kernels'
 * chunks and blocks (the amx path takes 64 tokens or more, in chunks of
 * 64 and blocks of 32), are empty or one token: m, and acc / l (the head's
 * latent), within fp32 summation error.  The cache holds bf16 rows of
 * magnitudes 2^-6 .. 2^2, the query fp32 values of 24 bits (the amx path
 * splits them into three bf16 parts), with a ramp on the rope part so that
 * the maximum grows along the tokens (the rescale of what was summed).
 * Then queries the tile unit cannot take exactly (a NaN, an infinity, a
 * value whose third part is subnormal) must leave every path with the
 * bits of the avx512bf16 (plain vector) kernel, which the amx path falls
 * back to. */
static double mla_range_err(const cpu_kernels *k, const uint16_t *c_kv, const uint16_t *k_rope,
                            size_t t0, size_t t1, const float *ql, const float *qr, float *work,
                            float *m, float *l, float *acc, double *m_err)
{
    const int LR = HD_MLA_KV_LORA, RP = HD_MLA_QK_ROPE, NH = HD_MLA_HEADS;
    const double scale = 1.0 / sqrt(192.0);
    double worst = 0.0;
    double *sc = tu_xmalloc((t1 - t0 + 1) * sizeof(double));
    k->mla_range(c_kv, k_rope, t0, t1, ql, qr, m, l, acc, work);
    *m_err = 0.0;
    for (int h = 0; h < NH; h++) {
        double mx = -INFINITY, den = 0.0, num2 = 0.0, err2 = 0.0;
        if (t0 == t1) {
            ck_assert(m[h] == -INFINITY && l[h] == 0.0f);
            for (int d = 0; d < LR; d++)
                ck_assert(acc[h * LR + d] == 0.0f);
            continue;
        }
        for (size_t t = t0; t < t1; t++) {
            double v = 0.0;
            for (int d = 0; d < LR; d++)
                v += (double)hd_bf16_to_f32(c_kv[t * LR + d]) * ql[h * LR + d];
            for (int d = 0; d < RP; d++)
                v += (double)hd_bf16_to_f32(k_rope[t * RP + d]) * qr[h * RP + d];
            sc[t - t0] = v * scale;
            if (sc[t - t0] > mx)
                mx = sc[t - t0];
        }
        for (size_t t = t0; t < t1; t++)
            den += exp(sc[t - t0] - mx);
        *m_err = fmax(*m_err, fabs(m[h] - mx) / (1.0 + fabs(mx)));
        /* l relative to m, so compare l e^m */
        ck_assert_msg(fabs(l[h] * exp(m[h] - mx) - den) <= 1e-5 * den,
                      "%s head %d [%zu, %zu): l %.9g, want %.9g", k->name, h, t0, t1,
                      l[h] * exp(m[h] - mx), den);
        for (int d = 0; d < LR; d++) {
            double lat = 0.0;
            for (size_t t = t0; t < t1; t++)
                lat += exp(sc[t - t0] - mx) * hd_bf16_to_f32(c_kv[t * LR + d]);
            lat /= den;
            num2 += lat * lat;
            err2 += (acc[h * LR + d] / (double)l[h] - lat) * (acc[h * LR + d] / (double)l[h] - lat);
        }
        worst = fmax(worst, sqrt(err2 / num2));
    }
    free(sc);
    return worst;
}

START_TEST(test_mla_range)
{
    const int LR = HD_MLA_KV_LORA, RP = HD_MLA_QK_ROPE, NH = HD_MLA_HEADS;
    static const size_t ranges_full[][2] = { { 0, 0 },    { 0, 1 },    { 7, 8 },    { 3, 37 },
                                             { 5, 68 },   { 5, 69 },   { 3, 80 },   { 10, 107 },
                                             { 0, 64 },   { 64, 160 }, { 31, 95 },  { 0, 300 },
                                             { 1, 1000 }, { 100, 2148 } };
    static const size_t ranges_small[][2] = { { 0, 0 }, { 0, 1 }, { 3, 37 }, { 3, 80 }, { 31, 130 } };
    const size_t (*ranges)[2] = tu_small() ? ranges_small : ranges_full;
    const size_t n_ranges = tu_small() ? sizeof ranges_small / sizeof ranges_small[0]
                                       : sizeof ranges_full / sizeof ranges_full[0];
    const size_t L = 2200;
    uint32_t r = 2024u;
    uint16_t *c_kv = tu_xmalloc(L * LR * 2), *k_rope = tu_xmalloc(L * RP * 2);
    float *ql = tu_xmalloc((size_t)NH * LR * 4), *qr = tu_xmalloc((size_t)NH * RP * 4);
    float *m = tu_xmalloc(NH * 4), *l = tu_xmalloc(NH * 4);
    float *acc = tu_xmalloc((size_t)NH * LR * 4);
    float *m2 = tu_xmalloc(NH * 4), *l2 = tu_xmalloc(NH * 4);
    float *acc2 = tu_xmalloc((size_t)NH * LR * 4);
    size_t work_max = 0;

    for (size_t i = 0; i < L * LR; i++)
        c_kv[i] = hd_f32_to_bf16(((float)(lcg(&r) % 65536) / 32768.0f - 1.0f) *
                                 ldexpf(1.0f, (int)(lcg(&r) % 9) - 6));
    for (size_t t = 0; t < L; t++)
        for (int d = 0; d < RP; d++)
            k_rope[t * RP + d] = hd_f32_to_bf16(
                (float)t / (float)L * (d % 2 ? 1.0f : -1.0f) +
                ((float)(lcg(&r) % 65536) / 65536.0f - 0.5f) * 0.25f);
    for (int i = 0; i < NH * LR; i++)   /* 24 significant bits */
        ql[i] = (float)((int)(lcg(&r) & 0xffffff) - 0x800000) / 0x800000 *
                ldexpf(1.0f, (int)(lcg(&r) % 5) - 3);
    for (int h = 0; h < NH; h++)
        for (int d = 0; d < RP; d++)
            qr[h * RP + d] = hd_bf((d % 2 ? 1.0f : -1.0f) * (float)(h % 4) * 0.5f);
    for (int isa = 0; isa < N_ISA; isa++)
        if (isa_ok[isa] && cpu_mla_work(cpu_kernels_for((cpu_isa)isa)) > work_max)
            work_max = cpu_mla_work(cpu_kernels_for((cpu_isa)isa));
    float *work = tu_xmalloc(work_max * 4);

    for (int isa = 0; isa < N_ISA; isa++) {
        if (!isa_ok[isa])
            continue;
        const cpu_kernels *k = cpu_kernels_for((cpu_isa)isa);
        double worst = 0.0, worst_m = 0.0;
        for (size_t i = 0; i < n_ranges; i++) {
            double m_err;
            double e = mla_range_err(k, c_kv, k_rope, ranges[i][0], ranges[i][1], ql, qr,
                                     work, m, l, acc, &m_err);
            ck_assert_msg(e <= 1e-5 && m_err <= 1e-6, "%s [%zu, %zu): latent %.3e, max %.3e",
                          k->name, ranges[i][0], ranges[i][1], e, m_err);
            worst = fmax(worst, e);
            worst_m = fmax(worst_m, m_err);
        }
        printf("mla_range %s: latent rel err %.3e, max %.3e\n", k->name, worst, worst_m);
    }

    /* queries the tile unit cannot take: the plain vector kernel's bits */
    if (isa_ok[3]) {
        const cpu_kernels *kb = cpu_kernels_for(CPU_ISA_AVX512BF16);
        static const float odd[] = { NAN, INFINITY, 0x1p-120f * (1.0f + 0x1p-9f + 0x1p-20f) };
        for (size_t o = 0; o < sizeof odd / sizeof odd[0]; o++) {
            const float keep = ql[5 * LR + 77];
            ql[5 * LR + 77] = odd[o];
            kb->mla_range(c_kv, k_rope, 3, 137, ql, qr, m2, l2, acc2, work);
            for (int isa = 3; isa < N_ISA; isa++) {
                if (!isa_ok[isa])
                    continue;
                cpu_kernels_for((cpu_isa)isa)->mla_range(c_kv, k_rope, 3, 137, ql, qr, m, l,
                                                         acc, work);
                ck_assert_msg(memcmp(m, m2, NH * 4) == 0 && memcmp(l, l2, NH * 4) == 0 &&
                                  memcmp(acc, acc2, (size_t)NH * LR * 4) == 0,
                              "%s, query %g: not the vector kernel's bits",
                              cpu_kernels_for((cpu_isa)isa)->name, (double)odd[o]);
            }
            ql[5 * LR + 77] = keep;
        }
    }
    free(work);
    free(c_kv);
    free(k_rope);
    free(ql);
    free(qr);
    free(m);
    free(l);
    free(acc);
    free(m2);
    free(l2);
    free(acc2);
}
END_TEST

/* A forced ISA the CPU lacks fails model creation; auto avoids nothing. */
START_TEST(test_isa_choice)
{
    hd_options o;
    hd_model *m = NULL;
    char err[256] = "";
    hd_options_init(&o);
    o.backend = HD_BACKEND_CPU;
    o.threads = 2;
    for (int isa = 0; isa < N_ISA; isa++) {
        setenv("HD_CPU_ISA", ISA[isa], 1);
        hd_status st = hd_model_synth(1, 8, "K", &o, &m, err, sizeof err);
        unsetenv("HD_CPU_ISA");
        if (isa_ok[isa]) {
            ck_assert_int_eq(st, HD_OK);
            ck_assert_msg(strstr(hd_model_backend_info(m), ISA[isa]) != NULL,
                          "backend info '%s'", hd_model_backend_info(m));
            ck_assert_msg(strstr(hd_model_backend_info(m), "2 threads") != NULL,
                          "backend info '%s'", hd_model_backend_info(m));
            hd_model_free(m);
        } else {
            ck_assert_int_eq(st, HD_ERR_BACKEND_UNAVAILABLE);
            ck_assert_ptr_null(m);
            ck_assert_msg(strstr(err, ISA[isa]) != NULL, "message '%s'", err);
        }
    }
    setenv("HD_CPU_ISA", "sse9", 1);
    ck_assert_int_eq(hd_model_synth(1, 8, "K", &o, &m, err, sizeof err),
                     HD_ERR_BACKEND_UNAVAILABLE);
    unsetenv("HD_CPU_ISA");
    /* auto: the cpu backend when there is no usable GPU backend */
    o.backend = HD_BACKEND_AUTO;
    ck_assert_int_eq(hd_model_synth(1, 8, "K", &o, &m, err, sizeof err), HD_OK);
    ck_assert_msg(hd_model_backend(m) == HD_BACKEND_CPU ||
                  hd_model_backend(m) == HD_BACKEND_CUDA, "auto chose %s",
                  hd_backend_name(hd_model_backend(m)));
    hd_model_free(m);
}
END_TEST

int main(void)
{
    char err[256];
    if (hd_backend_available(HD_BACKEND_CPU, err, sizeof err) != HD_OK) {
        printf("SKIP: the cpu backend is not available: %s\n", err);
        return 77;
    }
    /* Probing only: the parent must not start OpenMP's threads before
     * Check forks the tests (libgomp's pool does not survive a fork). */
    for (int isa = 0; isa < N_ISA; isa++) {
        setenv("HD_CPU_ISA", ISA[isa], 1);
        isa_ok[isa] = hd_backend_available(HD_BACKEND_CPU, NULL, 0) == HD_OK;
        unsetenv("HD_CPU_ISA");
        if (isa_ok[isa])
            printf("cpu path %s: tested\n", ISA[isa]);
        else
            printf("cpu path %s: SKIP (this CPU, its OS or this build cannot "
                   "run it; the other paths are tested)\n", ISA[isa]);
    }
    Suite *s = suite_create("cpu");
    TCase *tc = tcase_create("cpu_vs_ref");
    tcase_set_timeout(tc, TU_TIMEOUT);
    tcase_add_test(tc, test_isa_choice);
#ifdef HD_HAVE_CPU_BACKEND
    tcase_add_test(tc, test_dot_f64);
    tcase_add_test(tc, test_sweep_next);
    tcase_add_test(tc, test_qmat_normal);
    tcase_add_test(tc, test_absorb);
    tcase_add_test(tc, test_mla_range);
    tcase_add_test(tc, test_bf16_gemv);
#ifdef HD_CPU_HAVE_AVX512BF16
    tcase_add_test(tc, test_f32_gemv);
#endif
#ifdef HD_CPU_HAVE_AMX
    tcase_add_test(tc, test_amx_gemv);
#endif
#endif
    tcase_add_test(tc, test_golden_a);
    tcase_add_test(tc, test_golden_b);
    tcase_add_test(tc, test_contexts);
    tcase_add_test(tc, test_km_e16);
    tcase_add_test(tc, test_mk_e16_short);
    tcase_add_test(tc, test_kkkm_e8_long);
    tcase_add_test(tc, test_kkkm_e64);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
