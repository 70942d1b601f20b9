/* backend.h - the internal backend interface (a vtable) and the registry. */
#ifndef HD_BACKEND_H
#define HD_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "hd.h"
#include "model.h"

#define HD_STATE_MAGIC 0x68643053u /* "hd0S" */

/* The public state: what every backend shares.  The tensors themselves
 * belong to the backend (host memory for ref/cpu, device memory for cuda). */
struct hd_state {
    uint32_t magic;
    const hd_model *model;
    size_t capacity;           /* MLA rows */
    size_t context;            /* MLA rows in use = position of next token */
    void *impl;                /* the backend's state */
};

/*
 * A backend.  The core validates every argument before calling in (sizes,
 * layer kinds, capacity), so these functions may assume valid input; they
 * report only resource and device failures.  "Atomic" means: on failure
 * nothing observable changed.
 */
typedef struct hd_backend_ops {
    hd_backend kind;
    const char *name;
    /* Usable on this machine?  HD_OK or HD_ERR_BACKEND_UNAVAILABLE. */
    hd_status (*probe)(char *err, size_t err_size);
    /* Prepare the model's weights (repack, upload); sets model->backend_ctx
     * and model->backend_info. */
    hd_status (*model_init)(hd_model *model, char *err, size_t err_size);
    void (*model_free)(hd_model *model);
    /* Allocate state->impl for state->capacity rows, zeroed. */
    hd_status (*state_init)(hd_state *state);
    void (*state_free)(hd_state *state);
    /* Zero S and the conv caches (the core resets the context). */
    hd_status (*state_reset)(hd_state *state);
    /* Copy a tensor of layer `layer` out/in; for MLA tensors rows
     * [0, rows) of the cache (rows <= capacity), else the whole tensor. */
    hd_status (*state_read)(const hd_state *state, int layer,
                            hd_state_tensor which, size_t rows, void *dst);
    hd_status (*state_write)(hd_state *state, int layer,
                             hd_state_tensor which, size_t rows,
                             const void *src);
    /* One step at position state->context (< capacity when the model has
     * MLA layers); the core increments the context on success. */
    hd_status (*step)(const hd_model *model, hd_state *state,
                      const uint16_t *in_bf16, uint16_t *out_bf16);
    /* Bandwidth the backend streams memory at, bytes/s (hd-bench). */
    hd_status (*measure_bandwidth)(const hd_model *model, double *bytes_per_s);
} hd_backend_ops;

/* The sum of the n words at p (any 8-byte alignment), read with the
 * widest loads this CPU runs: a plain read that the memory, not the loop,
 * limits (hd-bench compares kernels with it). */
uint64_t hd_host_read_sum(const uint64_t *p, size_t n);

/* A timed read of `bytes` of host memory with `threads` threads (1 without
 * OpenMP), best of `repeats`; bytes per second. */
hd_status hd_host_read_bandwidth(size_t bytes, int threads, int repeats,
                                 double *bytes_per_s);

/* The registry: the ops of a named backend, or NULL when it is not part of
 * this build. */
const hd_backend_ops *hd_backend_ops_get(hd_backend kind);

/* Resolves DEFAULT (environment) and AUTO (probing) to a concrete backend
 * and returns its ops; *automatic (when not NULL) tells whether the choice
 * was made by probing, so that the caller may fall back. */
hd_status hd_backend_choose(hd_backend requested, const hd_backend_ops **ops,
                            int *automatic, char *err, size_t err_size);

/* The next usable backend after `after` in auto's order of preference
 * (cuda, cpu, ref), or NULL: where auto goes when the backend it chose
 * refuses a model (a GPU without room for it, weights its kernel cannot
 * compute exactly). */
const hd_backend_ops *hd_backend_auto_next(const hd_backend_ops *after);

/* The backends of this build. */
extern const hd_backend_ops hd_ref_backend;
#ifdef HD_HAVE_CPU_BACKEND
extern const hd_backend_ops hd_cpu_backend; /* src/cpu/ */
#endif

#endif /* HD_BACKEND_H */
