/* mega.cu - the persistent cooperative megakernel: every layer of one decode
 * step in one launch, phases separated by grid barriers.
 *
 * Per KDA layer: proj | delta | o_proj | router | experts | down (6 phases);
 * per MLA layer: proj | absorb | attend | merge | o_proj | router | experts |
 * down (8).  RMSNorm and the top-8 are recomputed by every CTA instead of
 * being shared through a barrier.  Two of the boundaries are flags, not
 * barriers (P.use_flags): a delta task waits for its head's projection
 * tasks, a down task for its expert's gate/up tasks (common.cuh). */
#include "mla.cuh"
#include "moe.cuh"

/* gemv_prime of a phase's first GEMV: which maps, from the phase's own
 * *_tiles function (0 maps: nothing to prime).  Out of line, so that the
 * tiles' array is not part of the kernel's own frame. */
enum PrimeWhat { PR_KPROJ, PR_MPROJ, PR_OPROJ_K, PR_OPROJ_M, PR_ROUTER, PR_DOWN };

__device__ __noinline__ void prime_phase(const LayerDev &L, int what, const float *sm)
{
    MatTile m[4];
    int nb = 0, k = 0, n = 0;
    switch (what) {
    case PR_KPROJ: n = kda_proj_tiles(L, m, nb, k); break;
    case PR_MPROJ: n = mla_proj_tiles(L, m, nb, k); break;
    case PR_OPROJ_K: n = out_proj_tiles(L.p[4], m, nb, k); break;
    case PR_OPROJ_M: n = out_proj_tiles(L.p[3], m, nb, k); break;
    case PR_ROUTER: n = moe_router_tiles(L, m, nb, k); break;
    default:
        n = moe_down_tiles(L, reinterpret_cast<const int *>(sm + SM_SEL), m, nb, k);
        break;
    }
    gemv_prime(m, n, nb, k);
}

/* HD_CUDA_PRIME=1: before the grid barrier ahead of the phase, where bit
 * `what` of P.prime is set (HD_CUDA_PRIME=1 sets them all,
 * HD_CUDA_PRIME_MASK=M those of M).  (Priming
 * at the phase's start instead, ahead of its RMSNorm, was slower still:
 * 430 against 385 us at context 4096, every primed phase 2.5-4.5 us
 * longer, device call 2 of 2026-12-04: the small loads of the RMSNorm
 * wait behind the bulk copies.) */
#define PRIME(layer, what)                                                               \
    do {                                                                                 \
        if ((P.prime >> (what)) & 1) {                                                   \
            fenced = prime_fence();                                                      \
            prime_phase(layer, what, sm);                                                \
        }                                                                                \
    } while (0)

/* HDC_PRIME_FENCE_FIRST (a build switch, off by default): a primer makes
 * its phase's writes visible before it issues the copies (thread 0's
 * fence.acq_rel.gpu between two __syncthreads), and the grid barrier that
 * follows arrives with a relaxed add.  scripts/barrier-bench.cu measured
 * on an H100 that a barrier's release waits for every bulk copy in flight
 * on the SM, whichever thread issued it (2.7 MB a round in flight: a
 * barrier of 1.86 us against 0.97; 13.5 MB: 5.2 us), so that a primed
 * ring's copies landed before the grid went on instead of during the
 * wait.  Returns whether the next barrier may be relaxed. */
__device__ __forceinline__ bool prime_fence()
{
#ifdef HDC_PRIME_FENCE_FIRST
    __syncthreads();
    if (threadIdx.x == 0)
        asm volatile("fence.acq_rel.gpu;" : : : "memory");
    __syncthreads();
    return true;
#else
    return false;
#endif
}

/* The grid barrier of hd_mega: relaxed right after a primer's
 * prime_fence, where nothing was written since. */
#define GRID_SYNC()                                                                      \
    do {                                                                                 \
        grid_sync(P.bar, gt, fenced);                                                    \
        fenced = false;                                                                  \
    } while (0)

/* HDC_ROUTER_FLAG: the router's two flags back to 0, in the output
 * projection's phase: the grid barrier ahead of it follows their last
 * consumers (the previous layer's phases X and D, behind the barrier after
 * D), the one after it precedes their producers (phase R). */
__device__ __forceinline__ void router_flags_reset(const StepParams &P)
{
    if (HDC_ROUTER_FLAGS && blockIdx.x == 0 && threadIdx.x < 2)
        P.flags[HDC_FL_LOGITS + threadIdx.x] = 0u;
}

__global__ void __launch_bounds__(HDC_THREADS, 1) hd_mega(const __grid_constant__ StepParams P)
{
    extern __shared__ float4 smem4[];
    float *sm = reinterpret_cast<float *>(smem4);
    int mark = 0;
    bool traced_m = false, fenced = false;
    unsigned gt = grid_base(P.bar); /* the grid barrier's target (thread 0) */
    gemv_reset();
    __syncthreads();
    /* Thread 0 of each CTA asks L2 for the bytes of this CTA's next phases
     * as soon as they are known, so that DRAM streams while the current
     * phase computes and waits at its barrier. */
    const bool pf = P.prefetch && threadIdx.x == 0;
    phase_mark(P.timers, mark);
    if (pf) {
        if (P.layers[0].kind == 'K')
            kda_proj_prefetch(P.layers[0]);
        else
            mla_proj_prefetch(P.layers[0]);
    }

    for (int l = 0; l < P.n_layers; l++) {
        const LayerDev &L = P.layers[l];
        const bool first = l == 0, last = l == P.n_layers - 1;
        unsigned long long *tr = l == 0 ? P.trace : nullptr;
        trace_mark(tr, 0);
        if (L.kind == 'K') {
            if (pf) {
                kda_delta_prefetch(P, L);
                out_proj_prefetch(L.p[4]);
            }
            kda_proj(P, L, first, sm);
            trace_mark(tr, 1);
            if (!P.use_flags) /* else delta waits for its head's flags */
                GRID_SYNC();
            trace_mark(tr, 2);
            phase_mark(P.timers, mark);
            if (pf)
                moe_router_prefetch(P, L);
            kda_delta(P, L, sm);
            PRIME(L, PR_OPROJ_K);
            trace_mark(tr, 3);
            GRID_SYNC();
            trace_mark(tr, 4);
            phase_mark(P.timers, mark);
            router_flags_reset(P);
            out_proj(P, L.p[4], sm, tr);
        } else {
            if (pf)
                mla_kvb_prefetch(L);
            /* the trace's points 20-31: the first MLA layer (40-43 and 48
             * inside its tensor-core attention, 44-47 inside the merge) */
            unsigned long long *tm = P.trace && !traced_m ? P.trace : nullptr;
            traced_m = true;
            trace_mark(tm, 20);
            mla_proj(P, L, first, sm);
            trace_mark(tm, 21);
            GRID_SYNC();
            trace_mark(tm, 22);
            phase_mark(P.timers, mark);
            if (pf)
                out_proj_prefetch(L.p[3]);
            mla_absorb(P, L, sm);
            trace_mark(tm, 23);
            GRID_SYNC();
            trace_mark(tm, 24);
            phase_mark(P.timers, mark);
            if (pf)
                moe_router_prefetch(P, L);
            if (P.hsplit == 4)
                mla_attend_tc8(P, L, sm, tm);
            else if (P.attn_scalar > 0 || (P.attn_scalar == 0 && P.split_len <= 64))
                mla_attend(P, L, sm, tm);
            else
                mla_attend_tc(P, L, sm, tm);
            trace_mark(tm, 27);
            GRID_SYNC();
            trace_mark(tm, 28);
            phase_mark(P.timers, mark);
            mla_merge(P, L, sm);
            PRIME(L, PR_OPROJ_M);
            trace_mark(tm, 29);
            GRID_SYNC();
            trace_mark(tm, 30);
            phase_mark(P.timers, mark);
            router_flags_reset(P);
            out_proj(P, L.p[3], sm, nullptr);
        }
        PRIME(L, PR_ROUTER);
        trace_mark(tr, 5);
        GRID_SYNC();
        trace_mark(tr, 6);
        phase_mark(P.timers, mark);
        moe_router(P, L, sm);
        trace_mark(tr, 7);
        if (!(HDC_ROUTER_FLAGS && P.use_flags)) /* else phase X waits for the logits' flag */
            GRID_SYNC();
        trace_mark(tr, 8);
        phase_mark(P.timers, mark);
        moe_experts(P, L, sm);
        PRIME(L, PR_DOWN);
        trace_mark(tr, 9);
        if (!P.use_flags) /* else each down map waits for its expert's flag */
            GRID_SYNC();
        fenced = false; /* moe_down writes before the next barrier */
        trace_mark(tr, 10);
        phase_mark(P.timers, mark);
        if (pf && !last) {
            if (P.layers[l + 1].kind == 'K')
                kda_proj_prefetch(P.layers[l + 1]);
            else
                mla_proj_prefetch(P.layers[l + 1]);
        }
        moe_down(P, L, last, sm);
        if (!last) {
            const LayerDev &N = P.layers[l + 1];
            if (N.kind == 'K')
                PRIME(N, PR_KPROJ);
            else
                PRIME(N, PR_MPROJ);
        }
        trace_mark(tr, 11);
        if (!last)
            GRID_SYNC();
        phase_mark(P.timers, mark);
    }
    grid_exit(P.bar, gt);
}

cudaError_t hdc_kernel_setup(int device, int *ctas_per_sm, int split, int slots)
{
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess)
        return e;
    e = cudaMemcpyToSymbol(g_split_force, &split, sizeof split);
    if (e != cudaSuccess)
        return e;
    e = cudaMemcpyToSymbol(g_slots_cap, &slots, sizeof slots);
    if (e != cudaSuccess)
        return e;
    e = cudaFuncSetAttribute(hd_mega, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             HDC_SMEM_BYTES);
    if (e != cudaSuccess)
        return e;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas_per_sm, hd_mega,
                                                         HDC_THREADS, HDC_SMEM_BYTES);
}

/* The launch's parameters (the input included) within the 32764 bytes
 * that CUDA 12.1 and later allow. */
static_assert(sizeof(StepParams) <= 32764, "kernel parameters");

cudaError_t hdc_launch(const StepParams *p, int grid, cudaStream_t stream)
{
    void *args[] = {const_cast<StepParams *>(p)};
    return cudaLaunchCooperativeKernel((const void *)hd_mega, dim3(grid),
                                       dim3(HDC_THREADS), args, HDC_SMEM_BYTES,
                                       stream);
}

/* HD_CUDA_TRACE: on = N > 0 arms the gemv trace of CTA 5's N-th gemv_run;
 * on == 0 copies it out (4 x 64 times, ns) and disarms it. */
cudaError_t hdc_gemv_trace(unsigned long long *host, int on)
{
    static unsigned long long zero[4][64];
    if (on) {
        const int n = 0;
        cudaError_t e = cudaMemcpyToSymbol(g_gtr, zero, sizeof zero);
        if (e == cudaSuccess)
            e = cudaMemcpyToSymbol(g_gtr_n, &n, sizeof n);
        return e != cudaSuccess ? e : cudaMemcpyToSymbol(g_gtr_on, &on, sizeof on);
    }
    cudaError_t e = cudaMemcpyFromSymbol(host, g_gtr, sizeof zero);
    return e != cudaSuccess ? e : cudaMemcpyToSymbol(g_gtr_on, &on, sizeof on);
}
