/*
 * hd.h - the public interface of libhd (hybrid-decode).
 *
 * libhd runs one decode step of a hybrid block stack: Kimi-delta-attention
 * layers ('K') and latent-MLA layers ('M'), each followed by a top-8 mixture
 * of experts with one shared expert, all large weights in packed int4.  The
 * computation is defined in docs/SEMANTICS.md.
 *
 * Conventions
 *  - Every function that can fail returns an hd_status; HD_OK is 0.  On any
 *    error the objects passed in are left exactly as they were.
 *  - Functions that create an object write it through an out-pointer and
 *    set it to NULL on failure.  Every *_free accepts NULL.
 *  - Optional error buffers (char *err, size_t err_size) receive a one-line,
 *    NUL-terminated message on failure; pass NULL, 0 to skip.
 *  - bf16 values are passed as their bit patterns in uint16_t, in host order.
 *  - The library never prints, aborts or exits.
 *
 * Thread safety
 *  - A model is immutable once created: any number of threads may step
 *    different states of the same model at the same time.
 *  - A state belongs to one thread at a time: calls on the same state must
 *    not overlap.
 *  - hd_model_free must not overlap any other call on that model or on its
 *    states, and every state of a model must be freed before the model.
 *
 * Misuse that can be detected is a status, never a crash: NULL, a state of
 * another model, a wrong size, a full cache, an object whose kind does not
 * match (a state passed as a model) or that hd_*_free already cleared.
 * A pointer to freed memory cannot be detected in general; do not pass one.
 */
#ifndef HD_H
#define HD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(HD_BUILDING_LIBRARY)
#define HD_API __declspec(dllexport)
#elif defined(__GNUC__) && defined(HD_BUILDING_LIBRARY)
#define HD_API __attribute__((visibility("default")))
#else
#define HD_API
#endif

/* ------------------------------------------------------------------ */
/* Versions                                                            */
/* ------------------------------------------------------------------ */

#define HD_VERSION_MAJOR 0
#define HD_VERSION_MINOR 1
#define HD_VERSION_PATCH 0
#define HD_VERSION_STRING "0.1.0"
/* One number that grows with every release: 10000*major + 100*minor + patch. */
#define HD_VERSION_NUMBER \
    (HD_VERSION_MAJOR * 10000 + HD_VERSION_MINOR * 100 + HD_VERSION_PATCH)

/** The version of the library actually linked, e.g. "0.1.0". Static string. */
HD_API const char *hd_version_string(void);
/** HD_VERSION_NUMBER of the library actually linked. */
HD_API int hd_version_number(void);

/* ------------------------------------------------------------------ */
/* Status codes (numbers are pinned: never renumbered, only appended)  */
/* ------------------------------------------------------------------ */

typedef enum hd_status {
    HD_OK = 0,
    HD_ERR_INVALID_ARGUMENT = 1,    /* NULL, out-of-range or unknown value  */
    HD_ERR_OUT_OF_MEMORY = 2,       /* an allocation failed                 */
    HD_ERR_IO = 3,                  /* a file could not be opened/read/written */
    HD_ERR_FORMAT = 4,              /* a file is not valid safetensors      */
    HD_ERR_MODEL = 5,               /* valid safetensors, not a model of the motif */
    HD_ERR_BACKEND_UNAVAILABLE = 6, /* the backend asked for is not usable here */
    HD_ERR_CACHE_FULL = 7,          /* the MLA cache has no free row        */
    HD_ERR_SIZE_MISMATCH = 8,       /* a buffer's size does not match the tensor */
    HD_ERR_STATE_MISMATCH = 9,      /* the state belongs to another model   */
    HD_ERR_NONFINITE = 10,          /* an input value is NaN or infinite    */
    HD_ERR_BACKEND = 11,            /* the backend failed at run time (device error) */
    HD_ERR_INTERNAL = 12            /* a bug in libhd; please report it     */
} hd_status;

/** A static, human-readable description of a status; never NULL. */
HD_API const char *hd_status_string(hd_status status);

/* ------------------------------------------------------------------ */
/* Fixed shapes of the motif                                           */
/* ------------------------------------------------------------------ */

#define HD_HIDDEN 2304      /* hidden size D: the length of a step's input/output */
#define HD_KDA_HEADS 32
#define HD_KDA_HEAD_DIM 128
#define HD_KDA_CONV 4       /* short-convolution width; 3 cached rows */
#define HD_MLA_HEADS 32
#define HD_MLA_QK_NOPE 128
#define HD_MLA_QK_ROPE 64
#define HD_MLA_V_HEAD 128
#define HD_MLA_KV_LORA 512
#define HD_MOE_INTER 1024
#define HD_MOE_TOPK 8
#define HD_MIN_EXPERTS HD_MOE_TOPK
#define HD_MAX_EXPERTS 65536
#define HD_MAX_LAYERS 64

/* ------------------------------------------------------------------ */
/* Backends and options                                                */
/* ------------------------------------------------------------------ */

typedef enum hd_backend {
    HD_BACKEND_DEFAULT = 0, /* the HD_BACKEND environment variable, else auto */
    HD_BACKEND_AUTO = 1,    /* CUDA if usable, else CPU, else the reference;
                               a backend that refuses the model (no room
                               on the GPU, weights its kernel cannot
                               compute exactly) hands it to the next */
    HD_BACKEND_REF = 2,     /* the plain C reference: one thread, the definition */
    HD_BACKEND_CPU = 3,     /* OpenMP + SIMD CPU backend */
    HD_BACKEND_CUDA = 4     /* the CUDA megakernel (a loadable module) */
} hd_backend;

/** "auto", "ref", "cpu", "cuda" ("default" for HD_BACKEND_DEFAULT). */
HD_API const char *hd_backend_name(hd_backend backend);

/** Parses "auto", "ref", "cpu" or "cuda" (case-sensitive).
 *  HD_ERR_INVALID_ARGUMENT for anything else or NULL. */
HD_API hd_status hd_backend_parse(const char *name, hd_backend *backend);

/** Whether a backend can run on this machine, as `auto` would judge it;
 *  HD_OK or HD_ERR_BACKEND_UNAVAILABLE (with a reason in err). */
HD_API hd_status hd_backend_available(hd_backend backend, char *err,
                                      size_t err_size);

/**
 * Options for creating a model.  Initialise with hd_options_init, then set
 * fields; a NULL options pointer means all defaults.
 *
 * Backend choice: an explicit backend in `backend` wins; HD_BACKEND_DEFAULT
 * reads the environment variable HD_BACKEND (auto|ref|cpu|cuda; unset or
 * empty means auto).  A backend asked for by name that is not usable is an
 * error (HD_ERR_BACKEND_UNAVAILABLE), never a silent fallback.
 */
typedef struct hd_options {
    size_t struct_size; /* sizeof(hd_options), set by hd_options_init */
    hd_backend backend; /* default: HD_BACKEND_DEFAULT */
    int threads;        /* CPU threads, >= 0; 0 = OMP_NUM_THREADS or all
                           cores.  The reference backend always uses one. */
    int device;         /* GPU ordinal for the CUDA backend; default 0 */
} hd_options;

/** Fills *options with the defaults. */
HD_API void hd_options_init(hd_options *options);

/* ------------------------------------------------------------------ */
/* Models                                                              */
/* ------------------------------------------------------------------ */

typedef struct hd_model hd_model;

/**
 * Loads a model from a safetensors file whose tensor names are those of the
 * seed's PyTorch module (blocks.<i>.attn_norm, blocks.<i>.attn.q_proj.w_q,
 * ...).  The layer pattern and the expert count E come from the tensors
 * present; optional __metadata__ keys "pattern" and "experts" are checked
 * against them.  The file is memory-mapped and validated completely before
 * any weight is used; weights stay in packed int4.  The file may be changed
 * or removed after loading only if the backend copied the weights (the
 * reference backend reads the mapping: keep the file as it is).
 *
 * Errors: HD_ERR_INVALID_ARGUMENT (NULL), HD_ERR_IO, HD_ERR_FORMAT (not valid
 * safetensors), HD_ERR_MODEL (a tensor missing, extra, of the wrong dtype or
 * shape; the message names it), HD_ERR_BACKEND_UNAVAILABLE,
 * HD_ERR_OUT_OF_MEMORY.
 */
HD_API hd_status hd_model_load(const char *path, const hd_options *options,
                               hd_model **model, char *err, size_t err_size);

/**
 * Makes the deterministic synthetic model of docs/SYNTH.md in memory: `seed`
 * and `experts` (8 <= E <= HD_MAX_EXPERTS) as given, `pattern` a string of
 * 'K' and 'M' (1 to HD_MAX_LAYERS letters; NULL means "KKKM").
 */
HD_API hd_status hd_model_synth(uint32_t seed, int experts,
                                const char *pattern,
                                const hd_options *options, hd_model **model,
                                char *err, size_t err_size);

/** SYNTH.md's step input `input.<step>` for `seed`: bf16 [HD_HIDDEN]. */
HD_API hd_status hd_synth_input(uint32_t seed, uint64_t step,
                                uint16_t *out_bf16);

/** SYNTH.md's prefilled MLA cache for `seed`: the first `rows` rows of
 *  state.c_kv (bf16 [rows][512]) and state.k_rope (bf16 [rows][64]).
 *  Either pointer may be NULL to skip that tensor. */
HD_API hd_status hd_synth_cache(uint32_t seed, size_t rows, uint16_t *c_kv,
                                uint16_t *k_rope);

/** Writes the model as a safetensors file with the seed module's tensor
 *  names (and __metadata__ pattern, experts), loadable by hd_model_load and
 *  by safetensors.torch.load_file.  The file is written to a temporary name
 *  beside `path` and renamed, so a failure never leaves a partial file. */
HD_API hd_status hd_model_save(const hd_model *model, const char *path,
                               char *err, size_t err_size);

/** Frees a model (NULL is fine).  Free its states first: hd_state_free
 *  reads the state's model, so calling it after hd_model_free is a use
 *  after free that libhd cannot detect (not allowed). */
HD_API void hd_model_free(hd_model *model);

/** The backend the model runs on (never DEFAULT or AUTO). */
HD_API hd_backend hd_model_backend(const hd_model *model);
/** A short description of the backend in use, e.g. "ref" or
 *  "cpu (avx2, 2 threads)".  Static for the model's lifetime. */
HD_API const char *hd_model_backend_info(const hd_model *model);
/** Number of routed experts E (0 for NULL). */
HD_API int hd_model_experts(const hd_model *model);
/** Number of layers (0 for NULL). */
HD_API int hd_model_layers(const hd_model *model);
/** The layer pattern, e.g. "KKKM" (empty string for NULL). */
HD_API const char *hd_model_pattern(const hd_model *model);
/** Bytes of all the model's weight tensors as stored: packed int4 data,
 *  scales, zeros, norms, routers and the other bf16 tensors. */
HD_API uint64_t hd_model_weight_bytes(const hd_model *model);

/**
 * The bytes one step must move at MLA context `context` (tokens already in
 * the cache): every dense weight tensor of every layer (norms, attention
 * projections with their scales and zeros, KDA beta and conv weights,
 * routers), the weights of the 8 routed and the shared expert of each layer,
 * the KDA state S and conv caches read and written, and the MLA cache rows
 * read (context + 1) and written (1).  A model of the traffic, not a
 * measurement: benchmarks divide it by the measured bandwidth.
 */
HD_API uint64_t hd_model_step_bytes(const hd_model *model, size_t context);

/**
 * Measures the memory bandwidth the model's backend streams at, in bytes
 * per second: a read of at least 1 GiB of host memory with the backend's
 * threads for the host backends, a device-to-device copy (read + write
 * counted) for a GPU backend.  Takes about a second and allocates memory
 * temporarily (HD_ERR_OUT_OF_MEMORY if it cannot).
 */
HD_API hd_status hd_model_measure_bandwidth(const hd_model *model,
                                            double *bytes_per_second);

/* ------------------------------------------------------------------ */
/* States                                                              */
/* ------------------------------------------------------------------ */

typedef struct hd_state hd_state;

/**
 * Creates a decode state for `model` with room for `capacity` rows of MLA
 * context (tokens), allocated once.  It starts empty: KDA S and conv caches
 * zero, context length 0.  Give it the longest context you will decode;
 * a model with MLA layers cannot step a state whose context equals its
 * capacity (HD_ERR_CACHE_FULL), so capacity 0 suits only models without any.
 * Errors: HD_ERR_INVALID_ARGUMENT, HD_ERR_OUT_OF_MEMORY (also for a capacity
 * whose byte size overflows), HD_ERR_BACKEND.
 */
HD_API hd_status hd_state_new(const hd_model *model, size_t capacity,
                              hd_state **state);

/** Frees a state (NULL is fine).  Free every state before its model:
 *  hd_state_free after hd_model_free of the state's model is not allowed
 *  (a use after free of the model, which libhd cannot detect). */
HD_API void hd_state_free(hd_state *state);

/** Empties the state: zero S and conv caches, context length 0. */
HD_API hd_status hd_state_reset(hd_state *state);

/** Tokens in the MLA cache (the position of the next token); 0 for NULL. */
HD_API size_t hd_state_context(const hd_state *state);
/** The capacity given to hd_state_new; 0 for NULL. */
HD_API size_t hd_state_capacity(const hd_state *state);

/** The tensors of a state, in the seed's layout. */
typedef enum hd_state_tensor {
    HD_STATE_S = 0,      /* KDA layer: fp32 [32 heads][128 k][128 v]     */
    HD_STATE_CONV_Q = 1, /* KDA layer: bf16 [3][4096], oldest row first  */
    HD_STATE_CONV_K = 2, /* KDA layer: bf16 [3][4096]                    */
    HD_STATE_CONV_V = 3, /* KDA layer: bf16 [3][4096]                    */
    HD_STATE_C_KV = 4,   /* MLA layer: bf16 [context][512]               */
    HD_STATE_K_ROPE = 5  /* MLA layer: bf16 [context][64]                */
} hd_state_tensor;

/**
 * The byte size of one state tensor of layer `layer` (0-based index into the
 * pattern) as import/export take it; the MLA tensors are sized for the
 * current context.  HD_ERR_INVALID_ARGUMENT if the layer does not have that
 * tensor (S of an MLA layer, say).
 */
HD_API hd_status hd_state_tensor_bytes(const hd_state *state, int layer,
                                       hd_state_tensor which, size_t *bytes);

/** Copies one state tensor out, in the seed's layout (fp32 values or bf16
 *  bits, host byte order).  `bytes` must equal hd_state_tensor_bytes
 *  (HD_ERR_SIZE_MISMATCH otherwise); when that is 0 (an MLA tensor at
 *  context 0) nothing is copied and dst may be NULL. */
HD_API hd_status hd_state_export(const hd_state *state, int layer,
                                 hd_state_tensor which, void *dst,
                                 size_t bytes);

/** Replaces one state tensor, same layout and size rules as export.  The
 *  MLA tensors cover the current context (set it with hd_state_prefill). */
HD_API hd_status hd_state_import(hd_state *state, int layer,
                                 hd_state_tensor which, const void *src,
                                 size_t bytes);

/**
 * Sets the MLA caches of every MLA layer to `rows` given tokens and the
 * context length to `rows`; the KDA state is left as it is.  c_kv is
 * [n_mla][rows][512] and k_rope [n_mla][rows][64] bf16, n_mla being the
 * number of 'M' layers, in layer order.  The pointers may be NULL when
 * rows == 0 (empty caches) or when the model has no MLA layer (the context,
 * the position of the next token, is still set to rows).
 * HD_ERR_CACHE_FULL if rows > capacity.
 */
HD_API hd_status hd_state_prefill(hd_state *state, size_t rows,
                                  const uint16_t *c_kv,
                                  const uint16_t *k_rope);

/* ------------------------------------------------------------------ */
/* The step                                                            */
/* ------------------------------------------------------------------ */

/**
 * Runs one decode step: h_out = step(h_in, state), both bf16 [HD_HIDDEN];
 * the state is updated in place and its context grows by one.  in and out
 * may be the same buffer.  No allocation, no O(context) copy.
 *
 * Errors (the state and out are untouched): HD_ERR_INVALID_ARGUMENT (NULL),
 * HD_ERR_STATE_MISMATCH (state made for another model), HD_ERR_CACHE_FULL
 * (a model with MLA layers and context == capacity), HD_ERR_NONFINITE (an
 * input value is NaN or infinite), checked in that order: when several
 * apply, the first is returned.  HD_ERR_BACKEND if a device failed; the
 * state is then unspecified and should be reset.
 *
 * NaN or Inf inside weights or state never becomes an index: expert logits
 * that are NaN rank below every number (ties go to the lower index), so the
 * chosen experts are always 8 valid, distinct indices; such values simply
 * propagate through the arithmetic into h_out and the state, and the step
 * returns HD_OK (docs/ROBUSTNESS.md).  A state holding NaN stays usable:
 * export, import, prefill and reset work on it as on any other.
 */
HD_API hd_status hd_step(const hd_model *model, hd_state *state,
                         const uint16_t *in_bf16, uint16_t *out_bf16);

#ifdef __cplusplus
}
#endif

#endif /* HD_H */
