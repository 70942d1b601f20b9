/* synth.c - generate SYNTH.md's tensors, inputs and prefilled caches. */
#include "config.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "synth.h"
#include "util.h"

uint32_t hd_synth_lowbias32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

uint32_t hd_synth_fnv1a32(const char *s)
{
    uint32_t h = 0x811c9dc5u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x01000193u;
    return h;
}

static uint32_t synth_key(uint32_t seed, const char *name)
{
    return hd_synth_lowbias32(hd_synth_fnv1a32(name) ^ seed);
}

/* bf16 of ((u & 255) - 128) * 2^exp, built exactly (the value has at most
 * 8 significant bits, so the conversion never rounds). */
static uint16_t small_value(uint32_t u, int exp)
{
    return hd_f32_to_bf16(ldexpf((float)((int)(u & 255) - 128), exp));
}

void hd_synth_small(uint32_t seed, const char *name, int exp, size_t count,
                    uint16_t *dst)
{
    uint32_t key = synth_key(seed, name);
    for (size_t i = 0; i < count; i++)
        dst[i] = small_value(hd_synth_lowbias32((uint32_t)i ^ key), exp);
}

void hd_synth_fill(uint32_t seed, const hd_tensor_spec *spec, void *dst)
{
    uint32_t key = synth_key(seed, spec->name);
    uint64_t count = hd_motif_tensor_bytes(spec);
    uint8_t *u8 = dst;
    uint16_t *bf = dst;

    if (spec->dtype == HD_DT_BF16)
        count /= 2;
    /* The flat index wraps at 2^32 as SYNTH.md's uint32 arithmetic does. */
    for (uint64_t i = 0; i < count; i++) {
        uint32_t u = hd_synth_lowbias32((uint32_t)i ^ key);
        switch (spec->rule) {
        case HD_RULE_BYTE:
            u8[i] = (uint8_t)(u & 255);
            break;
        case HD_RULE_SCALE:
            bf[i] = (uint16_t)(((uint32_t)(127 + spec->exp) << 7) | (u & 127));
            break;
        case HD_RULE_ZERO:
            bf[i] = hd_f32_to_bf16(7.0f + 0.5f * (float)(u & 3));
            break;
        case HD_RULE_SMALL:
            bf[i] = small_value(u, spec->exp);
            break;
        case HD_RULE_NORM:
            bf[i] = hd_f32_to_bf16(1.0f + ((float)(u & 15) - 8.0f) / 64.0f);
            break;
        }
    }
}

hd_status hd_synth_input(uint32_t seed, uint64_t step, uint16_t *out_bf16)
{
    char name[40];
    if (!out_bf16)
        return HD_ERR_INVALID_ARGUMENT;
    snprintf(name, sizeof name, "input.%" PRIu64, step);
    hd_synth_small(seed, name, -6, HD_HIDDEN, out_bf16);
    return HD_OK;
}

hd_status hd_synth_cache(uint32_t seed, size_t rows, uint16_t *c_kv,
                         uint16_t *k_rope)
{
    size_t n;
    if (c_kv) {
        if (!hd_mul_size(rows, HD_MLA_KV_LORA, &n))
            return HD_ERR_INVALID_ARGUMENT;
        hd_synth_small(seed, "state.c_kv", -7, n, c_kv);
    }
    if (k_rope) {
        if (!hd_mul_size(rows, HD_MLA_QK_ROPE, &n))
            return HD_ERR_INVALID_ARGUMENT;
        hd_synth_small(seed, "state.k_rope", -7, n, k_rope);
    }
    return HD_OK;
}
