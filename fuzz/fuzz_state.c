/* fuzz_state.c - libFuzzer target: bytes -> a sequence of state calls
 * (new, import, export, prefill, step, reset, queries) on one small model
 * (synth seed 5, pattern "KM", E 8, made once), with layers, tensor kinds,
 * sizes, row counts and values taken from the input.  Imported values are
 * raw input bytes, so NaN, infinity and denormals reach S and the caches.
 *
 * Promises checked: every call answers a documented status; a failed call
 * leaves the context as it was; a step of a finite input answers HD_OK
 * unless the cache is full; an export after an import of the same tensor
 * gives the bytes back.  Buffers are exactly the size passed, so ASan or
 * valgrind see any access beyond it. */
#include "config.h"

#include <stdbool.h>
#include <string.h>

#include "fuzz.h"
#include "hd.h"

#define MAX_OPS 24
/* A step of the reference takes ~0.3 s natively and seconds under the
 * fuzzer's sanitizers: at most one per input, and only behind a gate byte,
 * so that most inputs exercise the (fast) state calls.  HD_FUZZ_NO_STEP=1
 * in the environment skips steps altogether, for fast runs of the rest. */
#define MAX_STEPS 1
#define STEP_GATE 0x5a
#define MAX_CAPACITY 6

static hd_model *g_model;
static bool g_no_step; /* HD_FUZZ_NO_STEP set: the state calls only */

typedef struct reader {
    const uint8_t *p;
    size_t n, at;
} reader;

static unsigned byte(reader *r)
{
    return r->at < r->n ? r->p[r->at++] : 0;
}

/* Fills dst with the input from the current position, repeated (zeros when
 * the input is used up). */
static void fill(reader *r, void *dst, size_t bytes)
{
    unsigned char *d = dst;
    size_t avail = r->n - r->at;
    if (avail == 0) {
        memset(d, 0, bytes);
        return;
    }
    for (size_t i = 0; i < bytes; i += avail)
        memcpy(d + i, r->p + r->at, bytes - i < avail ? bytes - i : avail);
}

/* A byte count near `want`: exact most of the time, else off by a little
 * or a lot. */
static size_t pick_bytes(reader *r, size_t want)
{
    switch (byte(r) % 8) {
    case 0: return want + 1;
    case 1: return want ? want - 1 : 0;
    case 2: return 0;
    case 3: return want * 2 + 2;
    case 4: return (size_t)-1;
    default: return want;
    }
}

static bool known_status(hd_status st)
{
    return st == HD_OK || st == HD_ERR_INVALID_ARGUMENT ||
           st == HD_ERR_SIZE_MISMATCH || st == HD_ERR_CACHE_FULL ||
           st == HD_ERR_NONFINITE || st == HD_ERR_OUT_OF_MEMORY;
}

static void free_model(void)
{
    hd_model_free(g_model);
    g_model = NULL;
}

static void init_model(void)
{
    hd_options opt;
    char err[256];
    hd_options_init(&opt);
    opt.backend = HD_BACKEND_REF;
    hd_status st = hd_model_synth(5, 8, "KM", &opt, &g_model, err, sizeof err);
    fuzz_check(st == HD_OK, "hd_model_synth: %s", err);
    atexit(free_model); /* so that valgrind reports no leak */
    g_no_step = getenv("HD_FUZZ_NO_STEP") != NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader r = {data, size, 0};
    hd_state *s = NULL;
    int steps = 0;
    static const hd_state_tensor kinds[] = {
        HD_STATE_S, HD_STATE_CONV_Q, HD_STATE_CONV_K, HD_STATE_CONV_V,
        HD_STATE_C_KV, HD_STATE_K_ROPE, (hd_state_tensor)77};

    if (!g_model)
        init_model();
    hd_status st = hd_state_new(g_model, byte(&r) % (MAX_CAPACITY + 1), &s);
    fuzz_check(st == HD_OK && s, "hd_state_new = %d", (int)st);

    for (int op = 0; op < MAX_OPS && r.at < r.n; op++) {
        size_t ctx = hd_state_context(s), cap = hd_state_capacity(s);
        int layer = (int)(byte(&r) % 4) - 1; /* -1 .. 2: two valid */
        hd_state_tensor which = kinds[byte(&r) % 7];
        size_t want = 0, bytes;
        void *buf;

        switch (byte(&r) % 7) {
        case 0: /* import */
            if (hd_state_tensor_bytes(s, layer, which, &want) != HD_OK)
                want = 64;
            bytes = pick_bytes(&r, want);
            buf = bytes <= 2 * want + 2 ? malloc(bytes ? bytes : 1) : NULL;
            if (buf)
                fill(&r, buf, bytes);
            st = hd_state_import(s, layer, which, buf ? buf : data, bytes);
            fuzz_check(known_status(st), "import = %d", (int)st);
            if (st == HD_OK && bytes > 0) { /* it comes back unchanged */
                void *back = malloc(bytes);
                fuzz_check(back != NULL, "out of memory");
                st = hd_state_export(s, layer, which, back, bytes);
                fuzz_check(st == HD_OK, "export after import = %d", (int)st);
                fuzz_check(memcmp(back, buf, bytes) == 0,
                           "export differs from import");
                free(back);
            }
            free(buf);
            break;
        case 1: /* export */
            if (hd_state_tensor_bytes(s, layer, which, &want) != HD_OK)
                want = 64;
            bytes = pick_bytes(&r, want);
            buf = bytes <= 2 * want + 2 ? malloc(bytes ? bytes : 1) : NULL;
            st = hd_state_export(s, layer, which, buf, bytes);
            fuzz_check(known_status(st), "export = %d", (int)st);
            fuzz_check(buf || st != HD_OK || bytes == 0,
                       "export into NULL accepted");
            free(buf);
            break;
        case 2: { /* prefill: rows up to capacity + 1, one MLA layer */
            size_t rows = byte(&r) % (cap + 2);
            unsigned nulls = byte(&r);
            uint16_t *c_kv = malloc(rows * HD_MLA_KV_LORA * 2 + 1);
            uint16_t *k_rope = malloc(rows * HD_MLA_QK_ROPE * 2 + 1);
            fuzz_check(c_kv && k_rope, "out of memory");
            fill(&r, c_kv, rows * HD_MLA_KV_LORA * 2);
            fill(&r, k_rope, rows * HD_MLA_QK_ROPE * 2);
            st = hd_state_prefill(s, rows, (nulls & 1) ? NULL : c_kv,
                                  (nulls & 2) ? NULL : k_rope);
            fuzz_check(known_status(st), "prefill = %d", (int)st);
            fuzz_check(st == HD_OK ? hd_state_context(s) == rows
                                   : hd_state_context(s) == ctx,
                       "prefill: context %zu after %d", hd_state_context(s),
                       (int)st);
            free(c_kv);
            free(k_rope);
            break;
        }
        case 3: { /* step */
            uint16_t in[HD_HIDDEN], out[HD_HIDDEN];
            bool finite = true;
            if (byte(&r) != STEP_GATE || steps >= MAX_STEPS || g_no_step)
                break;
            fill(&r, in, sizeof in);
            if (byte(&r) & 1) /* mostly finite inputs: clear exponent MSB */
                for (int i = 0; i < HD_HIDDEN; i++)
                    in[i] &= 0xbfffu;
            for (int i = 0; i < HD_HIDDEN; i++)
                finite = finite && (in[i] & 0x7f80u) != 0x7f80u;
            steps++;
            st = hd_step(g_model, s, in, out);
            fuzz_check(known_status(st), "step = %d", (int)st);
            /* Both apply: the cache is checked first (include/hd.h). */
            if (ctx >= cap)
                fuzz_check(st == HD_ERR_CACHE_FULL, "full step = %d", (int)st);
            else if (!finite)
                fuzz_check(st == HD_ERR_NONFINITE, "step of NaN = %d", (int)st);
            else
                fuzz_check(st == HD_OK, "step = %d", (int)st);
            fuzz_check(hd_state_context(s) == ctx + (st == HD_OK),
                       "step: context %zu after %d", hd_state_context(s),
                       (int)st);
            break;
        }
        case 4: /* reset */
            st = hd_state_reset(s);
            fuzz_check(st == HD_OK && hd_state_context(s) == 0, "reset");
            break;
        case 5: /* queries, some with NULL */
            st = hd_state_tensor_bytes(s, layer, which,
                                       (byte(&r) & 1) ? &want : NULL);
            fuzz_check(known_status(st), "tensor_bytes = %d", (int)st);
            break;
        default: /* a state of a new capacity */
            hd_state_free(s);
            s = NULL;
            st = hd_state_new(g_model, byte(&r) % (MAX_CAPACITY + 1), &s);
            fuzz_check(st == HD_OK && s, "hd_state_new = %d", (int)st);
            break;
        }
    }
    hd_state_free(s);
    return 0;
}
