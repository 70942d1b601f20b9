/* model.h - the model object: layers, weights bound to tensors, backend. */
#ifndef HD_MODEL_H
#define HD_MODEL_H

#include <stdint.h>

#include "hd.h"
#include "safetensors.h"

/* A quantized linear map (or a bank of `count` of them) with input size k
 * and output size n, in the seed's layout (SEMANTICS.md, "Int4 weights"). */
typedef struct hd_qlinear {
    const uint8_t *w_q;      /* [count][k/2][n]   */
    const uint16_t *scales;  /* [count][k/128][n] */
    const uint16_t *zeros;   /* [count][k/128][n] */
    int k, n, count;
} hd_qlinear;

/* Member j of a bank, as a single linear map. */
static inline hd_qlinear hd_qlinear_member(const hd_qlinear *bank, int j)
{
    hd_qlinear m = *bank;
    size_t wq = (size_t)(bank->k / 2) * (size_t)bank->n;
    size_t sz = (size_t)(bank->k / 128) * (size_t)bank->n;
    m.w_q += (size_t)j * wq;
    m.scales += (size_t)j * sz;
    m.zeros += (size_t)j * sz;
    m.count = 1;
    return m;
}

typedef struct hd_kda_weights {
    hd_qlinear q_proj, k_proj, v_proj, g_proj, o_proj;
    const uint16_t *beta_proj; /* bf16 [32][2304] */
    const uint16_t *conv_w;    /* bf16 [3 (q,k,v)][4096][4] */
} hd_kda_weights;

typedef struct hd_mla_weights {
    hd_qlinear q_proj, kv_a, kv_b, o_proj;
} hd_mla_weights;

typedef struct hd_moe_weights {
    const uint16_t *router;    /* bf16 [E][2304] */
    hd_qlinear gate, up, down; /* banks of E */
    hd_qlinear s_gate, s_up, s_down; /* banks of 1 */
} hd_moe_weights;

typedef struct hd_layer {
    char kind;                 /* 'K' or 'M' */
    int slot;                  /* index among the layers of its kind */
    const uint16_t *attn_norm; /* bf16 [2304] */
    const uint16_t *moe_norm;  /* bf16 [2304] */
    hd_kda_weights kda;        /* kind 'K' */
    hd_mla_weights mla;        /* kind 'M' */
    hd_moe_weights moe;
} hd_layer;

/* One tensor the model holds, by its seed name (for saving). */
typedef struct hd_tensor {
    char name[96];
    hd_dtype dtype;
    int ndim;
    uint64_t shape[3];
    const void *data;
    uint64_t bytes;
    int released;              /* synthetic and not resident: not made yet,
                                * or given back (hd_model_acquire_layer and
                                * hd_model_save make it from the seed) */
} hd_tensor;

struct hd_backend_ops;

#define HD_MODEL_MAGIC 0x6864304du /* "hd0M" */

struct hd_model {
    uint32_t magic;
    int n_layers, n_kda, n_mla, experts;
    char pattern[HD_MAX_LAYERS + 1];
    hd_layer layers[HD_MAX_LAYERS];

    hd_tensor *tensors;        /* every tensor, in motif order */
    size_t n_tensors;
    uint64_t weight_bytes;

    /* Where the bytes live: a mapped file, or one owned buffer (synth, or
     * aligned/byte-swapped copies of a file's tensors). */
    hd_st_file file;
    void *owned;
    size_t owned_bytes;
    int owned_lazy;            /* owned is hd_alloc_lazy's (synth) */
    char source[512];          /* "synth seed 1" or the file path */
    /* A synthetic model's seed and tensor specs (NULL for a file's), from
     * which hd_model_save makes again the tensors a backend gave back. */
    struct hd_tensor_spec *synth_specs;
    uint32_t synth_seed;

    const struct hd_backend_ops *backend;
    void *backend_ctx;         /* the backend's per-model data */
    char backend_info[128];
    int threads;               /* from the options (0 = default) */
    int device;
};

/* Validates a parsed safetensors file as a model of the motif and starts
 * its backend (the body of hd_model_load, without the file system; the
 * fuzz target uses it on an in-memory image).  Takes ownership of *file in
 * every case: on success the model holds it, on failure it is closed; *file
 * is zeroed either way.  *model must be NULL on entry and stays NULL on
 * failure.  `source` names the origin in messages (NULL: "memory"). */
hd_status hd_model_from_st(hd_st_file *file, const char *source,
                           const hd_options *options, hd_model **model,
                           char *err, size_t err_size);

/* A backend that has made its own copy of w (every member) and reads w no
 * more gives back the pages of w's bytes: those of a mapped model file
 * (read again from the file if anything touches them later), and those of
 * a synthetic model's tensors (marked released: hd_model_save makes them
 * again from the seed; nothing else may read them after this).  Weights
 * in memory that cannot be made again (copies, a parsed buffer) are left
 * alone. */
void hd_model_release_qlinear(hd_model *m, const hd_qlinear *w);
/* hd_model_release_qlinear of every int4 matrix of layer i. */
void hd_model_release_layer(hd_model *m, int i);

/* A synthetic model's int4 matrices are made when a backend first needs
 * them, not with the model (so that the CPU backend, which repacks them
 * layer by layer and gives each layer back, never holds the model's
 * int4 weights twice): hd_model_acquire_layer makes those of layer i that
 * are not resident, hd_model_acquire_all every tensor's.  No effect on a
 * file's model, whose pages the kernel maps in when read. */
void hd_model_acquire_layer(hd_model *m, int i);
void hd_model_acquire_all(hd_model *m);

#endif /* HD_MODEL_H */
