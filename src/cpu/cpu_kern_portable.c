/* cpu_kern_portable.c - the kernels in plain C for any CPU (baseline flags,
 * any architecture): the same tiles and the same exactly rounded weights as
 * the SIMD kernels, one column at a time. */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef HD_HAVE_SLEEF
#include <sleef.h>
#endif

#include "cpu.h"
#include "util.h"

static void isa_vexp(float *dst, const float *src, int n)
{
    for (int i = 0; i < n; i++)
#ifdef HD_HAVE_SLEEF
        dst[i] = Sleef_expf_u10(src[i]);
#else
        dst[i] = expf(src[i]);
#endif
}

static void isa_vsincos(const float *a, float *s, float *c, int n)
{
    for (int i = 0; i < n; i++) {
#ifdef HD_HAVE_SLEEF
        Sleef_float2 sc = Sleef_sincosf_u10(a[i]);
        s[i] = sc.x;
        c[i] = sc.y;
#else
        s[i] = sinf(a[i]);
        c[i] = cosf(a[i]);
#endif
    }
}

#define GVW 4
#include "cpu_kern_generic.h"

static float bf16f(const uint8_t *p)
{
    uint16_t b;
    memcpy(&b, p, 2);
    return hd_bf16_to_f32(b);
}

/* Where input k of a group sits in the layout of cpu_prepare_x. */
static inline int xd_index(int k)
{
    return 16 * (k >> 3) + 8 * (k & 1) + ((k & 7) >> 1);
}

static void portable_gemv_pairs(const uint8_t *tiles, int p0, int p1,
                                int groups, const float *xd, float *y)
{
    for (int p = p0; p < p1; p++)
        for (int half = 0; half < 2; half++) {
            float acc = 0.0f;
            for (int g = 0; g < groups; g++) {
                const uint8_t *t = tiles + ((size_t)p * (size_t)groups + (size_t)g) * CPU_TILE_BYTES;
                const float s = bf16f(t + CPU_TILE_W + 2 * half);
                const float z = bf16f(t + CPU_TILE_W + 4 + 2 * half);
                const float *xg = xd + (size_t)g * 2 * CPU_GROUP;
                float lut[16], part = 0.0f;
                for (int v = 0; v < 16; v++)
                    lut[v] = hd_bf(((float)v - z) * s);
                for (int i = 0; i < 4; i++)
                    for (int b = 0; b < 16; b++) {
                        const uint8_t byte = t[32 * i + 16 * half + b];
                        const int klo = 32 * i + b, khi = klo + 16;
                        part += lut[byte & 15] * xg[xd_index(klo)];
                        part += lut[byte >> 4] * xg[xd_index(khi)];
                    }
                acc += part;
            }
            y[2 * p + half] = acc;
        }
}

const cpu_kernels cpu_kernels_portable = {
    .name = "portable",
    .layout = CPU_LAYOUT_PAIRED,
    .gemv_pairs = portable_gemv_pairs,
    .absorb = gen_absorb,
    .vexp = isa_vexp,
    .vsincos = isa_vsincos,
    .dot_bf16_f64 = gen_dot_bf16_f64,
    .kda_head = gen_kda_head,
    .mla_range = gen_mla_range,
};
