/* gemv.cuh - the int4 GEMV tile on tensor cores: TW columns (16 or 32) of NM
 * maps that share K.
 *
 * The weights come in units of 16 columns x 64 rows (repack.cu): one 16-byte
 * load a lane, four mma.m16n8k16 A fragments.  Each lane dequantizes its 32
 * weights two at a time in bf16x2, exactly as SEMANTICS.md rounds them
 * (deq), and the tensor cores multiply them by x.  x enters as the B operand
 * split into three bf16 parts, hi + mid + lo = x exactly (xb_build), in the
 * columns 0, 1, 2 of B, so the fp32 x is not rounded; the products are
 * exact and the sums fp32.
 *
 * The weights stream through a shared-memory ring (gemv_run); a group of
 * S warps takes a 16-column block, each warp a run of its KU = K / 64
 * units, and the S partial sums are added in a fixed order, so results do
 * not change from run to run. */
#ifndef HD_CUDA_GEMV_CUH
#define HD_CUDA_GEMV_CUH

#include "common.cuh"
#ifdef HDC_PRIME_DEBUG
#include <cstdio>
#endif

struct MatTile {
    const uint4 *w;  /* member base */
    const uint2 *sz;
    int N, n0;
    const uint2 *xb; /* x as B fragments (xs_finish), in shared memory */
    int xl;          /* lanes that hold parts of x: 4 (bf16 x) or 12 */
};

/* Two weights from the nibbles at bits 0-3 and 16-19 of v:
 * fma(bf((128 + q) - c1), s, c2) = bf((q - z) * s), rounded once. */
__device__ __forceinline__ uint32_t deq(uint32_t v, uint32_t c1, uint32_t s2,
                                        uint32_t c2)
{
    uint32_t b;
    asm("lop3.b32 %0, %1, 0x000F000F, 0x43004300, 0xEA;" : "=r"(b) : "r"(v));
    __nv_bfloat162 q = *reinterpret_cast<__nv_bfloat162 *>(&b);
    q = __hsub2(q, *reinterpret_cast<const __nv_bfloat162 *>(&c1));
    q = __hfma2(q, *reinterpret_cast<const __nv_bfloat162 *>(&s2),
                *reinterpret_cast<const __nv_bfloat162 *>(&c2));
    return *reinterpret_cast<uint32_t *>(&q);
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1,
                                         uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* The three dequantization constants of a (group, column) as bf16x2. */
struct Deq {
    uint32_t s2, c1, c2;
};

__device__ __forceinline__ Deq deq_consts(uint2 v)
{
    Deq d;
    d.s2 = v.x;
    d.c1 = __byte_perm(v.y, 0, 0x1010);
    d.c2 = __byte_perm(v.y, 0, 0x3232);
    return d;
}

/* One unit: four 16-row steps of a 16-column block, the even steps into
 * acc0 and the odd ones into acc1 (two independent mma chains); bx: the
 * B fragments of the four steps. */
__device__ __forceinline__ void unit_mma(float (&acc0)[4], float (&acc1)[4], uint4 q,
                                         const Deq &za, const Deq &zb, const uint2 (&bx)[4])
{
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t v = words[i];
        uint32_t a0 = deq(v, za.c1, za.s2, za.c2);
        uint32_t a1 = deq(v >> 4, zb.c1, zb.s2, zb.c2);
        uint32_t a2 = deq(v >> 8, za.c1, za.s2, za.c2);
        uint32_t a3 = deq(v >> 12, zb.c1, zb.s2, zb.c2);
        mma_bf16(i & 1 ? acc1 : acc0, a0, a1, a2, a3, bx[i].x, bx[i].y);
    }
}

/* The weights are read once per step: they go to L2 with evict_first (so
 * that they push out each other, not the code and the activations) and
 * skip L1. */
__device__ __forceinline__ unsigned long long evict_first_policy()
{
    unsigned long long pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}

/* The unit loop's unroll factor: a switch for scripts/gemv-bench.cu's
 * measurements (the module is built with 2; 1 and 4 measured no faster,
 * nor were the next unit's words loaded ahead, nor a group's constants
 * loaded once for its two units: docs/PERF-CUDA.md, ninth session). */
#ifndef GEMV_UNROLL
#define GEMV_UNROLL 2
#endif
constexpr int kGemvUnroll = GEMV_UNROLL; /* (#pragma unroll takes no macro) */

/* The ring: shared memory past the GEMV map (SM_XB_END) that the bulk
 * copies of a task's weight blocks stream into, and its mbarriers.  Each
 * gemv_run drains it before it returns, so other phases may use the ring's
 * bytes (the attention does), but nothing from GEMV_BAR_OFF on: the "full"
 * barriers live through the launch (RingCtl). */
#define GEMV_RING_OFF (SM_XB_END * 4)
#define GEMV_RING_BYTES (152 * 1024)
#define GEMV_RING_SLOTS 16
#define GEMV_BAR_OFF (GEMV_RING_OFF + GEMV_RING_BYTES)
#define GEMV_TILE_OFF (GEMV_BAR_OFF + 2 * GEMV_RING_SLOTS * 8)
#define GEMV_MAXMAPS 9
#define GEMV_SEQ_OFF (GEMV_TILE_OFF + GEMV_MAXMAPS * 48)
/* The blocks that gemv_prime issues before the grid barrier (at most the
 * call's ns); gemv_run issues the rest of its first ns.  All by default. */
#ifndef HDC_PRIME_BLOCKS
#define HDC_PRIME_BLOCKS GEMV_RING_SLOTS
#endif
static_assert(HDC_PRIME_BLOCKS >= 1 && HDC_PRIME_BLOCKS <= GEMV_RING_SLOTS, "primed blocks");
static_assert(sizeof(MatTile) <= 48, "tile size");
static_assert(GEMV_SEQ_OFF + (3 * GEMV_RING_SLOTS + 4) * 4 <= HDC_SMEM_BYTES, "smem map");

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void mbar_init(uint32_t bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" : : "r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_inval(uint32_t bar)
{
    asm volatile("mbarrier.inval.shared::cta.b64 [%0];" : : "r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" : : "r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 : : "r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
    uint32_t done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}

/* bytes (a multiple of 16) from global src to shared dst, completing as
 * transaction bytes on bar. */
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void *src, uint32_t bytes,
                                         uint32_t bar, unsigned long long pol)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".L2::cache_hint [%0], [%1], %2, [%3], %4;"
                 : : "r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(pol) : "memory");
}

/* Block nb (a 16-column block index) of tile t: the weights, then the
 * constants, into a ring slot. */
__device__ __forceinline__ void ring_issue(const MatTile &t, int nb, int KU, uint32_t slot,
                                           uint32_t bar, unsigned long long pol)
{
    const uint32_t wb = (uint32_t)KU * 512u, zb = (uint32_t)(KU / 2) * 128u;
    mbar_expect_tx(bar, wb + zb);
    bulk_g2s(slot, t.w + (size_t)nb * KU * 32, wb, bar, pol);
    bulk_g2s(slot + wb, t.sz + (size_t)nb * (KU / 2) * 16, zb, bar, pol);
}

__device__ __forceinline__ uint4 lds128(uint32_t a)
{
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a) : "memory");
    return v;
}

__device__ __forceinline__ uint2 lds64(uint32_t a)
{
    uint2 v;
    asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(a) : "memory");
    return v;
}

/* Volatile, so that a loop-invariant read is not hoisted into a register
 * that lives through the loop. */
__device__ __forceinline__ float lds32f(uint32_t a)
{
    float v;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
    return v;
}

/* HD_CUDA_TRACE=N: the events of CTA 5's N-th gemv_run of a launch (block
 * issued, warp 0 and warp 15 see it, warp 15 done), read by
 * hdc_gemv_trace.  g_gtr_n counts CTA 5's calls (thread 0, before the
 * call's first __syncthreads). */
__device__ unsigned long long g_gtr[4][64];
__device__ int g_gtr_n;
/* The switches the host sets between launches live in the constant bank:
 * read on every GEMV call and block, a global variable cost an L2 round
 * trip each time (Nsight Compute, 2026-12-03: 2-3 % of all stall
 * samples, on the path that issues the ring's copies). */
__constant__ int g_gtr_on;

/* CTA 5 in the traced call, not yet done; the volatile reads come after
 * the constant-bank test, so no other CTA issues them. */
__device__ __forceinline__ bool gtr_armed()
{
    return blockIdx.x == 5 && g_gtr_on &&
           *const_cast<volatile int *>(&g_gtr_n) == g_gtr_on &&
           *const_cast<volatile unsigned long long *>(&g_gtr[0][63]) == 0;
}

__device__ __forceinline__ void gtr_mark(int ev, int jb)
{
    if (jb < 63 && gtr_armed()) {
        unsigned long long ns;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
        g_gtr[ev][jb] = ns;
    }
}

__constant__ int g_slots_cap; /* HD_CUDA_SLOTS (0: as many as fit) */

/* The ring's geometry for a task: slot size and slot count. */
__device__ __forceinline__ int ring_slots(int K, int NJB, uint32_t &slot_bytes)
{
    const int KU = K / 64;
    slot_bytes = (uint32_t)KU * 512u + (uint32_t)(KU / 2) * 128u;
    int ns = GEMV_RING_BYTES / slot_bytes;
    ns = ns < GEMV_RING_SLOTS ? ns : GEMV_RING_SLOTS;
    if (g_slots_cap && ns > g_slots_cap)
        ns = g_slots_cap;
    return ns < NJB ? ns : NJB;
}

/* How many warps share a 16-column block (S, a power of two; the 16 / S
 * groups of S warps take blocks g, g + 16 / S, ...).  A warp's time is
 * modelled as rounds x (units + 12) + 2 x units: 12 units (about 3.5 us)
 * of fixed cost per block a group takes (its wait for the block's bytes,
 * the partial sums, the refill), and the last block's units after it
 * lands, counted twice; the least of that, with no more groups than ring
 * slots (a group beyond them would wait for a refill in its first
 * round), and on a tie the smaller S.  The constants fit every split
 * measured with HD_CUDA_SPLIT forced to 2, 4 and 8 (device call 4 of
 * 2026-12-03's third session: the projections and experts are fastest
 * with S = 4, the down projections with S = 2 (15.4 against 17.6 us a
 * layer), o_proj's two-block CTAs with S = 8 (9.8 against 10.9 us) and
 * the merge's W_v GEMV with S = 2 (22.9 against 24.4 us for the phase);
 * the earlier constants (units + 1, + units) chose 4 to 16 there. */
__constant__ int g_split_force; /* HD_CUDA_SPLIT (0: choose) */

__device__ __forceinline__ int gemv_split(int NJB, int KU, int ns)
{
    if (g_split_force)
        return g_split_force;
    int best = HDC_WARPS, bc = 1 << 30;
    for (int S = 1; S <= HDC_WARPS; S <<= 1) {
        const int G = HDC_WARPS / S;
        if (G > 1 && G > ns)
            continue;
        const int u = (KU + S - 1) / S;
        const int c = ((NJB + G - 1) / G) * (u + 12) + 2 * u;
        if (c < bc) {
            bc = c;
            best = S;
        }
    }
    return best;
}

/* Block b of the call (tile b / NB, its block b % NB) into ring slot sl,
 * announced in seq[sl] first (the consumers of b wait for that before they
 * wait on the slot's full barrier, whose parity alone cannot tell b from
 * the block ns earlier). */
__device__ __forceinline__ void ring_put(const MatTile *tl, int b, int NB, int KU,
                                         uint32_t ring, uint32_t slot_bytes, uint32_t full,
                                         volatile int *seq, int sl, unsigned long long pol)
{
    const int j = b / NB;
    /* an atomic store and atomic reads: the flag is polled (and racecheck
     * counts plain accesses to it as a race) */
    atomicExch(const_cast<int *>(seq) + sl, b);
    gtr_mark(0, b);
    ring_issue(tl[j], (tl[j].n0 >> 4) + b % NB, KU, ring + sl * slot_bytes, full + sl * 8, pol);
}

/* Thread i in [lo, hi) issues block i of a call into slot i: the first
 * blocks, after the slots were set up (gemv_setup), or the rest of them
 * after a prime that issued fewer (gemv_run).  The caller's __syncthreads
 * that follows publishes seq[]. */
__device__ __forceinline__ void ring_put_first(const MatTile *tl, int lo, int hi, int NB, int KU,
                                               uint32_t ring, uint32_t slot_bytes,
                                               uint32_t full, volatile int *seq,
                                               unsigned long long pol)
{
    const int i = threadIdx.x;
    if (i >= lo && i < hi) {
        /* bytes other phases wrote with ordinary stores (ordered by the
         * caller's barrier) before the async proxy's writes */
        asm volatile("fence.proxy.async.shared::cta;" : : : "memory");
        ring_put(tl, i, NB, KU, ring, slot_bytes, full, seq, i, pol);
    }
}

/* Where the ring's parts lie in shared memory: the slots, their "full" and
 * "empty" mbarriers (shared-window addresses), the call's tiles (for the
 * issuers), the block each slot holds or awaits (seq), the warps done with
 * each slot (cnt, cumulative over the call), the primed record {primed,
 * nm, NB, K} (gemv_prime), and the phases each slot's "full" barrier has
 * completed since the launch began (fph).
 *
 * The "full" barriers live through the launch (gemv_reset initializes
 * them; a call goes on from the phase where the last one left each), the
 * "empty" ones only through a call (their arrival count is the call's
 * split).  Invalidating and initializing a "full" barrier again between
 * two calls is as correct by the PTX memory model, but racecheck then
 * loses the order between a copy of the first call and one of the second
 * into the same bytes and reports the pair (racecheck-gemv.cu's modes 1,
 * 3 and 4, docs/PERF-CUDA.md, fourteenth session). */
struct RingCtl {
    uint32_t ring, full, empty;
    MatTile *tl;
    volatile int *seq;
    int *cnt, *prm, *fph;
};

__device__ __forceinline__ RingCtl ring_ctl()
{
    extern __shared__ float4 smem4[];
    char *b = reinterpret_cast<char *>(smem4);
    int *ints = reinterpret_cast<int *>(b + GEMV_SEQ_OFF);
    RingCtl c;
    c.ring = smem_addr(smem4) + GEMV_RING_OFF;
    c.full = smem_addr(smem4) + GEMV_BAR_OFF;
    c.empty = c.full + GEMV_RING_SLOTS * 8;
    c.tl = reinterpret_cast<MatTile *>(b + GEMV_TILE_OFF);
    c.seq = ints;
    c.cnt = ints + GEMV_RING_SLOTS;
    c.prm = ints + 2 * GEMV_RING_SLOTS;
    c.fph = ints + 2 * GEMV_RING_SLOTS + 4;
    return c;
}

/* Set the ring up for a call (every thread calls; ends with
 * __syncthreads): the tiles into shared memory (for the issuers; the
 * caller's array is in local memory), the "empty" barriers and the
 * counters, and the first min(ns, first) blocks issued (gemv_run issues
 * the rest of the first ns where gemv_prime issued fewer). */
__device__ __noinline__ void gemv_setup(const MatTile *m, int nm, int NB, int K,
                                        int first = GEMV_RING_SLOTS)
{
    const int NJB = nm * NB, KU = K / 64;
    const RingCtl c = ring_ctl();
    const uint32_t full = c.full, empty = c.empty;
    MatTile *tl = c.tl;
    int *cnt = c.cnt;
    uint32_t slot_bytes;
    const int ns = ring_slots(K, NJB, slot_bytes);
    const int S = gemv_split(NJB, KU, ns);
    const unsigned long long pol = evict_first_policy();
    /* (Issuing a phase's first blocks before its RMSNorm or B
     * fragments was measured slower: the bulk copies queue ahead of those
     * small, critical loads.) */
    if (threadIdx.x < nm)
        tl[threadIdx.x] = m[threadIdx.x];
    /* thread i < ns sets slot i up and issues its first block (one thread
     * issuing all of them made the other 511 wait that much longer) */
    const int i = threadIdx.x;
    if (i < ns) {
        mbar_init(empty + i * 8, (unsigned)S * 32u);
        cnt[i] = 0;
        asm volatile("fence.mbarrier_init.release.cluster;" : : : "memory");
    }
    __syncthreads();
    ring_put_first(tl, 0, min(ns, first), NB, KU, c.ring, slot_bytes, full, c.seq, pol);
    __syncthreads(); /* seq[] of the first blocks */
}

/* Set the ring up for the CTA's first GEMV of the next phase and start its
 * copies, before the grid barrier: the weights do not depend on the data,
 * so they stream while the grid waits, and gemv_run finds them (it checks
 * that it is called with the same maps).  Nothing between here and that
 * call may touch the ring's bytes.  Every thread calls. */
__device__ __forceinline__ void gemv_prime(const MatTile *m, int nm, int NB, int K)
{
    if (nm == 0)
        return;
    gemv_setup(m, nm, NB, K, HDC_PRIME_BLOCKS);
    if (threadIdx.x == 0) {
        int *prm = ring_ctl().prm;
        prm[0] = HDC_PRIME_BLOCKS; /* the blocks issued, at most */
        prm[1] = nm;
        prm[2] = NB;
        prm[3] = K;
    }
    /* the grid barrier that follows begins with __syncthreads */
}

/* gemv_prime inside a phase where on, once the phase's own small loads
 * (its vector) are in: the copies of its first GEMV's blocks then stream
 * while it finishes the vector (the norm, the B fragments) instead of
 * after.  tiles(src, m, NB, K) names that GEMV's NM or fewer maps, as the
 * phase calls it (kda_proj_tiles and the like).  Not where the ring was
 * primed before the grid barrier (P.prime).  Every thread calls. */
template <int NM, typename Src, typename Tiles>
__device__ __forceinline__ void gemv_prime_late(int on, const Src &src, Tiles tiles)
{
    if (!on)
        return;
    MatTile m[NM];
    int nb, k;
    const int n = tiles(src, m, nb, k);
    if (ring_ctl().prm[0])
        return;
    gemv_prime(m, n, nb, k);
}

/* At the start of a launch: no ring is primed (shared memory starts with
 * whatever the last kernel left there), and the "full" barriers are
 * initialized, at phase 0.  Thread 0; a __syncthreads must follow before
 * the first GEMV.  Nothing else may write the barriers' bytes
 * (GEMV_BAR_OFF on) until the launch ends. */
__device__ __forceinline__ void gemv_reset()
{
    if (threadIdx.x == 0) {
        const RingCtl c = ring_ctl();
        c.prm[0] = 0;
        for (int i = 0; i < GEMV_RING_SLOTS; i++) {
            mbar_init(c.full + i * 8, 1);
            c.fph[i] = 0;
        }
        asm volatile("fence.mbarrier_init.release.cluster;" : : : "memory");
    }
}

__device__ __forceinline__ const uint2 *sm_xb()
{
    extern __shared__ float4 smem4[];
    return reinterpret_cast<const uint2 *>(reinterpret_cast<float *>(smem4) + SM_XB);
}

/* out[j * 16 NB + c] = sum_k x_j[k] w_j[k][n0_j + c] for the nm maps of K
 * rows, NB blocks of 16 columns each.  red: HDC_WARPS * nm * NB * 16
 * floats; out: nm * NB * 16.
 *
 * The ring: thread 0 issues the first ns blocks (weights and constants of
 * one 16-column block each, one bulk copy pair) into the ring's slots; the
 * block ns later in the same slot is issued by whichever warp finishes the
 * slot's block last (every thread arrives on the slot's "empty" barrier,
 * lane 0 counts the warps, the last one waits on that barrier and issues),
 * so no warp is a producer that the others wait for.  The warps are cut
 * into groups of S (gemv_split): a group takes every (16 / S)-th block, a
 * warp of the group a contiguous run of its K / 64 units, so a warp pays
 * the per-block costs (barrier wait, partial sums) once per run instead
 * of once per two or three units.  The S partial sums of a column are
 * added in a fixed order: results do not change from run to run.  Every
 * thread of the CTA must call; ends with __syncthreads. */
__device__ __noinline__ void gemv_run(const MatTile *m, int nm, int NB, int K,
                                      float *red, float *out)
{
    const int NJB = nm * NB, KU = K / 64;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tq = lane & 3;
    const RingCtl c = ring_ctl();
    const uint32_t ring = c.ring, full = c.full, empty = c.empty;
    MatTile *tl = c.tl;
    volatile int *seq = c.seq;
    int *cnt = c.cnt;
    const uint32_t wbytes = (uint32_t)KU * 512u;
    uint32_t slot_bytes;
    const int ns = ring_slots(K, NJB, slot_bytes);
    const int S = gemv_split(NJB, KU, ns), G = HDC_WARPS / S;
    const int gi = w / S, si = w % S;
    const int u0 = si * KU / S, u1 = (si + 1) * KU / S;
    const unsigned long long pol = evict_first_policy();

    if (blockIdx.x == 5 && threadIdx.x == 0 && g_gtr_on)
        (*const_cast<volatile int *>(&g_gtr_n))++;
    /* the ring was set up for this very call before the grid barrier
     * (gemv_prime), or is set up now */
    {
        int *prm = c.prm;
        const int primed = prm[0]; /* read before thread 0 clears it */
        bool same = primed && prm[1] == nm && prm[2] == NB && prm[3] == K;
        for (int j = 0; same && j < nm; j++)
            same = tl[j].w == m[j].w && tl[j].sz == m[j].sz && tl[j].n0 == m[j].n0 &&
                   tl[j].xb == m[j].xb && tl[j].xl == m[j].xl;
#ifdef HDC_PRIME_DEBUG
        if (prm[0] && threadIdx.x == 0 && blockIdx.x < 3) {
            int fw = 0;
            for (int j = 0; j < nm && j < prm[1]; j++)
                fw |= (tl[j].w != m[j].w) | (tl[j].sz != m[j].sz) << 1 |
                      (tl[j].n0 != m[j].n0) << 2 | (tl[j].xb != m[j].xb) << 3 |
                      (tl[j].xl != m[j].xl) << 4;
            printf("prime cta %d same %d nm %d/%d NB %d/%d K %d/%d fields %x xb %p/%p\n",
                   blockIdx.x, (int)same, prm[1], nm, prm[2], NB, prm[3], K, fw,
                   (const void *)tl[0].xb, (const void *)m[0].xb);
        }
#endif
        if (prm[0] && !same && threadIdx.x == 0) {
            /* primed for another call (not expected): let its copies land */
            uint32_t sb;
            const int pns = ring_slots(prm[3], prm[1] * prm[2], sb);
            for (int i = 0; i < pns; i++) {
                if (i < primed) { /* the slots whose blocks it issued */
                    mbar_wait(full + i * 8, (uint32_t)c.fph[i] & 1u);
                    c.fph[i]++;
                }
                mbar_inval(empty + i * 8);
            }
        }
        __syncthreads();
        if (threadIdx.x == 0)
            prm[0] = 0;
        if (!same)
            gemv_setup(m, nm, NB, K);
        else if (HDC_PRIME_BLOCKS < GEMV_RING_SLOTS && primed < ns) {
            /* gemv_prime issued the first `primed` blocks: the others of
             * the first ns now, as gemv_setup would have */
            ring_put_first(tl, primed, ns, NB, KU, ring, slot_bytes, full, seq, pol);
            __syncthreads(); /* seq[] of those blocks */
        }
    }


#pragma unroll 1
    for (int jb = gi; jb < NJB; jb += G) {
        const int j = jb / NB, sl = jb % ns;
        /* the slot's use in this call: the phase of its "empty" barrier;
         * of its "full" one, that after the uses of earlier calls */
        const uint32_t ph = (uint32_t)(jb / ns) & 1u;
        const uint32_t fp = (uint32_t)(c.fph[sl] + jb / ns) & 1u;
        const uint32_t xb = smem_addr(tl[j].xb) + (uint32_t)lane * 8u;
        const bool has_x = lane < tl[j].xl;
        const uint32_t sw = ring + sl * slot_bytes, sz = sw + wbytes;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (lane == 0)
            while (atomicAdd(const_cast<int *>(seq) + sl, 0) != jb)
                ;
        __syncwarp();
        mbar_wait(full + sl * 8, fp);
        if (lane == 0 && si == S - 1)
            gtr_mark(1, jb);
        if (lane == 0 && si == 0)
            gtr_mark(2, jb);
#pragma unroll kGemvUnroll
        for (int u = u0; u < u1; u++) {
            const uint4 q = lds128(sw + (uint32_t)((u * 32 + lane) * 16));
            const uint32_t zp = sz + (uint32_t)(((u >> 1) * 16 + g) * 8);
            const uint32_t xc = xb + (uint32_t)u * (4 * 12 * 8);
            uint2 bx[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                bx[i] = has_x ? lds64(xc + i * 12 * 8) : make_uint2(0u, 0u);
            unit_mma(acc, acc1, q, deq_consts(lds64(zp)), deq_consts(lds64(zp + 64)), bx);
        }
        if (lane == 0 && si == 0)
            gtr_mark(3, jb);
        /* every thread releases its own reads of the slot (an arrival
         * orders only the arriving thread's accesses); the group's last
         * warp refills it */
        mbar_arrive(empty + sl * 8);
        __syncwarp();
        if (lane == 0 && atomicAdd(cnt + sl, 1) == (jb / ns + 1) * S - 1 && jb + ns < NJB) {
            mbar_wait(empty + sl * 8, ph);
            /* the consumers' ld.shared (released by their arrivals,
             * acquired by the wait) before the async proxy's writes */
            asm volatile("fence.proxy.async.shared::cta;" : : : "memory");
            ring_put(tl, jb + ns, NB, KU, ring, slot_bytes, full, seq, sl, pol);
        }
#pragma unroll
        for (int i = 0; i < 4; i++)
            acc[i] += acc1[i];
        /* column 0 + column 1 here, column 2 in the next lane */
        float lo0 = __shfl_down_sync(0xffffffffu, acc[0], 1);
        float lo2 = __shfl_down_sync(0xffffffffu, acc[2], 1);
        if (tq == 0) {
            red[(si * NJB + jb) * 16 + g] = (acc[0] + acc[1]) + lo0;
            red[(si * NJB + jb) * 16 + g + 8] = (acc[2] + acc[3]) + lo2;
        }
    }
    __syncthreads();
    if (threadIdx.x < NJB * 16) {
        float s = 0.0f;
        for (int i = 0; i < S; i++)
            s += red[i * NJB * 16 + threadIdx.x];
        out[threadIdx.x] = s;
    }
    /* thread i: slot i's phases (the blocks through it) and its "empty"
     * barrier, all slots at once (a division each: in one thread's loop
     * they cost about 1 % of a step, an A/B on an H100) */
    if (threadIdx.x < ns) {
        const int i = threadIdx.x;
        c.fph[i] += (NJB - 1 - i) / ns + 1;
        mbar_inval(empty + i * 8);
    }
    if (threadIdx.x == 0) {
        if (gtr_armed())
            g_gtr[0][63] = (unsigned long long)NJB;
    }
    __syncthreads();
}

template <int TW, int NM, int K>
__device__ __forceinline__ void gemv_tile(const MatTile (&m)[NM], float *red, float *out)
{
    static_assert(TW % 16 == 0 && K % 128 == 0,
                  "tile shape");
    gemv_run(m, NM, TW / 16, K, red, out);
}

/* L2 prefetch of ncols columns from n0 (multiples of 16) of a member: one
 * run of weights and one of constants. */
__device__ __forceinline__ void prefetch_cols(const QMat &q, int member, int n0,
                                              int ncols)
{
    const size_t KU = (size_t)q.K / 64;
    l2_prefetch(q.w + member * q.wstride + (size_t)(n0 / 16) * KU * 32,
                (uint32_t)((size_t)(ncols / 16) * KU * 512));
    l2_prefetch(q.sz + member * q.szstride + (size_t)(n0 / 16) * (KU / 2) * 16,
                (uint32_t)((size_t)(ncols / 16) * (KU / 2) * 128));
}

__device__ __forceinline__ MatTile mat_tile(const QMat &q, int member, int n0,
                                            const uint2 *xb, int parts)
{
    MatTile t;
    t.w = q.w + (size_t)member * q.wstride;
    t.sz = q.sz + (size_t)member * q.szstride;
    t.N = q.N;
    t.n0 = n0;
    t.xb = xb;
    t.xl = 4 * parts;
    return t;
}

#endif
