/* hd_cuda.h - what the CUDA module's host code and its megakernel share:
 * the device-side descriptions of the weights, the state and the scratch. */
#ifndef HD_CUDA_H
#define HD_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>

#define HDC_THREADS 512          /* threads per CTA (16 warps)            */
#define HDC_WARPS (HDC_THREADS / 32)
#define HDC_SLOTS_DEFAULT 5      /* GEMV ring slots in flight (HD_CUDA_SLOTS) */
#define HDC_XS_STRIDE 36         /* floats per 32-value chunk of x in smem */
#define HDC_PART 516             /* floats per (split, head) partial       */
#define HDC_SMEM_BYTES (227 * 1024) /* the most a CTA may have on sm_90 */
#define HDC_TRACE_PTS 64         /* HD_CUDA_TRACE: points per CTA         */

/* A quantized linear map repacked for the tensor-core GEMV (repack.cu):
 *   w  units of 16 columns x 64 rows, 512 bytes, unit (nb, kb) at
 *      (nb * K/64 + kb) * 32 uint4; lane t's uint4 holds its mma A
 *      fragments of the unit's four 16-row steps;
 *   sz [N/16][K/128][16] uint2: s | s << 16, c1 | c2 << 16 (bf16), the
 *      constants of the exact dequantization fma(bf((128 + q) - c1), s, c2).
 * A column block's weights and constants are each one contiguous run.
 * A bank of `count` maps stores member j at w + j * wstride. */
struct QMat {
    const uint4 *w;
    const uint2 *sz;
    int K, N;
    size_t wstride, szstride; /* in elements of w / sz, for banks */
};

struct LayerDev {
    int kind; /* 'K' or 'M' */
    int slot;
    const uint16_t *attn_norm, *moe_norm;
    /* K: q, k, v, g, o.  M: q_proj, kv_a, kv_b, o_proj. */
    QMat p[5];
    const uint16_t *beta;   /* bf16 [32][2304] */
    const uint16_t *conv_w; /* bf16 [3][4096][4] */
    const uint16_t *router; /* bf16 [E][2304] */
    QMat gate, up, down;    /* banks of E */
    QMat sgate, sup, sdown;
};

/* Everything one launch needs (passed by value). */
struct StepParams {
    const LayerDev *layers;
    int n_layers, experts, last_layer;
    /* state, by slot */
    float *const *S;          /* [32][128][128] fp32 */
    uint16_t *const *conv;    /* [3 (q,k,v)][3][4096] bf16 */
    uint16_t *const *ckv;     /* [capacity][512] bf16 */
    uint16_t *const *krope;   /* [capacity][64] bf16 */
    int pos;                  /* this token's position = rows in the cache */
    int nsplit, split_len;    /* attention splits over pos + 1 tokens */
    int hsplit;               /* 4: each split's heads in four groups of 8,
                               * one CTA each (mla_attend_tc8); 1: one CTA
                               * a split */
    int merge_ctas;           /* CTAs a head in the merge (mla_merge): 4,
                               * or 1 or 2 (HD_CUDA_MERGE_CTAS) */
    /* scratch */
    const uint16_t *hin; /* the step's input: device scratch, or nullptr
                          * when it travels in hin_v (below) */
    uint16_t *hout;      /* the output: device scratch, or page-locked host
                          * memory mapped into the device (HD_CUDA_IO) */
    float *h;      /* [2304] the hidden vector */
    float *act;    /* [4][4096]: KDA q, k, v activations, decay */
    float *beta;   /* [32] */
    float *attn;   /* [4096] attention output (o_proj input) */
    float *q;      /* [32][192] MLA query (rounded, rope applied) */
    float *ql;     /* [32][512] absorbed query */
    float *parts;  /* [nsplit][32][HDC_PART] attention partials */
    float *logits; /* [E] */
    float *ff;     /* [9][1024] expert activations (8 routed, shared) */
    float *route;  /* [16]: 8 expert indices (as float bits) + 8 weights */
    float *dpart;  /* [9][2304] the down projections' outputs */
    unsigned *dcnt; /* [144] units done per 16-column block (0 at rest) */
    unsigned *flags; /* [64] tasks done, in place of a grid barrier (HDC_FL_*;
                      * 0 at rest, set back to 0 in each router phase) */
    unsigned *bar; /* [3] grid barrier: arrivals, their count at launch, exits */
    int prefetch;  /* 1: each CTA prefetches its next phases' bytes into L2 */
    int attn_scalar; /* 1: one CTA a split on CUDA cores, -1: one CTA a
                      * split on tensor cores, 0: the 8-head groups, or
                      * (grids of < 4 CTAs) by split length
                      * (HD_CUDA_ATTN=scalar|tc) */
    int prime;     /* bit i (PrimeWhat in mega.cu): phase i's weights stream
                    * into shared memory before the grid barrier ahead of
                    * it (HD_CUDA_PRIME, HD_CUDA_PRIME_MASK) */
    int late_prime; /* bit 0 KDA, 1 MLA projections, 2 router, 3 o_proj:
                     * the phase's first weights stream into shared memory
                     * once its vector's loads are in (HD_CUDA_LATE_PRIME) */
    int use_flags; /* 1: the delta rule waits for its head's projections and
                    * a down projection for its expert (flags), not for
                    * the whole grid (HD_CUDA_FLAGS=0: grid barriers) */
    unsigned long long *trace; /* HD_CUDA_TRACE: [grid][HDC_TRACE_PTS] times of layer 0 */
    unsigned long long *timers; /* [128] phase end times (CTA 0), ns */
    /* The step's input (bf16) in the launch's parameters: no copy ahead of
     * the launch (CUDA 12.1 and later take up to 32764 bytes of them). */
    uint16_t hin_v[2304];
};

/* mega.cu */
/* split: 0, or the warps per GEMV block to use always (1, 2, ..., 16;
 * HD_CUDA_SPLIT, for measurements); slots: the most ring slots a GEMV
 * may fill (1 .. 16, 0 for no limit; HD_CUDA_SLOTS). */
cudaError_t hdc_kernel_setup(int device, int *ctas_per_sm, int split, int slots);
cudaError_t hdc_gemv_trace(unsigned long long *host, int on);
cudaError_t hdc_launch(const StepParams *p, int grid, cudaStream_t stream);

/* repack.cu: bytes of the repacked form of one map (all members). */
size_t hdc_repack_bytes(int k, int n, int count);
/* Repacks into dst (host memory, hdc_repack_bytes large); the device
 * pointers of the result, placed at dev_base, go into *m.  Returns 0, or -1
 * when a group's scale and zero have no exact form of the kernel's
 * dequantization (non-finite, or a zero whose fraction times the scale is
 * not a bf16), or K, N are not multiples of 128, 16. */
int hdc_repack(const uint8_t *w_q, const uint16_t *scales,
                const uint16_t *zeros, int k, int n, int count, void *dst,
                const void *dev_base, QMat *m);

#endif /* HD_CUDA_H */
