/* test_synth.c - the synthetic model against SYNTH.md's check values. */
#include "config.h"

#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hd.h"
#include "model.h"
#include "motif.h"
#include "synth.h"

/* CRC-32 (IEEE 802.3, reflected), bit by bit: slow and obviously right. */
static uint32_t crc32_bytes(const void *data, size_t n)
{
    const unsigned char *p = data;
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int b = 0; b < 8; b++)
            c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
    }
    return ~c;
}

/* crc32 of little-endian bytes of n bf16 values. */
static uint32_t crc32_bf16(const uint16_t *v, size_t n)
{
    unsigned char *b = malloc(2 * n);
    uint32_t c;
    ck_assert_ptr_nonnull(b);
    for (size_t i = 0; i < n; i++) {
        b[2 * i] = (unsigned char)(v[i] & 0xff);
        b[2 * i + 1] = (unsigned char)(v[i] >> 8);
    }
    c = crc32_bytes(b, 2 * n);
    free(b);
    return c;
}

typedef struct check_value {
    const char *name;
    unsigned v[4];
    uint32_t crc;
} check_value;

/* SYNTH.md, "Check values" (seed 1, E = 16). */
static const check_value model_checks[] = {
    { "blocks.0.attn_norm", { 16264, 16224, 16262, 16240 }, 0xfd4ce573u },
    { "blocks.0.attn.q_proj.w_q", { 116, 220, 211, 168 }, 0xa1488af2u },
    { "blocks.0.attn.q_proj.scales", { 14987, 14998, 14994, 14993 }, 0xbfdca03au },
    { "blocks.0.attn.q_proj.zeros", { 16608, 16624, 16624, 16624 }, 0x35d1bd27u },
    { "blocks.0.attn.conv_w", { 16004, 16004, 15864, 48884 }, 0x84202ea0u },
    { "blocks.2.attn.beta_proj.weight", { 15444, 48008, 15376, 47776 }, 0xa9868f46u },
    { "blocks.3.attn.kv_b.w_q", { 184, 218, 100, 236 }, 0x9d1fbc7eu },
    { "blocks.3.moe.router.weight", { 48482, 15596, 48442, 15392 }, 0x21e36dbbu },
    { "blocks.3.moe.down.w_q", { 205, 61, 51, 148 }, 0x73d3f505u },
    { "blocks.1.moe.s_up.scales", { 15137, 15184, 15195, 15149 }, 0xbb015249u },
};

START_TEST(test_hash_check_values)
{
    ck_assert_uint_eq(hd_synth_fnv1a32("blocks.0.attn_norm"), 2336447173u);
    ck_assert_uint_eq(hd_synth_lowbias32(1), 0x688990c0u);
}
END_TEST

START_TEST(test_tensor_check_values)
{
    const check_value *cv = &model_checks[_i];
    hd_model m;
    size_t n = hd_motif_tensor_count("KKKM");
    hd_tensor_spec *specs = calloc(n, sizeof *specs);
    const hd_tensor_spec *spec = NULL;
    void *buf;
    uint64_t bytes;
    uint32_t crc;

    ck_assert_ptr_nonnull(specs);
    memset(&m, 0, sizeof m);
    strcpy(m.pattern, "KKKM");
    m.experts = 16;
    hd_motif_layout(&m, specs);
    for (size_t i = 0; i < n; i++)
        if (strcmp(specs[i].name, cv->name) == 0)
            spec = &specs[i];
    ck_assert_msg(spec != NULL, "no tensor %s in the motif", cv->name);
    bytes = hd_motif_tensor_bytes(spec);
    buf = malloc(bytes);
    ck_assert_ptr_nonnull(buf);
    hd_synth_fill(1, spec, buf);
    if (spec->dtype == HD_DT_U8) {
        const uint8_t *u = buf;
        for (int i = 0; i < 4; i++)
            ck_assert_uint_eq(u[i], cv->v[i]);
        crc = crc32_bytes(u, bytes);
    } else {
        const uint16_t *u = buf;
        for (int i = 0; i < 4; i++)
            ck_assert_uint_eq(u[i], cv->v[i]);
        crc = crc32_bf16(u, bytes / 2);
    }
    ck_assert_msg(crc == cv->crc, "%s: crc32 %08x, SYNTH.md says %08x",
                  cv->name, crc, cv->crc);
    free(buf);
    free(specs);
}
END_TEST

START_TEST(test_input_check_value)
{
    uint16_t in[HD_HIDDEN];
    const unsigned want[4] = { 15984, 49068, 16088, 49130 };
    ck_assert_int_eq(hd_synth_input(1, 0, in), HD_OK);
    for (int i = 0; i < 4; i++)
        ck_assert_uint_eq(in[i], want[i]);
    ck_assert_uint_eq(crc32_bf16(in, HD_HIDDEN), 0x67703a74u);
    /* Different steps give different inputs. */
    {
        uint16_t in1[HD_HIDDEN];
        ck_assert_int_eq(hd_synth_input(1, 1, in1), HD_OK);
        ck_assert_int_ne(memcmp(in, in1, sizeof in), 0);
    }
    ck_assert_int_eq(hd_synth_input(1, 0, NULL), HD_ERR_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_cache_check_value)
{
    const size_t rows = 300;
    uint16_t *c = malloc(rows * HD_MLA_KV_LORA * 2);
    uint16_t *r = malloc(rows * HD_MLA_QK_ROPE * 2);
    uint16_t *c2 = malloc(10 * HD_MLA_KV_LORA * 2);
    const unsigned want[4] = { 15488, 15928, 16226, 48900 };

    ck_assert_ptr_nonnull(c);
    ck_assert_ptr_nonnull(r);
    ck_assert_ptr_nonnull(c2);
    ck_assert_int_eq(hd_synth_cache(2, rows, c, r), HD_OK);
    for (int i = 0; i < 4; i++)
        ck_assert_uint_eq(c[i], want[i]);
    ck_assert_uint_eq(crc32_bf16(c, rows * HD_MLA_KV_LORA), 0x47d5f715u);
    /* A shorter prefill is a prefix of a longer one. */
    ck_assert_int_eq(hd_synth_cache(2, 10, c2, NULL), HD_OK);
    ck_assert_int_eq(memcmp(c, c2, 10 * HD_MLA_KV_LORA * 2), 0);
    free(c);
    free(r);
    free(c2);
}
END_TEST

/* The synthetic model made through the public API holds the same bytes:
 * save it and compare a tensor's crc with the check value. */
START_TEST(test_model_values_are_the_synth_values)
{
    hd_options o;
    hd_model *m = NULL;
    char err[256] = "";
    hd_options_init(&o);
    o.backend = HD_BACKEND_REF;
    ck_assert_int_eq(hd_model_synth(1, 16, NULL, &o, &m, err, sizeof err), HD_OK);
    ck_assert_str_eq(hd_model_pattern(m), "KKKM");
    ck_assert_int_eq(hd_model_experts(m), 16);
    ck_assert_int_eq(hd_model_layers(m), 4);
    for (size_t i = 0; i < m->n_tensors; i++) {
        const hd_tensor *t = &m->tensors[i];
        if (strcmp(t->name, "blocks.3.moe.down.w_q") == 0)
            ck_assert_uint_eq(crc32_bytes(t->data, t->bytes), 0x73d3f505u);
        if (strcmp(t->name, "blocks.0.attn.conv_w") == 0)
            ck_assert_uint_eq(crc32_bf16(t->data, t->bytes / 2), 0x84202ea0u);
    }
    hd_model_free(m);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("synth");
    TCase *tc = tcase_create("check values");
    SRunner *sr;
    int failed;

    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_hash_check_values);
    tcase_add_loop_test(tc, test_tensor_check_values, 0,
                        (int)(sizeof model_checks / sizeof model_checks[0]));
    tcase_add_test(tc, test_input_check_value);
    tcase_add_test(tc, test_cache_check_value);
    tcase_add_test(tc, test_model_values_are_the_synth_values);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
