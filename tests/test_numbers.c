/* test_numbers.c - NaN and infinity in weights and state never become an
 * index or a pointer: the step completes (HD_OK), the state stays usable.
 *
 * - ref_top8 directly: NaN, +-Inf, ties and random logits against a
 *   brute-force ranking (8 distinct indices in [0, E), best first, ties to
 *   the lower index, NaN ranked last).
 * - Weights: a synthetic model whose router rows, scales or norms are
 *   overwritten with NaN or infinity (through the internal model struct),
 *   then stepped.
 * - State: S, conv caches and MLA caches imported with NaN and infinity,
 *   then stepped, exported, reset and stepped again.
 * Run under --enable-sanitizers (ASan+UBSan) and valgrind these show that
 * no such value reaches an index.  At the small size (tu_small: valgrind)
 * each case takes one step before the state is reset or found full instead
 * of two.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "ref/ref.h"
#include "testutil.h"

#define D HD_HIDDEN
#define BF16_NAN 0x7fc0u
#define BF16_INF 0x7f80u
#define BF16_NINF 0xff80u

/* ---- ref_top8 ---------------------------------------------------------------- */

/* a before b in the documented order. */
static bool before(const float *l, int a, int b)
{
    if (isnan(l[a]) != isnan(l[b]))
        return !isnan(l[a]);
    if (!isnan(l[a]) && l[a] != l[b])
        return l[a] > l[b];
    return a < b;
}

static void top8_expect(const float *logits, int experts, const char *what)
{
    int idx[HD_MOE_TOPK], want[HD_MOE_TOPK];
    int *order = tu_xmalloc((size_t)experts * sizeof *order);
    for (int e = 0; e < experts; e++)
        order[e] = e;
    /* Insertion sort by the documented order (small E only). */
    for (int i = 1; i < experts; i++)
        for (int j = i; j > 0 && before(logits, order[j], order[j - 1]); j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    memcpy(want, order, sizeof want);
    free(order);
    for (int j = 0; j < HD_MOE_TOPK; j++)
        idx[j] = -12345;
    ref_top8(logits, experts, idx);
    for (int j = 0; j < HD_MOE_TOPK; j++) {
        ck_assert_msg(idx[j] >= 0 && idx[j] < experts,
                      "%s: idx[%d] = %d out of [0, %d)", what, j, idx[j],
                      experts);
        for (int i = 0; i < j; i++)
            ck_assert_msg(idx[i] != idx[j], "%s: expert %d chosen twice",
                          what, idx[j]);
        ck_assert_msg(idx[j] == want[j], "%s: idx[%d] = %d, expected %d",
                      what, j, idx[j], want[j]);
    }
}

START_TEST(test_top8_patterns)
{
    float l[64];
    const float nan = NAN, inf = INFINITY;

    for (int e = 0; e < 64; e++)
        l[e] = nan;
    top8_expect(l, 8, "8 NaN");
    top8_expect(l, 64, "64 NaN");
    for (int e = 0; e < 64; e++)
        l[e] = 1.0f;
    top8_expect(l, 64, "64 ties");
    for (int e = 0; e < 64; e++)
        l[e] = inf;
    top8_expect(l, 64, "64 +Inf");
    for (int e = 0; e < 64; e++)
        l[e] = -inf;
    top8_expect(l, 64, "64 -Inf");
    for (int e = 0; e < 64; e++)
        l[e] = (e % 3 == 0) ? nan : (e % 3 == 1) ? -inf : 0.0f;
    top8_expect(l, 64, "NaN, -Inf and zeros");
    for (int e = 0; e < 16; e++)
        l[e] = (e < 8) ? nan : -inf; /* NaN ranks below -Inf */
    top8_expect(l, 16, "8 NaN then 8 -Inf");
    for (int e = 0; e < 16; e++)
        l[e] = (e < 12) ? nan : (float)e;
    top8_expect(l, 16, "12 NaN, 4 numbers");
    for (int e = 0; e < 16; e++)
        l[e] = (e & 1) ? -0.0f : 0.0f; /* -0 == +0: a tie */
    top8_expect(l, 16, "signed zeros");
    for (int e = 0; e < 16; e++)
        l[e] = (e == 15) ? inf : (e == 0) ? nan : -1.0f;
    top8_expect(l, 16, "Inf last, NaN first");
    l[0] = nan;
    for (int e = 1; e < 8; e++)
        l[e] = 3.0f;
    top8_expect(l, 8, "E 8 with one NaN");
    /* A NaN with a payload and the sign bit set. */
    {
        uint32_t bits = 0xffc01234u;
        for (int e = 0; e < 12; e++)
            l[e] = (float)e;
        memcpy(&l[11], &bits, sizeof bits);
        top8_expect(l, 12, "negative NaN with payload");
    }
}
END_TEST

START_TEST(test_top8_random)
{
    float l[40];
    uint32_t x = 12345u;
    for (int round = 0; round < 2000; round++) {
        int experts = 8 + (int)(x % 33);
        for (int e = 0; e < experts; e++) {
            x = x * 1664525u + 1013904223u;
            switch ((x >> 24) % 8) {
            case 0: l[e] = NAN; break;
            case 1: l[e] = INFINITY; break;
            case 2: l[e] = -INFINITY; break;
            case 3: l[e] = 0.5f; break; /* frequent ties */
            default: l[e] = (float)((int)(x >> 8) % 2001 - 1000) / 16.0f;
            }
        }
        top8_expect(l, experts, "random logits");
    }
}
END_TEST

/* ---- weights ------------------------------------------------------------------ */

/* Writable view of a tensor the model binds (the synth model owns its
 * buffer, so writing into it is legal in a test). */
static uint16_t *rw(const uint16_t *p)
{
    return (uint16_t *)(uintptr_t)p;
}

static void fill16(const uint16_t *p, size_t n, uint16_t v)
{
    uint16_t *w = rw(p);
    for (size_t i = 0; i < n; i++)
        w[i] = v;
}

/* Steps a fresh state of `m` `steps` times with finite inputs; every step
 * must answer HD_OK.  Returns the number of non-finite output values. */
static size_t run_steps(const hd_model *m, hd_state *s, int steps)
{
    uint16_t in[D], out[D];
    size_t nonfinite = 0;
    for (int k = 0; k < steps; k++) {
        tu_input(9, (uint64_t)k, in);
        tu_step(m, s, in, out);
        for (int i = 0; i < D; i++)
            nonfinite += (out[i] & 0x7f80u) == 0x7f80u;
    }
    return nonfinite;
}

START_TEST(test_weights_nonfinite)
{
    static const struct {
        const char *what;
        int kind; /* 0 router rows, 1 whole router, 2 expert scales,
                     3 moe_norm, 4 mla q_proj zeros, 5 shared scales */
        uint16_t value;
        int experts;
        bool finite; /* the output stays finite */
    } cases[] = {
        /* With E 16, rows ranked last are never among the 8 chosen. */
        {"E16 router rows 0..3 NaN", 0, BF16_NAN, 16, true},
        {"E16 router rows 0..3 -Inf", 0, BF16_NINF, 16, true},
        /* x has both signs: an Inf row gives +Inf + -Inf = a NaN logit. */
        {"E16 router rows 0..3 +Inf", 0, BF16_INF, 16, true},
        /* With E 8 every expert is chosen, the NaN ones too. */
        {"E8 router rows 0..3 NaN", 0, BF16_NAN, 8, false},
        {"E8 whole router NaN", 1, BF16_NAN, 8, false},
        {"E8 whole router +Inf", 1, BF16_INF, 8, false},
        {"E8 expert scales NaN", 2, BF16_NAN, 8, false},
        {"E8 moe_norm Inf", 3, BF16_INF, 8, false},
        {"E8 MLA q_proj zeros NaN", 4, BF16_NAN, 8, false},
        {"E8 shared expert scales -Inf", 5, BF16_NINF, 8, false},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        hd_model *m = tu_synth_ref(7, cases[c].experts, "M");
        hd_layer *L = &m->layers[0];
        const hd_moe_weights *w = &L->moe;
        size_t scales = (size_t)(w->gate.k / 128) * (size_t)w->gate.n;
        switch (cases[c].kind) {
        case 0: fill16(w->router, 4 * (size_t)D, cases[c].value); break;
        case 1:
            fill16(w->router, (size_t)m->experts * D, cases[c].value);
            break;
        case 2:
            fill16(w->gate.scales, (size_t)m->experts * scales, cases[c].value);
            break;
        case 3: fill16(L->moe_norm, D, cases[c].value); break;
        case 4:
            fill16(L->mla.q_proj.zeros,
                   (size_t)(L->mla.q_proj.k / 128) * (size_t)L->mla.q_proj.n,
                   cases[c].value);
            break;
        default:
            fill16(w->s_down.scales,
                   (size_t)(w->s_down.k / 128) * (size_t)w->s_down.n,
                   cases[c].value);
        }
        const int steps = tu_size(2, 1);
        hd_state *s = tu_state_new(m, 4);
        size_t bad = run_steps(m, s, steps);
        ck_assert_uint_eq(hd_state_context(s), (size_t)steps);
        if (cases[c].finite)
            ck_assert_msg(bad == 0, "%s: %zu outputs non-finite",
                          cases[c].what, bad);
        else
            ck_assert_msg(bad > 0, "%s: the value did not propagate",
                          cases[c].what);
        printf("%-28s: step HD_OK, %zu of %d outputs non-finite\n",
               cases[c].what, bad, steps * D);
        /* The state stays usable: reset and step again. */
        ck_assert_int_eq(hd_state_reset(s), HD_OK);
        run_steps(m, s, 1);
        hd_state_free(s);
        hd_model_free(m);
    }
}
END_TEST

/* ---- state --------------------------------------------------------------------- */

static hd_model *g_km; /* synth seed 4, E 8, "KM" */

static void km_setup(void)
{
    g_km = tu_synth_ref(4, 8, "KM");
}

static void km_teardown(void)
{
    hd_model_free(g_km);
    g_km = NULL;
}

START_TEST(test_state_nonfinite)
{
    static const uint32_t f32_values[] = {0x7fc00000u, 0x7f800000u,
                                          0xff800000u, 0xffc00001u};
    static const uint16_t bf_values[] = {BF16_NAN, BF16_INF, BF16_NINF,
                                         0xffc1u};
    const int v = _i;
    const int steps = tu_size(2, 1);
    size_t s_bytes = 0, conv_bytes = 0;
    /* Room for the 2 prefilled rows and the steps: then the cache is full. */
    hd_state *s = tu_state_new(g_km, 2 + (size_t)steps);
    ck_assert_int_eq(hd_state_tensor_bytes(s, 0, HD_STATE_S, &s_bytes), HD_OK);
    ck_assert_int_eq(hd_state_tensor_bytes(s, 0, HD_STATE_CONV_Q, &conv_bytes),
                     HD_OK);

    /* Every other value of S and the conv caches non-finite. */
    uint32_t *S = tu_xcalloc(s_bytes, 1);
    for (size_t i = 0; i < s_bytes / 4; i += 2)
        S[i] = f32_values[v];
    ck_assert_int_eq(hd_state_import(s, 0, HD_STATE_S, S, s_bytes), HD_OK);
    uint16_t *conv = tu_xcalloc(conv_bytes, 1);
    for (size_t i = 0; i < conv_bytes / 2; i += 3)
        conv[i] = bf_values[v];
    ck_assert_int_eq(hd_state_import(s, 0, HD_STATE_CONV_K, conv, conv_bytes),
                     HD_OK);

    /* Two cache rows, one of them entirely non-finite. */
    uint16_t ckv[2 * HD_MLA_KV_LORA], kr[2 * HD_MLA_QK_ROPE];
    ck_assert_int_eq(hd_synth_cache(4, 2, ckv, kr), HD_OK);
    for (int i = 0; i < HD_MLA_KV_LORA; i++)
        ckv[HD_MLA_KV_LORA + i] = bf_values[v];
    for (int i = 0; i < HD_MLA_QK_ROPE; i++)
        kr[i] = bf_values[(v + 1) % 4];
    ck_assert_int_eq(hd_state_prefill(s, 2, ckv, kr), HD_OK);

    size_t bad = run_steps(g_km, s, steps);
    ck_assert_uint_eq(hd_state_context(s), 2 + (size_t)steps);
    printf("state value %#x: steps HD_OK, %zu outputs non-finite\n",
           (unsigned)f32_values[v], bad);

    /* Still usable: full cache is a status, export works, reset clears. */
    uint16_t in[D], out[D];
    tu_input(9, 7, in);
    ck_assert_int_eq(hd_step(g_km, s, in, out), HD_ERR_CACHE_FULL);
    tu_snapshot *snap = tu_snapshot_take(g_km, s);
    tu_snapshot_free(snap);
    ck_assert_int_eq(hd_state_reset(s), HD_OK);
    ck_assert_int_eq(hd_state_prefill(s, 0, NULL, NULL), HD_OK);
    uint16_t a[D], b[D];
    tu_step(g_km, s, in, a);
    hd_state *fresh = tu_state_new(g_km, 4);
    tu_step(g_km, fresh, in, b);
    ck_assert_msg(memcmp(a, b, sizeof a) == 0,
                  "a reset state steps differently from a new one");
    ck_assert(tu_all_finite_bf16(a, D));
    hd_state_free(fresh);
    hd_state_free(s);
    free(S);
    free(conv);
}
END_TEST

static Suite *numbers_suite(void)
{
    Suite *s = suite_create("numbers");
    TCase *tc = tcase_create("top8");
    tcase_add_test(tc, test_top8_patterns);
    tcase_add_test(tc, test_top8_random);
    suite_add_tcase(s, tc);

    tc = tcase_create("weights");
    tcase_set_timeout(tc, TU_TIMEOUT);
    tcase_add_test(tc, test_weights_nonfinite);
    suite_add_tcase(s, tc);

    tc = tcase_create("state");
    tcase_set_timeout(tc, TU_TIMEOUT);
    tcase_add_unchecked_fixture(tc, km_setup, km_teardown);
    tcase_add_loop_test(tc, test_state_nonfinite, 0, 4);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tu_run_suite(numbers_suite());
}
