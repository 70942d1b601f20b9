/* repack.cu - the int4 weights in the layout of the megakernel's loads.
 *
 * Seed layout: w_q [K/2][N] bytes, byte (r, n) holds k = 2r (low nibble) and
 * k = 2r + 1 (high); scales, zeros bf16 [K/128][N].
 * Repacked (still 4 bits a weight): for each 32-row chunk c and column n one
 * 16-byte word holding k = 32c .. 32c + 31, so that a warp's 32 threads,
 * taking 32 consecutive columns, read 512 contiguous bytes; inside the word,
 * 32-bit word i, byte b holds k = 32c + 8i + b in its low nibble and
 * k = 32c + 8i + 4 + b in its high nibble, so that one AND (and one shift)
 * yields four nibbles whose x values are consecutive.  Scales and zeros are
 * paired into one 32-bit word per (group, column). */
#include <string.h>

#include "hd_cuda.h"

size_t hdc_repack_bytes(int k, int n, int count)
{
    size_t w = (size_t)k / 2 * (size_t)n, sz = (size_t)k / 128 * (size_t)n * 4;
    return ((w + 255) / 256 * 256 + (sz + 255) / 256 * 256) * (size_t)count;
}

static void repack_member(const uint8_t *src, const uint16_t *sc,
                          const uint16_t *ze, int K, int N, uint8_t *w,
                          uint32_t *sz)
{
    memset(w, 0, (size_t)K / 2 * (size_t)N);
    for (int c = 0; c < K / 32; c++) {
        for (int rr = 0; rr < 16; rr++) {
            const uint8_t *row = src + (size_t)(c * 16 + rr) * (size_t)N;
            for (int half = 0; half < 2; half++) {
                int kl = 2 * rr + half;        /* k within the chunk */
                int i = kl / 8, j = kl % 8;
                int b = j & 3, shift = j < 4 ? 0 : 4;
                uint8_t *dst = w + (size_t)c * (size_t)N * 16 + (size_t)(i * 4 + b);
                for (int n = 0; n < N; n++) {
                    uint8_t q = half ? row[n] >> 4 : row[n] & 15;
                    dst[(size_t)n * 16] |= (uint8_t)(q << shift);
                }
            }
        }
    }
    for (size_t g = 0; g < (size_t)K / 128 * (size_t)N; g++)
        sz[g] = (uint32_t)sc[g] | ((uint32_t)ze[g] << 16);
}

void hdc_repack(const uint8_t *w_q, const uint16_t *scales,
                const uint16_t *zeros, int k, int n, int count, void *dst,
                const void *dev_base, QMat *m)
{
    size_t wbytes = (size_t)k / 2 * (size_t)n;
    size_t sbytes = (size_t)k / 128 * (size_t)n * 4;
    size_t wpad = (wbytes + 255) / 256 * 256, spad = (sbytes + 255) / 256 * 256;
    uint8_t *wd = (uint8_t *)dst;
    uint8_t *sd = wd + wpad * (size_t)count;
    size_t sgroups = (size_t)k / 128 * (size_t)n;

    for (int j = 0; j < count; j++)
        repack_member(w_q + (size_t)j * wbytes, scales + (size_t)j * sgroups,
                      zeros + (size_t)j * sgroups, k, n, wd + (size_t)j * wpad,
                      (uint32_t *)(sd + (size_t)j * spad));
    m->w = (const uint4 *)dev_base;
    m->sz = (const uint32_t *)((const uint8_t *)dev_base + wpad * (size_t)count);
    m->K = k;
    m->N = n;
    m->wstride = wpad / 16;
    m->szstride = spad / 4;
}
