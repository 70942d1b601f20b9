/* test_state.c - decode state: export/import, prefill, reset, sizes, a full
 * cache, and a sweep of contexts around the seed's KV-split boundaries.
 * At the small size (tu_small: valgrind) the round trips take 1 step where
 * they take 2 and the sweep covers 3 contexts instead of 9. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "util.h"

#define D HD_HIDDEN
#define CKV_ROW ((size_t)HD_MLA_KV_LORA)
#define KR_ROW ((size_t)HD_MLA_QK_ROPE)
#define S_BYTES ((size_t)HD_KDA_HEADS * HD_KDA_HEAD_DIM * HD_KDA_HEAD_DIM * 4)
#define CONV_BYTES ((size_t)(HD_KDA_CONV - 1) * 4096 * 2)

/* Runs steps [first, first + n) of seed's inputs; outputs go to outs
 * (n rows of D) when outs is not NULL. */
static void run_steps(const hd_model *model, hd_state *state, uint32_t seed,
                      uint64_t first, size_t n, uint16_t *outs)
{
    uint16_t in[D], out[D];
    for (size_t i = 0; i < n; i++) {
        tu_input(seed, first + i, in);
        tu_step(model, state, in, out);
        if (outs)
            memcpy(outs + i * D, out, sizeof out);
    }
}

/* Prefills `rows` rows from hd_synth_cache(seed) into every MLA layer (the
 * m-th MLA layer gets seed + m, so layers differ). */
static void prefill_synth(const hd_model *model, hd_state *state,
                          uint32_t seed, size_t rows)
{
    int n_mla = tu_n_mla(model);
    uint16_t *ckv = NULL, *kr = NULL;
    if (rows > 0 && n_mla > 0) {
        ckv = tu_xmalloc((size_t)n_mla * rows * CKV_ROW * 2);
        kr = tu_xmalloc((size_t)n_mla * rows * KR_ROW * 2);
        for (int m = 0; m < n_mla; m++)
            ck_assert_int_eq(hd_synth_cache(seed + (uint32_t)m, rows,
                                             ckv + (size_t)m * rows * CKV_ROW,
                                             kr + (size_t)m * rows * KR_ROW),
                             HD_OK);
    }
    hd_status st = hd_state_prefill(state, rows, ckv, kr);
    ck_assert_msg(st == HD_OK, "hd_state_prefill(%zu rows) = %d (%s)", rows,
                  (int)st, hd_status_string(st));
    ck_assert_uint_eq(hd_state_context(state), rows);
    free(ckv);
    free(kr);
}

/* ---- export / import ---------------------------------------------------- */

/* Step, export everything, step further (the detour), import it back and
 * step again: the same outputs and the same state, bit for bit. */
START_TEST(test_export_import_roundtrip)
{
    const size_t n = (size_t)tu_size(2, 1); /* steps before and after */
    hd_model *model = tu_synth_ref(5, 8, "KM");
    hd_state *state = tu_state_new(model, 16);
    uint16_t first[2 * D], again[2 * D];

    run_steps(model, state, 5, 0, n, NULL);
    tu_snapshot *at2 = tu_snapshot_take(model, state);
    ck_assert_uint_eq(at2->context, n);

    run_steps(model, state, 5, n, n, first); /* the detour */
    tu_snapshot *at4 = tu_snapshot_take(model, state);
    ck_assert_uint_eq(hd_state_context(state), 2 * n);
    ck_assert_msg(!tu_snapshot_equal(at2, at4), "steps did not change the state");

    tu_snapshot_restore(state, at2);
    ck_assert_uint_eq(hd_state_context(state), n);
    tu_snapshot *back = tu_snapshot_take(model, state);
    ck_assert_msg(tu_snapshot_equal(at2, back),
                  "export after import differs from what was imported");

    run_steps(model, state, 5, n, n, again);
    ck_assert_msg(memcmp(first, again, n * D * 2) == 0,
                  "outputs after restoring the state differ from the first run");
    tu_snapshot *again4 = tu_snapshot_take(model, state);
    ck_assert_msg(tu_snapshot_equal(at4, again4),
                  "state after restoring and stepping differs from the first run");

    tu_snapshot_free(at2);
    tu_snapshot_free(at4);
    tu_snapshot_free(back);
    tu_snapshot_free(again4);
    hd_state_free(state);
    hd_model_free(model);
}
END_TEST

/* Copy state 1 into a fresh state 2 (other capacity) through export/import:
 * both then produce the same outputs and states. */
START_TEST(test_copy_to_second_state)
{
    const size_t n = (size_t)tu_size(2, 1); /* steps before and after */
    hd_model *model = tu_synth_ref(6, 8, "KM");
    hd_state *s1 = tu_state_new(model, 12);
    hd_state *s2 = tu_state_new(model, 7);
    uint16_t o1[2 * D], o2[2 * D];

    run_steps(model, s1, 6, 0, n, NULL);
    tu_snapshot *snap = tu_snapshot_take(model, s1);
    tu_snapshot_restore(s2, snap);
    ck_assert_uint_eq(hd_state_context(s2), n);
    ck_assert_uint_eq(hd_state_capacity(s2), 7);
    tu_snapshot *snap2 = tu_snapshot_take(model, s2);
    ck_assert_msg(tu_snapshot_equal(snap, snap2), "the copy differs");

    run_steps(model, s1, 6, n, n, o1);
    run_steps(model, s2, 6, n, n, o2);
    ck_assert_msg(memcmp(o1, o2, n * D * 2) == 0,
                  "a copied state gives other outputs than the original");
    tu_snapshot *f1 = tu_snapshot_take(model, s1);
    tu_snapshot *f2 = tu_snapshot_take(model, s2);
    ck_assert_msg(tu_snapshot_equal(f1, f2), "states diverged after the copy");

    tu_snapshot_free(snap);
    tu_snapshot_free(snap2);
    tu_snapshot_free(f1);
    tu_snapshot_free(f2);
    hd_state_free(s1);
    hd_state_free(s2);
    hd_model_free(model);
}
END_TEST

/* hd_state_prefill with R rows, versus prefill with zero rows then
 * hd_state_import of the same tensors per layer: same state, same step.
 * Two MLA layers check the [n_mla][rows][...] layout of prefill; a step
 * before the prefill checks that prefill leaves the KDA state alone. */
START_TEST(test_prefill_equals_import)
{
    const size_t R = 5;
    hd_model *model = tu_synth_ref(4, 8, "KMM");
    ck_assert_int_eq(tu_n_mla(model), 2);
    hd_state *a = tu_state_new(model, 16);
    hd_state *b = tu_state_new(model, 16);
    uint16_t oa[D], ob[D];

    /* Per-layer caches: layer 1 from synth seed 11, layer 2 from seed 12. */
    uint16_t *ckv = tu_xmalloc(2 * R * CKV_ROW * 2);
    uint16_t *kr = tu_xmalloc(2 * R * KR_ROW * 2);
    for (int m = 0; m < 2; m++)
        ck_assert_int_eq(hd_synth_cache(11 + (uint32_t)m, R,
                                         ckv + (size_t)m * R * CKV_ROW,
                                         kr + (size_t)m * R * KR_ROW),
                         HD_OK);
    ck_assert_msg(memcmp(ckv, ckv + R * CKV_ROW, R * CKV_ROW * 2) != 0,
                  "the two layers' caches should differ");

    run_steps(model, a, 4, 0, 1, NULL);
    run_steps(model, b, 4, 0, 1, NULL);
    tu_snapshot *kda_before = tu_snapshot_take(model, a);

    /* a: prefill with the rows. */
    ck_assert_int_eq(hd_state_prefill(a, R, ckv, kr), HD_OK);
    ck_assert_uint_eq(hd_state_context(a), R);
    tu_snapshot *sa = tu_snapshot_take(model, a);
    ck_assert_msg(memcmp(sa->data[0][HD_STATE_S], kda_before->data[0][HD_STATE_S],
                         S_BYTES) == 0,
                  "hd_state_prefill changed the KDA state S");
    for (int w = HD_STATE_CONV_Q; w <= HD_STATE_CONV_V; w++)
        ck_assert_msg(memcmp(sa->data[0][w], kda_before->data[0][w],
                             CONV_BYTES) == 0,
                      "hd_state_prefill changed conv cache %d", w);
    for (int m = 0; m < 2; m++) {
        ck_assert_msg(memcmp(sa->data[1 + m][HD_STATE_C_KV],
                             ckv + (size_t)m * R * CKV_ROW, R * CKV_ROW * 2) == 0,
                      "layer %d: exported c_kv is not the prefilled block %d",
                      1 + m, m);
        ck_assert_msg(memcmp(sa->data[1 + m][HD_STATE_K_ROPE],
                             kr + (size_t)m * R * KR_ROW, R * KR_ROW * 2) == 0,
                      "layer %d: exported k_rope is not the prefilled block %d",
                      1 + m, m);
    }

    /* b: set the context with zero rows, then import each layer. */
    uint16_t *zc = tu_xcalloc(2 * R * CKV_ROW, 2);
    uint16_t *zr = tu_xcalloc(2 * R * KR_ROW, 2);
    ck_assert_int_eq(hd_state_prefill(b, R, zc, zr), HD_OK);
    free(zc);
    free(zr);
    ck_assert_uint_eq(hd_state_context(b), R);
    for (int m = 0; m < 2; m++) {
        ck_assert_int_eq(hd_state_import(b, 1 + m, HD_STATE_C_KV,
                                         ckv + (size_t)m * R * CKV_ROW,
                                         R * CKV_ROW * 2),
                         HD_OK);
        ck_assert_int_eq(hd_state_import(b, 1 + m, HD_STATE_K_ROPE,
                                         kr + (size_t)m * R * KR_ROW,
                                         R * KR_ROW * 2),
                         HD_OK);
    }
    tu_snapshot *sb = tu_snapshot_take(model, b);
    ck_assert_msg(tu_snapshot_equal(sa, sb),
                  "prefill and prefill+import give different states");

    tu_input(4, 1, oa);
    memcpy(ob, oa, sizeof ob);
    tu_step(model, a, oa, oa);
    tu_step(model, b, ob, ob);
    ck_assert_msg(memcmp(oa, ob, sizeof oa) == 0,
                  "prefill and import give different outputs");
    ck_assert_uint_eq(hd_state_context(a), R + 1);
    ck_assert_uint_eq(hd_state_context(b), R + 1);

    /* rows == 0 empties the caches; NULL pointers are then fine. */
    ck_assert_int_eq(hd_state_prefill(a, 0, NULL, NULL), HD_OK);
    ck_assert_uint_eq(hd_state_context(a), 0);
    size_t bytes = 1;
    ck_assert_int_eq(hd_state_tensor_bytes(a, 1, HD_STATE_C_KV, &bytes), HD_OK);
    ck_assert_uint_eq(bytes, 0);

    free(ckv);
    free(kr);
    tu_snapshot_free(kda_before);
    tu_snapshot_free(sa);
    tu_snapshot_free(sb);
    hd_state_free(a);
    hd_state_free(b);
    hd_model_free(model);
}
END_TEST

/* ---- reset --------------------------------------------------------------- */

START_TEST(test_reset)
{
    hd_model *model = tu_synth_ref(8, 8, "KM");
    hd_state *fresh = tu_state_new(model, 10);
    hd_state *used = tu_state_new(model, 10);
    uint16_t ref0[D], out[D], in[D];

    tu_snapshot *empty = tu_snapshot_take(model, fresh);
    tu_input(8, 0, in);
    tu_step(model, fresh, in, ref0);

    const size_t n = (size_t)tu_size(2, 1);
    prefill_synth(model, used, 1, 4);
    run_steps(model, used, 8, 0, n, NULL);
    ck_assert_uint_eq(hd_state_context(used), 4 + n);

    ck_assert_int_eq(hd_state_reset(used), HD_OK);
    ck_assert_uint_eq(hd_state_context(used), 0);
    ck_assert_uint_eq(hd_state_capacity(used), 10);
    tu_snapshot *after = tu_snapshot_take(model, used);
    ck_assert_msg(tu_snapshot_equal(empty, after),
                  "a reset state differs from a new one");
    const float *s = after->data[0][HD_STATE_S];
    for (size_t i = 0; i < S_BYTES / 4; i++)
        ck_assert_msg(s[i] == 0.0f, "S[%zu] = %g after reset", i, (double)s[i]);

    tu_step(model, used, in, out);
    ck_assert_msg(memcmp(out, ref0, sizeof out) == 0,
                  "the first step after reset differs from a new state's");

    tu_snapshot_free(empty);
    tu_snapshot_free(after);
    hd_state_free(fresh);
    hd_state_free(used);
    hd_model_free(model);
}
END_TEST

/* ---- sizes --------------------------------------------------------------- */

static void expect_bytes(const hd_state *state, int layer,
                         hd_state_tensor which, size_t want)
{
    size_t bytes = 12345;
    hd_status st = hd_state_tensor_bytes(state, layer, which, &bytes);
    ck_assert_msg(st == HD_OK, "hd_state_tensor_bytes(%d, %d) = %d (%s)",
                  layer, (int)which, (int)st, hd_status_string(st));
    ck_assert_msg(bytes == want, "layer %d tensor %d: %zu bytes, expected %zu",
                  layer, (int)which, bytes, want);
}

static void expect_invalid(const hd_state *state, int layer, int which)
{
    size_t bytes = 0;
    hd_status st =
        hd_state_tensor_bytes(state, layer, (hd_state_tensor)which, &bytes);
    ck_assert_msg(st == HD_ERR_INVALID_ARGUMENT,
                  "hd_state_tensor_bytes(layer %d, tensor %d) = %d (%s), "
                  "expected HD_ERR_INVALID_ARGUMENT",
                  layer, which, (int)st, hd_status_string(st));
}

START_TEST(test_tensor_bytes)
{
    hd_model *model = tu_synth_ref(9, 8, "KM");
    hd_state *state = tu_state_new(model, 20);
    const int K = 0, M = 1;

    expect_bytes(state, K, HD_STATE_S, 32u * 128 * 128 * 4);
    ck_assert_uint_eq(S_BYTES, 2097152u);
    expect_bytes(state, K, HD_STATE_CONV_Q, 3u * 4096 * 2);
    expect_bytes(state, K, HD_STATE_CONV_K, 3u * 4096 * 2);
    expect_bytes(state, K, HD_STATE_CONV_V, 3u * 4096 * 2);
    expect_bytes(state, M, HD_STATE_C_KV, 0);
    expect_bytes(state, M, HD_STATE_K_ROPE, 0);

    prefill_synth(model, state, 1, 7);
    expect_bytes(state, M, HD_STATE_C_KV, 7u * 512 * 2);
    expect_bytes(state, M, HD_STATE_K_ROPE, 7u * 64 * 2);
    expect_bytes(state, K, HD_STATE_S, 32u * 128 * 128 * 4);

    run_steps(model, state, 9, 0, 1, NULL);
    expect_bytes(state, M, HD_STATE_C_KV, 8u * 512 * 2);
    expect_bytes(state, M, HD_STATE_K_ROPE, 8u * 64 * 2);

    /* Tensors the layer does not have. */
    expect_invalid(state, M, HD_STATE_S);
    expect_invalid(state, M, HD_STATE_CONV_Q);
    expect_invalid(state, M, HD_STATE_CONV_K);
    expect_invalid(state, M, HD_STATE_CONV_V);
    expect_invalid(state, K, HD_STATE_C_KV);
    expect_invalid(state, K, HD_STATE_K_ROPE);
    /* Layers out of range, unknown tensors. */
    int n = hd_model_layers(model);
    ck_assert_int_eq(n, 2);
    for (int w = 0; w < TU_N_STATE_TENSORS; w++) {
        expect_invalid(state, -1, w);
        expect_invalid(state, n, w);
        expect_invalid(state, 1000000, w);
    }
    expect_invalid(state, K, 6);
    expect_invalid(state, K, -1);
    expect_invalid(state, M, 99);
    /* NULLs. */
    size_t bytes = 0;
    ck_assert_int_eq(hd_state_tensor_bytes(NULL, K, HD_STATE_S, &bytes),
                     HD_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(hd_state_tensor_bytes(state, K, HD_STATE_S, NULL),
                     HD_ERR_INVALID_ARGUMENT);

    hd_state_free(state);
    hd_model_free(model);
}
END_TEST

/* ---- a full cache ------------------------------------------------------- */

START_TEST(test_cache_full)
{
    hd_model *model = tu_synth_ref(10, 8, "KM");
    const size_t C = 4;
    hd_state *state = tu_state_new(model, C);
    uint16_t in[D], out[D], guard[D];
    tu_input(10, 0, in);

    /* Step once so the KDA state is not all zero, then fill the cache. */
    run_steps(model, state, 10, 0, 1, NULL);
    prefill_synth(model, state, 1, C);
    ck_assert_uint_eq(hd_state_capacity(state), C);
    tu_snapshot *before = tu_snapshot_take(model, state);

    for (size_t i = 0; i < D; i++)
        guard[i] = (uint16_t)(0xa5a5u ^ i);
    memcpy(out, guard, sizeof out);
    hd_status st = hd_step(model, state, in, out);
    ck_assert_msg(st == HD_ERR_CACHE_FULL,
                  "hd_step at context == capacity = %d (%s), expected "
                  "HD_ERR_CACHE_FULL", (int)st, hd_status_string(st));
    ck_assert_msg(memcmp(out, guard, sizeof out) == 0,
                  "hd_step wrote the output buffer although it failed");
    ck_assert_uint_eq(hd_state_context(state), C);
    tu_snapshot *after = tu_snapshot_take(model, state);
    ck_assert_msg(tu_snapshot_equal(before, after),
                  "a failed step (cache full) changed the state");
    tu_snapshot_free(after);

    /* In place too. */
    uint16_t inout[D];
    memcpy(inout, in, sizeof inout);
    ck_assert_int_eq(hd_step(model, state, inout, inout), HD_ERR_CACHE_FULL);
    ck_assert_msg(memcmp(inout, in, sizeof in) == 0,
                  "a failed in-place step changed the buffer");

    /* Prefill beyond the capacity. */
    size_t rows = C + 1;
    uint16_t *ckv = tu_xcalloc(rows * CKV_ROW, 2);
    uint16_t *kr = tu_xcalloc(rows * KR_ROW, 2);
    st = hd_state_prefill(state, rows, ckv, kr);
    ck_assert_msg(st == HD_ERR_CACHE_FULL,
                  "hd_state_prefill(capacity + 1 rows) = %d (%s), expected "
                  "HD_ERR_CACHE_FULL", (int)st, hd_status_string(st));
    after = tu_snapshot_take(model, state);
    ck_assert_msg(tu_snapshot_equal(before, after),
                  "a failed prefill changed the state");
    tu_snapshot_free(after);
    free(ckv);
    free(kr);

    /* Filling up by stepping: capacity 2 takes two steps, not three. */
    hd_state *small = tu_state_new(model, 2);
    run_steps(model, small, 10, 0, 2, NULL);
    tu_snapshot *full = tu_snapshot_take(model, small);
    memcpy(out, guard, sizeof out);
    ck_assert_int_eq(hd_step(model, small, in, out), HD_ERR_CACHE_FULL);
    ck_assert_msg(memcmp(out, guard, sizeof out) == 0,
                  "hd_step wrote the output buffer although it failed");
    after = tu_snapshot_take(model, small);
    ck_assert_msg(tu_snapshot_equal(full, after),
                  "a failed step (cache full) changed the state");
    tu_snapshot_free(after);
    tu_snapshot_free(full);
    /* After a reset it steps again. */
    ck_assert_int_eq(hd_state_reset(small), HD_OK);
    tu_step(model, small, in, out);
    hd_state_free(small);

    tu_snapshot_free(before);
    hd_state_free(state);
    hd_model_free(model);
}
END_TEST

/* Capacity 0: no room for an MLA layer, fine for a model without any. */
START_TEST(test_capacity_zero)
{
    uint16_t in[D], out[D];
    tu_input(12, 0, in);

    hd_model *m_only = tu_synth_ref(12, 8, "M");
    hd_state *s = tu_state_new(m_only, 0);
    ck_assert_int_eq(hd_step(m_only, s, in, out), HD_ERR_CACHE_FULL);
    ck_assert_uint_eq(hd_state_context(s), 0);
    hd_state_free(s);
    hd_model_free(m_only);

    hd_model *k_only = tu_synth_ref(12, 8, "K");
    s = tu_state_new(k_only, 0);
    for (int i = 0; i < 2; i++) {
        hd_status st = hd_step(k_only, s, in, out);
        ck_assert_msg(st == HD_OK,
                      "a KDA-only model with capacity 0: step %d = %d (%s)", i,
                      (int)st, hd_status_string(st));
        ck_assert(tu_all_finite_bf16(out, D));
        /* The context is the position of the next token, MLA or not. */
        ck_assert_uint_eq(hd_state_context(s), (size_t)i + 1);
    }
    hd_state_free(s);
    hd_model_free(k_only);
}
END_TEST

/* ---- contexts ------------------------------------------------------------ */

static hd_model *g_kkkm; /* E=8 KKKM, made once for the context sweep */

static void kkkm_setup(void)
{
    g_kkkm = tu_synth_ref(1, 8, "KKKM");
}

static void kkkm_teardown(void)
{
    hd_model_free(g_kkkm);
    g_kkkm = NULL;
}

/* Contexts around the seed's split boundaries (96 = 3 * 32, 128 = one block
 * of 4 splits) give finite outputs, and the output depends on the context.
 * The reference has no branch on the context: the small size keeps the
 * ends and one block boundary. */
START_TEST(test_contexts)
{
    static const size_t ctx_full[] = {0, 1, 5, 95, 96, 97, 128, 129, 300};
    static const size_t ctx_small[] = {0, 1, 129};
    const size_t *ctx = tu_small() ? ctx_small : ctx_full;
    const size_t N = tu_small() ? sizeof ctx_small / sizeof ctx_small[0]
                                : sizeof ctx_full / sizeof ctx_full[0];
    ck_assert_ptr_ne(g_kkkm, NULL);
    uint16_t *first = tu_xmalloc(N * D * 2);
    uint16_t out2[D];

    for (size_t c = 0; c < N; c++) {
        hd_state *state = tu_state_new(g_kkkm, ctx[c] + 2);
        prefill_synth(g_kkkm, state, 1, ctx[c]);
        uint16_t in[D];
        tu_input(1, 0, in);
        tu_step(g_kkkm, state, in, first + c * D);
        tu_input(1, 1, in);
        tu_step(g_kkkm, state, in, out2);
        ck_assert_uint_eq(hd_state_context(state), ctx[c] + 2);
        ck_assert_msg(tu_all_finite_bf16(first + c * D, D),
                      "context %zu: step 0 output not finite", ctx[c]);
        ck_assert_msg(tu_all_finite_bf16(out2, D),
                      "context %zu: step 1 output not finite", ctx[c]);
        tu_snapshot *snap = tu_snapshot_take(g_kkkm, state);
        for (int l = 0; l < 3; l++)
            ck_assert_msg(tu_all_finite_f32(snap->data[l][HD_STATE_S],
                                            S_BYTES / 4),
                          "context %zu: layer %d S not finite", ctx[c], l);
        ck_assert_msg(tu_all_finite_bf16(snap->data[3][HD_STATE_C_KV],
                                         (ctx[c] + 2) * CKV_ROW),
                      "context %zu: c_kv not finite", ctx[c]);
        ck_assert_msg(tu_all_finite_bf16(snap->data[3][HD_STATE_K_ROPE],
                                         (ctx[c] + 2) * KR_ROW),
                      "context %zu: k_rope not finite", ctx[c]);
        tu_snapshot_free(snap);
        hd_state_free(state);
        printf("context %zu: ok\n", ctx[c]);
        fflush(stdout);
    }
    for (size_t i = 0; i < N; i++)
        for (size_t j = i + 1; j < N; j++)
            ck_assert_msg(memcmp(first + i * D, first + j * D, D * 2) != 0,
                          "contexts %zu and %zu give the same output: the "
                          "attention does not read the cache",
                          ctx[i], ctx[j]);
    free(first);
}
END_TEST

/* ---- the allocator of the state's (and the weights') buffers ------------- */

/* hd_alloc_aligned: zeroed, on a cache line, and from HD_HUGE_BYTES on, on
 * a 2 MiB boundary (the huge-page advice itself is the kernel's to take or
 * not, so it is not asserted); every byte up to the next cache line
 * writable (valgrind and ASan see any that is not). */
START_TEST(test_alloc_aligned)
{
    static const size_t sizes[] = { 0, 1, 63, 64, 65, 4095, ((size_t)2 << 20) - 64,
                                    ((size_t)2 << 20) - 63, (size_t)2 << 20,
                                    ((size_t)5 << 20) + 3 };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        const size_t n = sizes[i], usable = n == 0 ? 64 : (n + 63) & ~(size_t)63;
        const size_t align = usable >= HD_HUGE_BYTES ? HD_HUGE_BYTES : 64;
        unsigned char *p = hd_alloc_aligned(n);
        ck_assert_ptr_nonnull(p);
        ck_assert_msg((uintptr_t)p % align == 0, "%zu bytes at %p, not on %zu", n, (void *)p,
                      align);
        {
            /* one assertion a block, not a byte (valgrind runs this) */
            unsigned char any = 0;
            size_t first = 0;
            for (size_t j = 0; j < usable; j++)
                any |= p[j];
            while (any && p[first] == 0)
                first++;
            ck_assert_msg(any == 0, "%zu bytes: byte %zu is %d", n, first, p[first]);
        }
        memset(p, 0xa5, usable);
        hd_free_aligned(p);
    }
    hd_free_aligned(NULL);
    /* a size that cannot be rounded up fails cleanly */
    ck_assert_ptr_null(hd_alloc_aligned(SIZE_MAX - 8));
}
END_TEST

static Suite *state_suite(void)
{
    Suite *s = suite_create("state");

    TCase *tc = tcase_create("import-export");
    tcase_set_timeout(tc, TU_TIMEOUT);
    tcase_add_test(tc, test_export_import_roundtrip);
    tcase_add_test(tc, test_copy_to_second_state);
    tcase_add_test(tc, test_prefill_equals_import);
    tcase_add_test(tc, test_reset);
    suite_add_tcase(s, tc);

    tc = tcase_create("limits");
    tcase_set_timeout(tc, TU_TIMEOUT);
    tcase_add_test(tc, test_tensor_bytes);
    tcase_add_test(tc, test_cache_full);
    tcase_add_test(tc, test_capacity_zero);
    tcase_add_test(tc, test_alloc_aligned);
    suite_add_tcase(s, tc);

    tc = tcase_create("contexts");
    tcase_set_timeout(tc, TU_TIMEOUT);
    tcase_add_unchecked_fixture(tc, kkkm_setup, kkkm_teardown);
    tcase_add_test(tc, test_contexts);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tu_run_suite(state_suite());
}
