/* moe.cuh - the mixture of experts in three phases: router logits with the
 * shared expert's gate/up; the 8 routed experts' gate/up; all 9 down
 * projections with the weighted sum and the residual. */
#ifndef HD_CUDA_MOE_CUH
#define HD_CUDA_MOE_CUH

#include "kda.cuh"

#define MOE_I 1024

/* HDC_SHARED_IN_X (a build switch, off): the shared expert's gate/up go
 * from phase R to phase X, where the 9 experts' columns are split over
 * the CTAs like the down phase's (map_range), so that phase R reads
 * only the router's logits on every CTA.  (In phase R, the 64 CTAs of
 * the shared expert's tiles end 4.5 us after the others, whose logits
 * are 17 KB each: the trace of 2026-12-07, an H100.) */
#ifdef HDC_SHARED_IN_X
#if HDC_ROUTER_FLAGS
#error "HDC_SHARED_IN_X and HDC_ROUTER_FLAG share flag 48"
#endif
#define MOE_R_SHARED 0               /* phase R's shared-expert tasks */
#define MOE_X_MAPS 9                 /* the experts whose gate/up phase X computes */
#define MOE_X_DONE (MOE_I / 16)      /* a flag's count: 16-column units */
#else
#define MOE_R_SHARED (MOE_I / 16)
#define MOE_X_MAPS 8
#define MOE_X_DONE (MOE_I / 32)      /* a flag's count: tasks of 32 columns */
#endif

/* The router logits' tasks: the CTAs the shared expert leaves free, at
 * most 16 experts (one a warp) a task.  (16 experts a task on 16 CTAs
 * made those CTAs read 74 KB each while the others read 41 KB or
 * nothing: the phase waited 4 us for them, device call 3 of 2026-12-03.) */
__device__ __forceinline__ int router_tasks(int E)
{
    const int n = (E + HDC_WARPS - 1) / HDC_WARPS, free = (int)gridDim.x - MOE_R_SHARED;
    return n > free ? n : free;
}

/* The experts [e0, e1) of router task t of nl. */
__device__ __forceinline__ void router_range(int t, int E, int nl, int &e0, int &e1)
{
    e0 = (int)((long long)t * E / nl);
    e1 = (int)((long long)(t + 1) * E / nl);
}

/* The first (only) GEMV of this CTA in moe_router, for gemv_prime. */
__device__ __forceinline__ int moe_router_tiles(const LayerDev &L, MatTile *m, int &NB, int &K)
{
    NB = 1;
    K = HDC_D;
#if MOE_R_SHARED == 0
    return 0;
#else
    if (blockIdx.x >= MOE_R_SHARED)
        return 0;
#endif
    m[0] = mat_tile(L.sgate, 0, blockIdx.x * 16, sm_xb(), 1);
    m[1] = mat_tile(L.sup, 0, blockIdx.x * 16, sm_xb(), 1);
    return 2;
}

/* Phase R: x = norm(h); router logits (router_tasks tasks, one expert a
 * warp) and the shared expert's f = silu(x gate) * (x up) (64 tiles of
 * 16 columns). */
__device__ __noinline__ void moe_router(const StepParams &P, const LayerDev &L, float *sm)
{
    float *xs = sm + SM_XS, *red = sm + SM_RED, *out = sm + SM_OUT;
    const uint2 *xb = reinterpret_cast<const uint2 *>(sm + SM_XB);
#ifdef HDC_ICACHE_PROBE
    /* (a measurement switch) the norm twice, the second time on the code
     * the first fetched: trace point 61 between the two */
#pragma unroll 1
    for (int rep = 0; rep < 2; rep++) {
        if (rep)
            trace_mark(layer_trace(P, L), 61);
#endif
    rmsnorm_xs(P.h, nullptr, L.moe_norm, xs, sm + SM_MISC,
               [&] { gemv_prime_late<2>(P.late_prime & 4, L, moe_router_tiles); });
#ifdef HDC_ICACHE_PROBE
    }
#endif
    const int E = P.experts, nl = router_tasks(E);
    const int ntask = MOE_R_SHARED + nl;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    unsigned long long *tr = layer_trace(P, L);
    /* the flags back to 0: their consumers of this layer (the delta rule)
     * and of the last (the down projections) are behind a grid barrier,
     * their next producers (phase X, the next projections) ahead of one */
    if (blockIdx.x == 0 && threadIdx.x < HDC_FL_COUNT)
        P.flags[threadIdx.x] = 0u;
    trace_mark(tr, 14);
    for (int task = blockIdx.x; task < ntask; task += gridDim.x) {
        if (task < MOE_R_SHARED) {
            int n0 = task * 16;
            MatTile m[2] = {mat_tile(L.sgate, 0, n0, xb, 1), mat_tile(L.sup, 0, n0, xb, 1)};
            gemv_tile<16, 2, HDC_D>(m, red, out);
            if (threadIdx.x < 16)
                P.ff[8 * MOE_I + n0 + threadIdx.x] = silu(out[threadIdx.x]) * out[16 + threadIdx.x];
        } else {
            int e0, e1;
            router_range(task - MOE_R_SHARED, E, nl, e0, e1);
            const int e = e0 + w;
            if (e < e1) {
                const uint4 *r = reinterpret_cast<const uint4 *>(L.router + (size_t)e * HDC_D);
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < HDC_D / 256; i++) {
                    int t = lane + 32 * i; /* values 8t .. 8t + 7 */
                    uint4 v = __ldg(r + t);
                    const float *x = xs + ((8 * t) >> 5) * HDC_XS_STRIDE + ((8 * t) & 31);
                    float4 xa = *reinterpret_cast<const float4 *>(x);
                    float4 xb = *reinterpret_cast<const float4 *>(x + 4);
                    s = fmaf(xa.x, __uint_as_float(v.x << 16), s);
                    s = fmaf(xa.y, __uint_as_float(v.x & 0xffff0000u), s);
                    s = fmaf(xa.z, __uint_as_float(v.y << 16), s);
                    s = fmaf(xa.w, __uint_as_float(v.y & 0xffff0000u), s);
                    s = fmaf(xb.x, __uint_as_float(v.z << 16), s);
                    s = fmaf(xb.y, __uint_as_float(v.z & 0xffff0000u), s);
                    s = fmaf(xb.z, __uint_as_float(v.w << 16), s);
                    s = fmaf(xb.w, __uint_as_float(v.w & 0xffff0000u), s);
                }
                s = warp_sum(s);
                if (lane == 0)
                    P.logits[e] = bfr(s);
            }
        }
        if (HDC_ROUTER_FLAGS && P.use_flags)
            flag_signal(P.flags + (task < MOE_R_SHARED ? HDC_FL_SHARED : HDC_FL_LOGITS));
        trace_mark(tr, 36);
    }
}

__device__ void moe_router_prefetch(const StepParams &P, const LayerDev &L)
{
    const int E = P.experts, nl = router_tasks(E);
    const int ntask = MOE_R_SHARED + nl;
    for (int task = blockIdx.x; task < ntask; task += gridDim.x) {
        if (task < MOE_R_SHARED) {
            prefetch_cols(L.sgate, 0, task * 16, 16);
            prefetch_cols(L.sup, 0, task * 16, 16);
        } else {
            int e0, e1;
            router_range(task - MOE_R_SHARED, E, nl, e0, e1);
            if (e1 > e0)
                l2_prefetch(L.router + (size_t)e0 * HDC_D, (uint32_t)(e1 - e0) * HDC_D * 2);
        }
    }
}

/* An order-preserving integer of a logit: larger numbers give larger
 * keys, -0 and +0 the same, NaN 0 (below every number). */
__device__ __forceinline__ uint32_t rank_key(float v)
{
    if (isnan(v))
        return 0u;
    uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* A strict total order of (logit, expert) in 32 bits: the upper half of
 * the key, then the lower index first; never 0 (0 marks an empty slot
 * below) and, for e < TOP8_FAST, above 31.  The logits are bf16 values
 * (moe_router stores bfr(s)), whose keys differ in the upper half only, so
 * the order is the full keys' order. */
__device__ __forceinline__ uint32_t top8_comp(float v, int e)
{
    return (rank_key(v) & 0xFFFF0000u) | (0xFFFFu - (uint32_t)e);
}

/* How many of the 32 lanes' values are above this lane's c. */
__device__ __forceinline__ int warp_rank(uint32_t c)
{
    int r = 0;
#pragma unroll 8
    for (int i = 0; i < 32; i++)
        r += __shfl_sync(0xffffffffu, c, i) > c;
    return r;
}

/* The top 8 of the 32 lanes' values c (all distinct) into co[0..7] /
 * lo[0..7] in rank order; slots that no valid lane fills keep 0 (empty).
 * (The loop is not unrolled all the way: the kernel's code is fetched
 * again every layer, and the unrolled 64-bit form was 37 KB.) */
__device__ __forceinline__ void top8_chunk(uint32_t c, bool valid, float v, uint32_t *co,
                                           float *lo)
{
    const int lane = threadIdx.x & 31;
    if (lane < 8)
        co[lane] = 0u;
    __syncwarp();
    const int r = warp_rank(c);
    if (valid && r < 8) {
        co[r] = c;
        lo[r] = v;
    }
    __syncwarp();
}

/* Top-8 of the logits into sel[8] / wt[8] (shared memory); the indices are
 * always 8 distinct values in [0, E).  The order is strict and total
 * (top8_comp), so the top 8 of E values are the top 8 of the union of the
 * top 8 of each chunk of 32: each warp reduces chunks of 32 to their top 8
 * by ranking within the warp (shuffles), round after round, until 8 are
 * left, in rank order.  A lane past the end, or an empty slot, enters as
 * 31 - lane: distinct, and below every valid value.  For E <= TOP8_FAST
 * the candidates fit in stage (10 KB); beyond, every thread counts the
 * experts above each of its own.  Ends with a barrier. */
#define TOP8_FAST 4096
__device__ __noinline__ void top8(const StepParams &P, int *sel, float *wt,
                                  float *stage)
{
    const int E = P.experts;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (E <= TOP8_FAST) {
        uint32_t *ca = reinterpret_cast<uint32_t *>(stage), *cb = ca + TOP8_FAST / 4;
        float *la = reinterpret_cast<float *>(cb + TOP8_FAST / 16), *lb = la + TOP8_FAST / 4;
        for (int ch = w; ch * 32 < E; ch += HDC_WARPS) {
            const int e = ch * 32 + lane;
            const float v = e < E ? ldcg(P.logits + e) : 0.0f;
            top8_chunk(e < E ? top8_comp(v, e) : 31u - lane, e < E, v, ca + ch * 8,
                       la + ch * 8);
        }
        int n = (E + 31) / 32 * 8;
        __syncthreads();
        while (n > 8) {
            for (int ch = w; ch * 32 < n; ch += HDC_WARPS) {
                const int i = ch * 32 + lane;
                const uint32_t c = i < n ? ca[i] : 0u;
                top8_chunk(c ? c : 31u - lane, c != 0u, c ? la[i] : 0.0f, cb + ch * 8,
                           lb + ch * 8);
            }
            n = (n + 31) / 32 * 8;
            __syncthreads();
            uint32_t *tc = ca;
            ca = cb;
            cb = tc;
            float *tl = la;
            la = lb;
            lb = tl;
        }
        /* n == 8: the top 8 in rank order (E >= 8, so none is empty) */
        if (threadIdx.x < 8) {
            sel[threadIdx.x] = (int)(0xFFFFu - (ca[threadIdx.x] & 0xFFFFu));
            wt[threadIdx.x] = la[threadIdx.x];
        }
    } else {
        for (int e = threadIdx.x; e < E; e += HDC_THREADS) {
            const uint32_t ke = rank_key(ldcg(P.logits + e));
            int r = 0;
            for (int i = 0; i < E && r < 8; i++) {
                uint32_t ki = rank_key(ldcg(P.logits + i));
                r += (ki > ke) | ((ki == ke) & (i < e));
            }
            if (r < 8) {
                sel[r] = e;
                wt[r] = ldcg(P.logits + e);
            }
        }
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        /* lane j < 8: w_j = exp(l_j - l_0) / sum * 2.446, the sum in the
         * order j = 0..7 (every lane adds the same shuffled values) */
        const int j = threadIdx.x & 7;
        const float e = expf(wt[j] - wt[0]);
        float total = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++)
            total += __shfl_sync(0xffffffffu, e, i);
        __syncwarp();
        if (threadIdx.x < 8)
            wt[j] = e / total * 2.446f;
    }
    __syncthreads();
}

/* CTA 0 publishes the top-8 choice (P.route: the experts, then their
 * weights) for the host. */
__device__ __forceinline__ void route_publish(const StepParams &P, const int *sel, const float *wt)
{
    if (blockIdx.x == 0 && threadIdx.x < 8) {
        P.route[threadIdx.x] = __int_as_float(sel[threadIdx.x]);
        P.route[8 + threadIdx.x] = wt[threadIdx.x];
    }
}

/* The down projections' columns of this CTA's tasks into L2 (the caller's
 * thread, with P.prefetch). */
__device__ __forceinline__ void down_prefetch(const LayerDev &L, const int *sel)
{
    for (int task = blockIdx.x; task < HDC_D / 16; task += gridDim.x) {
        for (int j = 0; j < 8; j++)
            prefetch_cols(L.down, sel[j], task * 16, 16);
        prefetch_cols(L.sdown, 0, task * 16, 16);
    }
}

/* This CTA's range of 9 x nbk units (9 maps of nbk units each: the down
 * phase's 144 units of 16 columns; phase X's 64 under HDC_SHARED_IN_X).
 * With at least 9 CTAs, map j gets CTAs [9 j / grid .. 9 (j + 1) / grid)
 * (14 or 15 of 132) and each of them one run of its columns, so that no
 * CTA pays a second map's vector, B fragments and ring fill (the 8 that
 * straddled two maps in an even split of all units ended 4-5 us after
 * the median one; device call 3 of 2026-12-03). */
__device__ __forceinline__ void map_range(int nbk, int &u0, int &u1)
{
    const int NU = 9 * nbk;
    const unsigned G = gridDim.x, b = blockIdx.x;
    if (G < 9) {
        u0 = (int)(b * NU / G);
        u1 = (int)((b + 1) * NU / G);
        return;
    }
    int j = 0;
    while (j < 8 && (unsigned)(j + 1) * G / 9 <= b)
        j++;
    const unsigned c0 = (unsigned)j * G / 9, n = (unsigned)(j + 1) * G / 9 - c0;
    u0 = j * nbk + (int)((b - c0) * nbk / n);
    u1 = j * nbk + (int)((b - c0 + 1) * nbk / n);
}

/* The down phase's range (see moe_down). */
__device__ __forceinline__ void down_range(int &u0, int &u1)
{
    map_range(HDC_D / 16, u0, u1);
}

#ifdef HDC_SHARED_IN_X
/* Phase X under HDC_SHARED_IN_X: the 9 experts' f_j (the shared one last)
 * as 9 x 64 units of 16 columns, this CTA's run of them (map_range).  A
 * CTA whose run is all the shared expert's needs no choice for its tiles:
 * it runs the top-8 (which phase D reads) after them, off the phase's
 * critical path. */
__device__ __noinline__ void moe_experts_units(const StepParams &P, const LayerDev &L, float *sm,
                                  unsigned long long *tr)
{
    constexpr int NBX = MOE_I / 16;
    float *red = sm + SM_RED, *out = sm + SM_OUT;
    int *sel = reinterpret_cast<int *>(sm + SM_SEL);
    float *wt = sm + SM_WT;
    const uint2 *xb = reinterpret_cast<const uint2 *>(sm + SM_XB);
    int u0, u1;
    map_range(NBX, u0, u1);
    const bool shared_only = u0 >= 8 * NBX;
    if (!shared_only)
        top8(P, sel, wt, red);
    trace_mark(tr, 16);
    if (P.prefetch && threadIdx.x == 0 && !shared_only)
        down_prefetch(L, sel);
    for (int j = u0 / NBX; j < 9 && j * NBX < u1; j++) {
        const int b0 = max(u0 - j * NBX, 0), b1 = min(u1 - j * NBX, NBX);
        for (int c0 = b0; c0 < b1; c0 += 8) { /* red holds 2 maps x 8 blocks */
            const int nb = min(8, b1 - c0);
            MatTile m[2] = {j < 8 ? mat_tile(L.gate, sel[j], c0 * 16, xb, 1)
                                  : mat_tile(L.sgate, 0, c0 * 16, xb, 1),
                            j < 8 ? mat_tile(L.up, sel[j], c0 * 16, xb, 1)
                                  : mat_tile(L.sup, 0, c0 * 16, xb, 1)};
            trace_mark(tr, 37);
            gemv_run(m, 2, nb, HDC_D, red, out);
            if (threadIdx.x < nb * 16)
                P.ff[j * MOE_I + c0 * 16 + threadIdx.x] =
                    silu(out[threadIdx.x]) * out[nb * 16 + threadIdx.x];
            if (P.use_flags)
                flag_signal(P.flags + HDC_FL_EXPERT + j, (unsigned)nb);
            trace_mark(tr, 17);
        }
    }
    if (shared_only) /* gemv_run's last readers of red met at its end */
        top8(P, sel, wt, red);
    route_publish(P, sel, wt);
}
#endif

/* Phase X: the 8 routed experts' f_j = silu(x gate_j) * (x up_j): 8 x 32
 * tiles.  CTA 0 publishes the choice for phase D. */
__device__ __noinline__ void moe_experts(const StepParams &P, const LayerDev &L, float *sm)
{
    float *red = sm + SM_RED, *out = sm + SM_OUT;
    int *sel = reinterpret_cast<int *>(sm + SM_SEL);
    float *wt = sm + SM_WT;
    const uint2 *xb = reinterpret_cast<const uint2 *>(sm + SM_XB);
    /* x = norm(h) is still in shared memory (xs and its B fragments at
     * SM_XB) from phase R: h has not changed since, and nothing in between
     * writes there. */
    unsigned long long *tr = layer_trace(P, L);
    trace_mark(tr, 15);
    /* HDC_ROUTER_FLAG: every logit task of phase R is done (in place of
     * the grid barrier; h still changes only after every CTA's RMSNorm,
     * since the down phase waits for all 256 gate/up tasks) */
    if (HDC_ROUTER_FLAGS && P.use_flags)
        flag_wait(P.flags + HDC_FL_LOGITS, (unsigned)router_tasks(P.experts));
#ifdef HDC_SHARED_IN_X
    moe_experts_units(P, L, sm, tr);
    return;
#endif
    top8(P, sel, wt, red);
    trace_mark(tr, 16);
#ifdef HDC_ICACHE_PROBE
    /* (a measurement switch) the top-8 once more, its code now fetched:
     * trace point 60 after it; the same logits give the same choice */
    top8(P, sel, wt, red);
    trace_mark(tr, 60);
#endif
    route_publish(P, sel, wt);
    if (P.prefetch && threadIdx.x == 0) {
        /* this phase's later tasks, then the down projections' */
        for (int task = blockIdx.x + gridDim.x; task < 8 * (MOE_I / 32); task += gridDim.x) {
            int j = task / (MOE_I / 32), n0 = (task % (MOE_I / 32)) * 32;
            prefetch_cols(L.gate, sel[j], n0, 32);
            prefetch_cols(L.up, sel[j], n0, 32);
        }
        down_prefetch(L, sel);
    }
    /* a CTA's tasks two at a time in one GEMV, so that its weight stream
     * does not drain between them */
    for (int t0 = blockIdx.x; t0 < 8 * (MOE_I / 32); t0 += 2 * gridDim.x) {
        const int nt = t0 + gridDim.x < 8 * (MOE_I / 32) ? 2 : 1;
        MatTile m[4];
        for (int i = 0; i < nt; i++) {
            const int task = t0 + i * gridDim.x;
            const int j = task / (MOE_I / 32), n0 = (task % (MOE_I / 32)) * 32;
            m[2 * i] = mat_tile(L.gate, sel[j], n0, xb, 1);
            m[2 * i + 1] = mat_tile(L.up, sel[j], n0, xb, 1);
        }
        trace_mark(tr, 37);
        gemv_run(m, 2 * nt, 2, HDC_D, red, out);
        if (threadIdx.x < 32 * nt) {
            const int i = threadIdx.x >> 5, c = threadIdx.x & 31;
            const int task = t0 + i * gridDim.x;
            const int j = task / (MOE_I / 32), n0 = (task % (MOE_I / 32)) * 32;
            P.ff[j * MOE_I + n0 + c] = silu(out[64 * i + c]) * out[64 * i + 32 + c];
        }
        if (P.use_flags)
            for (int i = 0; i < nt; i++)
                flag_signal(P.flags + HDC_FL_EXPERT + (t0 + i * gridDim.x) / (MOE_I / 32));
        trace_mark(tr, 17);
    }
}

/* The first GEMV of this CTA in moe_down (sel: the chosen experts), for
 * gemv_prime at the end of moe_experts. */
__device__ __forceinline__ int moe_down_tiles(const LayerDev &L, const int *sel, MatTile *m,
                                              int &NB, int &K)
{
    constexpr int NBK = HDC_D / 16;
    int u0, u1;
    down_range(u0, u1);
    const int j = u0 / NBK;
    K = MOE_I;
    NB = 0;
    if (j >= 9 || u1 <= u0)
        return 0;
    const int b0 = u0 - j * NBK, b1 = min(u1 - j * NBK, NBK);
    NB = min(16, b1 - b0);
    m[0] = j < 8 ? mat_tile(L.down, sel[j], b0 * 16, sm_xb(), 3)
                 : mat_tile(L.sdown, 0, b0 * 16, sm_xb(), 3);
    return 1;
}

/* Phase D: the 9 down projections (8 routed, the shared one) as 9 x 144
 * units of 16 columns, map-major, split evenly over the CTAs (a CTA's
 * range spans one or two maps, so it builds the B fragments of only those
 * f_j).  Each unit's outputs go to dpart; the CTA that completes a column
 * block (its 9th unit, counted in dcnt) sums it in the fixed order
 *   t = bf(sum_j w_j y_j + y_shared), h = bf(h + t)
 * and puts the count back to 0. */
__device__ __noinline__ void moe_down(const StepParams &P, const LayerDev &L, bool last,
                         float *sm)
{
    float *xs = sm + SM_XS, *red = sm + SM_RED, *out = sm + SM_OUT;
    int *fin = reinterpret_cast<int *>(sm + SM_MISC + 64);
    const uint2 *xb = reinterpret_cast<const uint2 *>(sm + SM_XB);
    constexpr int NBK = HDC_D / 16;
    int u0, u1;
    down_range(u0, u1);
    unsigned long long *tr = layer_trace(P, L);
    /* The choice of phase X: every CTA ran top8 there, and nothing since
     * wrote these bytes.  (Every thread reading P.route instead put 34 k
     * requests on one L2 line: 9 us a layer, Nsight Compute 2026-12-03.) */
    const int *sel = reinterpret_cast<const int *>(sm + SM_SEL);
    const float *wt = sm + SM_WT;
    trace_mark(tr, 13);
    for (int j = u0 / NBK; j < 9 && j * NBK < u1; j++) {
        const int b0 = max(u0 - j * NBK, 0), b1 = min(u1 - j * NBK, NBK);
        /* without a grid barrier after phase X: map j's gate/up (the
         * routed experts', and under HDC_SHARED_IN_X the shared one's; else
         * the shared expert's f is from phase R, waited for here only under
         * HDC_ROUTER_FLAG) */
        if (P.use_flags && j < MOE_X_MAPS)
            flag_wait(P.flags + HDC_FL_EXPERT + j, MOE_X_DONE);
        else if (HDC_ROUTER_FLAGS && P.use_flags)
            flag_wait(P.flags + HDC_FL_SHARED, MOE_I / 16);
        load_xs<MOE_I>(P.ff + j * MOE_I, xs, 3); /* fp32 values */
        trace_mark(tr, 18);
        for (int c0 = b0; c0 < b1; c0 += 16) {
            const int nb = min(16, b1 - c0);
            MatTile m[1] = {j < 8 ? mat_tile(L.down, sel[j], c0 * 16, xb, 3)
                                  : mat_tile(L.sdown, 0, c0 * 16, xb, 3)};
            trace_mark(tr, 38);
            gemv_run(m, 1, nb, MOE_I, red, out);
            trace_mark(tr, 19);
            if (threadIdx.x < nb * 16) {
                P.dpart[j * HDC_D + c0 * 16 + threadIdx.x] = out[threadIdx.x];
                __threadfence();
            }
            __syncthreads();
            if (threadIdx.x < nb)
                fin[threadIdx.x] = atomicAdd(P.dcnt + c0 + threadIdx.x, 1u) == 8u;
            __syncthreads();
            if (threadIdx.x < nb * 16 && fin[threadIdx.x >> 4]) {
                __threadfence();
                const int n = c0 * 16 + threadIdx.x;
                float acc = 0.0f;
#pragma unroll
                for (int k = 0; k < 8; k++)
                    acc = fmaf(ldcg(P.dpart + k * HDC_D + n), wt[k], acc);
                float t = bfr(acc + ldcg(P.dpart + 8 * HDC_D + n));
                float hn = bfr(ldcg(P.h + n) + t);
                P.h[n] = hn;
                if (last)
                    P.hout[n] = f2bf(hn);
                if ((threadIdx.x & 15) == 0)
                    P.dcnt[c0 + (threadIdx.x >> 4)] = 0u;
            }
            __syncthreads();
        }
    }
}

#endif
