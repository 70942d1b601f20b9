/* cpu_repack.c - the seed's int4 layout -> the CPU backend's tiles (cpu.h). */
#include "config.h"

#include <string.h>

#include "cpu.h"
#include "util.h"

hd_status cpu_qmat_alloc(cpu_qmat *m, int k, int n, int count, cpu_layout layout)
{
    size_t tiles, bytes;
    memset(m, 0, sizeof *m);
    m->k = k;
    m->n = n;
    m->count = count;
    m->groups = k / CPU_GROUP;
    m->pairs = n / 2;
    /* blocked: the last block padded to 8 pairs (cpu.h) */
    const size_t padded = layout == CPU_LAYOUT_BLOCKED
        ? ((size_t)m->pairs + CPU_BLOCK_PAIRS - 1) / CPU_BLOCK_PAIRS * CPU_BLOCK_PAIRS
        : (size_t)m->pairs;
    m->member_tiles = (size_t)m->groups * padded;
    m->normal = 1;
    m->layout = layout;
    if (!hd_mul_size(m->member_tiles, (size_t)count, &tiles) ||
        !hd_mul_size(tiles, CPU_TILE_BYTES, &bytes))
        return HD_ERR_OUT_OF_MEMORY;
    m->tiles = hd_alloc_aligned(bytes);     /* zeroed, the padding too */
    return m->tiles ? HD_OK : HD_ERR_OUT_OF_MEMORY;
}

void cpu_qmat_free(cpu_qmat *m)
{
    hd_free_aligned(m->tiles);
    m->tiles = NULL;
}

/* Nibble q of input k (0..127) of column n of q, group g. */
static int nibble(const hd_qlinear *q, int n, int g, int k)
{
    const int kk = g * CPU_GROUP + k;
    const uint8_t byte = q->w_q[(size_t)(kk / 2) * (size_t)q->n + (size_t)n];
    return (kk & 1) ? byte >> 4 : byte & 15;
}

/* One tile: columns n, n + 1 of q, group g, in `layout` (cpu.h); 1 when
 * both columns' tables are normal (cpu_table_normal). */
static int pack_tile(uint8_t *dst, const hd_qlinear *q, int n, int g, cpu_layout layout)
{
    int normal = 1;
    const size_t N = (size_t)q->n;
    for (int half = 0; half < 2; half++) {
        if (layout != CPU_LAYOUT_PAIRED) {
            /* column half's chunk c, word j: inputs 64c + j + 16i, nibble i */
            for (int c = 0; c < 2; c++)
                for (int j = 0; j < 16; j++) {
                    unsigned w = 0;
                    for (int i = 0; i < 4; i++)
                        w |= (unsigned)nibble(q, n + half, g, 64 * c + 16 * i + j) << (4 * i);
                    dst[64 * half + 32 * c + 2 * j] = (uint8_t)(w & 0xff);
                    dst[64 * half + 32 * c + 2 * j + 1] = (uint8_t)(w >> 8);
                }
            continue;
        }
        /* paired: chunk i, byte b of the column's half: inputs 32i + b (low
         * nibble) and 32i + 16 + b (high) */
        for (int i = 0; i < 4; i++)
            for (int b = 0; b < 16; b++)
                dst[32 * i + 16 * half + b] =
                    (uint8_t)(nibble(q, n + half, g, 32 * i + b) |
                              nibble(q, n + half, g, 32 * i + 16 + b) << 4);
    }
    for (int half = 0; half < 2; half++) {
        memcpy(dst + CPU_TILE_W + 2 * half,
               q->scales + (size_t)g * N + (size_t)(n + half), 2);
        memcpy(dst + CPU_TILE_W + 4 + 2 * half,
               q->zeros + (size_t)g * N + (size_t)(n + half), 2);
        normal &= cpu_table_normal(q->scales[(size_t)g * N + (size_t)(n + half)],
                                   q->zeros[(size_t)g * N + (size_t)(n + half)]);
    }
    return normal;
}

void cpu_repack_part(cpu_qmat *m, int member, int dst_col0,
                     const hd_qlinear *src, int src_member, int src_col0,
                     int ncols)
{
    uint8_t *base = (uint8_t *)cpu_qmat_member(m, member);
    hd_qlinear q = hd_qlinear_member(src, src_member);
    int normal = 1;
    for (int p = 0; p < ncols / 2; p++)
        for (int g = 0; g < m->groups; g++)
            normal &= pack_tile(base + cpu_tile_at(m->layout, m->groups, dst_col0 / 2 + p, g),
                                &q, src_col0 + 2 * p, g, m->layout);
    /* parts of one matrix may be packed by several threads at once (only
     * ever clearing the flag) */
    if (!normal)
        __atomic_store_n(&m->normal, 0, __ATOMIC_RELAXED);
}

void cpu_pack_wk(uint8_t *wk_q, uint16_t *wk_sz, const hd_qlinear *kv_b)
{
    const size_t N = (size_t)kv_b->n;
    for (int h = 0; h < HD_MLA_HEADS; h++)
        for (int g = 0; g < CPU_WK_GROUPS; g++)
            for (int n = 0; n < HD_MLA_QK_NOPE; n++) {
                const int col = h * (HD_MLA_QK_NOPE + HD_MLA_V_HEAD) + n;
                const size_t c = ((size_t)h * CPU_WK_GROUPS + (size_t)g) * HD_MLA_QK_NOPE +
                                 (size_t)n;
                uint8_t *dst = wk_q + c * (CPU_GROUP / 2);
                /* word i's nibble m (byte 4 i + m / 2, the low one for an
                 * even m): input 16 m + i */
                for (int i = 0; i < 16; i++)
                    for (int m = 0; m < 8; m += 2)
                        dst[4 * i + m / 2] = (uint8_t)(nibble(kv_b, col, g, 16 * m + i) |
                                                       nibble(kv_b, col, g, 16 * m + 16 + i)
                                                           << 4);
                wk_sz[2 * c] = kv_b->scales[(size_t)g * N + (size_t)col];
                wk_sz[2 * c + 1] = kv_b->zeros[(size_t)g * N + (size_t)col];
            }
}

void cpu_repack_raw(cpu_qmat *m, int member, const uint8_t *w_q,
                    const uint16_t *scales, const uint16_t *zeros)
{
    hd_qlinear q = { w_q, scales, zeros, m->k, m->n, 1 };
    cpu_repack_part(m, member, 0, &q, 0, 0, m->n);
}
