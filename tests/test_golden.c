/* test_golden.c - the reference backend against the seed kernel's golden
 * vectors (tests/data/golden/{A,B}, layouts in its README.md).
 *
 * Tolerances (SEMANTICS.md, "Agreement"): relative L2 error of every step's
 * output <= 1e-2, of each KDA layer's S <= 1e-2, of each conv cache and of
 * the MLA caches <= 5e-3.  The measured maxima are printed for the docs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define N_KDA 3 /* pattern KKKM: layers 0, 1, 2 are KDA, layer 3 is MLA */
#define MLA_LAYER 3
#define S_ELEMS ((size_t)HD_KDA_HEADS * HD_KDA_HEAD_DIM * HD_KDA_HEAD_DIM)
#define CONV_ELEMS ((size_t)(HD_KDA_CONV - 1) * HD_KDA_HEADS * HD_KDA_HEAD_DIM)

#define TOL_OUT 1e-2
#define TOL_S 1e-2
#define TOL_CACHE 5e-3

typedef struct golden_case {
    const char *name; /* folder under golden/ */
    uint32_t seed;
    int experts;
    size_t context;
    size_t steps;
} golden_case;

static const golden_case CASE_A = {"A", 1, 16, 0, 8};
static const golden_case CASE_B = {"B", 2, 64, 300, 4};

static void *load_golden(const golden_case *gc, const char *file,
                         size_t bytes)
{
    char rel[256];
    snprintf(rel, sizeof rel, "golden/%s/%s", gc->name, file);
    return tu_load_data_sized(rel, bytes);
}

/* Checks case.txt against the parameters compiled in here. */
static void check_case_txt(const golden_case *gc)
{
    char rel[256];
    size_t bytes = 0;
    snprintf(rel, sizeof rel, "golden/%s/case.txt", gc->name);
    char *txt = tu_load_data(rel, &bytes);
    char *z = tu_xmalloc(bytes + 1);
    memcpy(z, txt, bytes);
    z[bytes] = '\0';
    free(txt);
    char want[64];
    snprintf(want, sizeof want, "seed=%u\n", (unsigned)gc->seed);
    ck_assert_msg(strstr(z, want) != NULL, "%s: case.txt lacks '%s'", rel,
                  "seed");
    snprintf(want, sizeof want, "experts=%d\n", gc->experts);
    ck_assert_msg(strstr(z, want) != NULL, "%s: case.txt lacks experts", rel);
    snprintf(want, sizeof want, "context=%zu\n", gc->context);
    ck_assert_msg(strstr(z, want) != NULL, "%s: case.txt lacks context", rel);
    snprintf(want, sizeof want, "steps=%zu\n", gc->steps);
    ck_assert_msg(strstr(z, want) != NULL, "%s: case.txt lacks steps", rel);
    ck_assert_msg(strstr(z, "pattern=KKKM") != NULL,
                  "%s: case.txt lacks pattern=KKKM", rel);
    free(z);
}

static void export_tensor(const hd_state *state, int layer,
                          hd_state_tensor which, void *dst, size_t bytes)
{
    size_t have = 0;
    hd_status st = hd_state_tensor_bytes(state, layer, which, &have);
    ck_assert_msg(st == HD_OK, "hd_state_tensor_bytes(%d, %d) = %d (%s)",
                  layer, (int)which, (int)st, hd_status_string(st));
    ck_assert_msg(have == bytes, "layer %d tensor %d: %zu bytes, expected %zu",
                  layer, (int)which, have, bytes);
    st = hd_state_export(state, layer, which, dst, bytes);
    ck_assert_msg(st == HD_OK, "hd_state_export(%d, %d) = %d (%s)", layer,
                  (int)which, (int)st, hd_status_string(st));
}

static void run_case(const golden_case *gc)
{
    const size_t D = HD_HIDDEN;
    const size_t rows = gc->context + gc->steps;

    check_case_txt(gc);
    uint16_t *g_out = load_golden(gc, "out.bf16", gc->steps * D * 2);
    float *g_s = load_golden(gc, "S.f32", N_KDA * S_ELEMS * 4);
    uint16_t *g_conv = load_golden(gc, "conv.bf16", N_KDA * 3 * CONV_ELEMS * 2);
    uint16_t *g_ckv = load_golden(gc, "c_kv.bf16", rows * HD_MLA_KV_LORA * 2);
    uint16_t *g_kr = load_golden(gc, "k_rope.bf16", rows * HD_MLA_QK_ROPE * 2);
    tu_le16_to_host(g_out, gc->steps * D);
    tu_le32_to_host((uint32_t *)g_s, N_KDA * S_ELEMS);
    tu_le16_to_host(g_conv, N_KDA * 3 * CONV_ELEMS);
    tu_le16_to_host(g_ckv, rows * HD_MLA_KV_LORA);
    tu_le16_to_host(g_kr, rows * HD_MLA_QK_ROPE);

    hd_model *model = tu_synth_ref(gc->seed, gc->experts, "KKKM");
    ck_assert_int_eq(hd_model_experts(model), gc->experts);
    ck_assert_int_eq(hd_model_layers(model), 4);
    ck_assert_str_eq(hd_model_pattern(model), "KKKM");
    hd_state *state = tu_state_new(model, rows + 4);

    if (gc->context > 0) {
        uint16_t *ckv = tu_xmalloc(gc->context * HD_MLA_KV_LORA * 2);
        uint16_t *kr = tu_xmalloc(gc->context * HD_MLA_QK_ROPE * 2);
        ck_assert_int_eq(hd_synth_cache(gc->seed, gc->context, ckv, kr), HD_OK);
        /* The golden caches start with the prefilled rows. */
        ck_assert_msg(memcmp(ckv, g_ckv, gc->context * HD_MLA_KV_LORA * 2) == 0,
                      "case %s: hd_synth_cache c_kv differs from the golden "
                      "prefix", gc->name);
        ck_assert_msg(memcmp(kr, g_kr, gc->context * HD_MLA_QK_ROPE * 2) == 0,
                      "case %s: hd_synth_cache k_rope differs from the golden "
                      "prefix", gc->name);
        hd_status st = hd_state_prefill(state, gc->context, ckv, kr);
        ck_assert_msg(st == HD_OK, "hd_state_prefill(%zu) = %d (%s)",
                      gc->context, (int)st, hd_status_string(st));
        free(ckv);
        free(kr);
    }
    ck_assert_uint_eq(hd_state_context(state), gc->context);

    /* Steps. */
    uint16_t in[HD_HIDDEN], out[HD_HIDDEN];
    double max_out = 0.0;
    size_t worst_step = 0;
    for (size_t t = 0; t < gc->steps; t++) {
        tu_input(gc->seed, t, in);
        tu_step(model, state, in, out);
        /* NaN or Inf give a NaN/Inf error, which fails the check below. */
        double e = tu_rel_l2_bf16(out, g_out + t * D, D);
        printf("golden %s: step %zu output rel L2 %.3e\n", gc->name, t, e);
        if (!(e <= max_out)) { /* NaN counts as worst */
            max_out = e;
            worst_step = t;
        }
    }
    ck_assert_uint_eq(hd_state_context(state), gc->context + gc->steps);

    /* KDA state. */
    float *s = tu_xmalloc(S_ELEMS * 4);
    uint16_t *conv = tu_xmalloc(CONV_ELEMS * 2);
    double max_s = 0.0, max_conv = 0.0;
    int worst_s = 0, worst_conv = 0;
    static const hd_state_tensor conv_which[3] = {
        HD_STATE_CONV_Q, HD_STATE_CONV_K, HD_STATE_CONV_V};
    static const char *const conv_name[3] = {"q", "k", "v"};
    for (int l = 0; l < N_KDA; l++) {
        export_tensor(state, l, HD_STATE_S, s, S_ELEMS * 4);
        double e = tu_rel_l2_f32(s, g_s + (size_t)l * S_ELEMS, S_ELEMS);
        printf("golden %s: layer %d S rel L2 %.3e\n", gc->name, l, e);
        if (!(e <= max_s)) {
            max_s = e;
            worst_s = l;
        }
        for (int j = 0; j < 3; j++) {
            export_tensor(state, l, conv_which[j], conv, CONV_ELEMS * 2);
            e = tu_rel_l2_bf16(conv, g_conv + ((size_t)l * 3 + j) * CONV_ELEMS,
                               CONV_ELEMS);
            printf("golden %s: layer %d conv %s rel L2 %.3e\n", gc->name, l,
                   conv_name[j], e);
            if (!(e <= max_conv)) {
                max_conv = e;
                worst_conv = l * 3 + j;
            }
        }
    }
    free(s);
    free(conv);

    /* MLA caches. */
    uint16_t *ckv = tu_xmalloc(rows * HD_MLA_KV_LORA * 2);
    uint16_t *kr = tu_xmalloc(rows * HD_MLA_QK_ROPE * 2);
    export_tensor(state, MLA_LAYER, HD_STATE_C_KV, ckv,
                  rows * HD_MLA_KV_LORA * 2);
    export_tensor(state, MLA_LAYER, HD_STATE_K_ROPE, kr,
                  rows * HD_MLA_QK_ROPE * 2);
    double e_ckv = tu_rel_l2_bf16(ckv, g_ckv, rows * HD_MLA_KV_LORA);
    double e_kr = tu_rel_l2_bf16(kr, g_kr, rows * HD_MLA_QK_ROPE);
    /* The rows appended by the steps alone (the prefix is exact input). */
    double e_ckv_new = tu_rel_l2_bf16(ckv + gc->context * HD_MLA_KV_LORA,
                                      g_ckv + gc->context * HD_MLA_KV_LORA,
                                      gc->steps * HD_MLA_KV_LORA);
    double e_kr_new = tu_rel_l2_bf16(kr + gc->context * HD_MLA_QK_ROPE,
                                     g_kr + gc->context * HD_MLA_QK_ROPE,
                                     gc->steps * HD_MLA_QK_ROPE);
    printf("golden %s (seed %u, E %d, context %zu, %zu steps): "
           "output max %.3e (step %zu), S max %.3e, conv max %.3e, "
           "c_kv %.3e (new rows %.3e), k_rope %.3e (new rows %.3e)\n",
           gc->name, (unsigned)gc->seed, gc->experts, gc->context, gc->steps,
           max_out, worst_step, max_s, max_conv, e_ckv, e_ckv_new, e_kr,
           e_kr_new);
    fflush(stdout);

    ck_assert_msg(max_out <= TOL_OUT,
                  "case %s step %zu: output rel L2 error %.3e > %.0e",
                  gc->name, worst_step, max_out, TOL_OUT);
    ck_assert_msg(max_s <= TOL_S, "case %s layer %d: S rel L2 %.3e > %.0e",
                  gc->name, worst_s, max_s, TOL_S);
    ck_assert_msg(max_conv <= TOL_CACHE,
                  "case %s layer %d: conv %s rel L2 %.3e > %.0e", gc->name,
                  worst_conv / 3, conv_name[worst_conv % 3], max_conv,
                  TOL_CACHE);
    ck_assert_msg(e_ckv <= TOL_CACHE, "case %s: c_kv rel L2 %.3e > %.0e",
                  gc->name, e_ckv, TOL_CACHE);
    ck_assert_msg(e_kr <= TOL_CACHE, "case %s: k_rope rel L2 %.3e > %.0e",
                  gc->name, e_kr, TOL_CACHE);
    ck_assert_msg(e_ckv_new <= TOL_CACHE,
                  "case %s: new c_kv rows rel L2 %.3e > %.0e", gc->name,
                  e_ckv_new, TOL_CACHE);
    ck_assert_msg(e_kr_new <= TOL_CACHE,
                  "case %s: new k_rope rows rel L2 %.3e > %.0e", gc->name,
                  e_kr_new, TOL_CACHE);
    if (gc->context > 0) {
        ck_assert_msg(memcmp(ckv, g_ckv, gc->context * HD_MLA_KV_LORA * 2) == 0,
                      "case %s: the prefilled c_kv rows changed", gc->name);
        ck_assert_msg(memcmp(kr, g_kr, gc->context * HD_MLA_QK_ROPE * 2) == 0,
                      "case %s: the prefilled k_rope rows changed", gc->name);
    }

    free(ckv);
    free(kr);
    hd_state_free(state);
    hd_model_free(model);
    free(g_out);
    free(g_s);
    free(g_conv);
    free(g_ckv);
    free(g_kr);
}

START_TEST(test_golden_a)
{
    run_case(&CASE_A);
}
END_TEST

START_TEST(test_golden_b)
{
    run_case(&CASE_B);
}
END_TEST

static Suite *golden_suite(void)
{
    Suite *s = suite_create("golden");
    TCase *tc = tcase_create("reference");
    tcase_set_timeout(tc, TU_TIMEOUT);
    tcase_add_test(tc, test_golden_a);
    tcase_add_test(tc, test_golden_b);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tu_run_suite(golden_suite());
}
