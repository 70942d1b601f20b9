/* ref_gemv.c - int4 dequantization, GEMV, dot products and RMSNorm. */
#include "config.h"

#include <math.h>

#include "ref.h"
#include "util.h"

float ref_weight(const hd_qlinear *p, int k, int n)
{
    uint8_t byte = p->w_q[(size_t)(k / 2) * (size_t)p->n + (size_t)n];
    int q = (k & 1) ? byte >> 4 : byte & 15;
    size_t g = (size_t)(k / 128) * (size_t)p->n + (size_t)n;
    float scale = hd_bf16_to_f32(p->scales[g]);
    float zero = hd_bf16_to_f32(p->zeros[g]);
    return hd_bf(((float)q - zero) * scale);
}

void ref_gemv(const hd_qlinear *p, const float *x, int n0, int cols, float *y)
{
    const size_t N = (size_t)p->n;
    double acc[REF_MAX_COLS];

    for (int j = 0; j < cols; j++)
        acc[j] = 0.0;
    /* Row by row through the packed bytes: byte row r holds k = 2r (low
     * nibble) and k = 2r + 1 (high nibble). */
    for (int r = 0; r < p->k / 2; r++) {
        const uint8_t *row = p->w_q + (size_t)r * N + (size_t)n0;
        const uint16_t *scale = p->scales + (size_t)(r / 64) * N + (size_t)n0;
        const uint16_t *zero = p->zeros + (size_t)(r / 64) * N + (size_t)n0;
        const double x0 = x[2 * r], x1 = x[2 * r + 1];
        for (int j = 0; j < cols; j++) {
            float s = hd_bf16_to_f32(scale[j]), z = hd_bf16_to_f32(zero[j]);
            float w0 = hd_bf(((float)(row[j] & 15) - z) * s);
            float w1 = hd_bf(((float)(row[j] >> 4) - z) * s);
            acc[j] += x0 * w0 + x1 * w1;
        }
    }
    for (int j = 0; j < cols; j++)
        y[j] = (float)acc[j];
}

float ref_dot_bf16(const float *x, const uint16_t *w, int n)
{
    double acc = 0.0;
    for (int i = 0; i < n; i++)
        acc += (double)x[i] * hd_bf16_to_f32(w[i]);
    return (float)acc;
}

void ref_rmsnorm(const float *h, const uint16_t *weight, float *x)
{
    double ss = 0.0;
    float inv;
    for (int i = 0; i < HD_HIDDEN; i++)
        ss += (double)h[i] * h[i];
    inv = 1.0f / sqrtf((float)ss / (float)HD_HIDDEN + 1e-6f);
    for (int i = 0; i < HD_HIDDEN; i++)
        x[i] = hd_bf(h[i] * inv * hd_bf16_to_f32(weight[i]));
}

float ref_silu(float y)
{
    return y / (1.0f + expf(-y));
}

float ref_sigmoid(float y)
{
    return 1.0f / (1.0f + expf(-y));
}
