/* model.c - making models: from a safetensors file, from SYNTH.md, saving. */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef HAVE_SYS_MMAN_H
#include <sys/mman.h>
#endif
#ifdef HAVE_UNISTD_H
#include <unistd.h>
#endif

#include "backend.h"
#include "model.h"
#include "motif.h"
#include "synth.h"
#include "util.h"

static hd_model *model_new(const char *pattern, int experts)
{
    hd_model *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->magic = HD_MODEL_MAGIC;
    m->experts = experts;
    snprintf(m->pattern, sizeof m->pattern, "%s", pattern);
    return m;
}

/* Whether [p, p + bytes) lies inside [base, base + len). */
static int range_inside(const void *base, size_t len, const void *p, size_t bytes)
{
    const uintptr_t b = (uintptr_t)base, a = (uintptr_t)p;
    return base && a >= b && bytes <= len && a - b <= len - bytes;
}

/* The whole pages of [p, p + bytes), unmapped from the process
 * (MADV_DONTNEED): a private read-only file mapping maps the file's page
 * again where it is read, anonymous memory reads as zeros. */
static void give_back_pages(const void *p, size_t bytes)
{
#if defined(HAVE_MADVISE) && defined(MADV_DONTNEED) && defined(_SC_PAGESIZE)
    const uintptr_t a = (uintptr_t)p;
    const long ps = sysconf(_SC_PAGESIZE);
    uintptr_t lo, hi;
    if (ps <= 0)
        return;
    lo = (a + (uintptr_t)ps - 1) & ~((uintptr_t)ps - 1);
    hi = (a + bytes) & ~((uintptr_t)ps - 1);
    if (lo < hi)
        (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
#else
    (void)p;
    (void)bytes;
#endif
}

/* The index of the synthetic model's tensor that is exactly [p, p +
 * bytes), or -1 (a file's model, or no such tensor). */
static long synth_tensor(const hd_model *m, const void *p, size_t bytes)
{
    if (!m->synth_specs || !range_inside(m->owned, m->owned_bytes, p, bytes))
        return -1;
    for (size_t i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].data == p && m->tensors[i].bytes == bytes)
            return (long)i;
    return -1;
}

/* [p, p + bytes): given back where it lies in the model's file mapping;
 * where it is exactly one of a synthetic model's tensors, that tensor is
 * marked released too (nothing reads it after: hd_model_save and
 * hd_model_acquire_layer make it again). */
static void release_range(hd_model *m, const void *p, size_t bytes)
{
    long i;
    if (range_inside(m->file.map, m->file.map_bytes, p, bytes)) {
        give_back_pages(p, bytes);
        return;
    }
    i = synth_tensor(m, p, bytes);
    if (i >= 0) {
        m->tensors[i].released = 1;
        give_back_pages(p, bytes);
    }
}

/* Synthetic tensor i's values from the seed, into its bytes (inside
 * m->owned, which the model allocated writable). */
static void fill_tensor(hd_model *m, size_t i)
{
    const size_t off = (size_t)((const unsigned char *)m->tensors[i].data -
                                (const unsigned char *)m->owned);
    hd_synth_fill(m->synth_seed, &m->synth_specs[i], (unsigned char *)m->owned + off);
    m->tensors[i].released = 0;
}

/* Synthetic tensor i made (again) where it is not resident. */
static void acquire_tensor(hd_model *m, size_t i)
{
    if (m->tensors[i].released)
        fill_tensor(m, i);
}

/* The three tensors of w (every member): their starts and sizes. */
static void qlinear_parts(const hd_qlinear *w, const void *part[3], size_t bytes[3])
{
    const size_t count = w->count > 0 ? (size_t)w->count : 0;
    const size_t sz = (size_t)(w->k / 128) * (size_t)w->n * count * sizeof(uint16_t);
    part[0] = w->w_q;
    part[1] = w->scales;
    part[2] = w->zeros;
    bytes[0] = (size_t)(w->k / 2) * (size_t)w->n * count;
    bytes[1] = bytes[2] = sz;
}

void hd_model_release_qlinear(hd_model *m, const hd_qlinear *w)
{
    const void *part[3];
    size_t bytes[3];
    qlinear_parts(w, part, bytes);
    for (int i = 0; i < 3; i++) {
        if (!part[i] || bytes[i] == 0)
            continue;
        release_range(m, part[i], bytes[i]);
    }
}

/* Layer L's int4 matrices into q (LAYER_QLINEARS at most: 5 of KDA or 4 of
 * MLA, then 6 of the MoE); returns how many. */
#define LAYER_QLINEARS 11
static int layer_qlinears(const hd_layer *L, const hd_qlinear **q)
{
    int n = 0;
    if (L->kind == 'K') {
        q[n++] = &L->kda.q_proj;
        q[n++] = &L->kda.k_proj;
        q[n++] = &L->kda.v_proj;
        q[n++] = &L->kda.g_proj;
        q[n++] = &L->kda.o_proj;
    } else {
        q[n++] = &L->mla.q_proj;
        q[n++] = &L->mla.kv_a;
        q[n++] = &L->mla.kv_b;
        q[n++] = &L->mla.o_proj;
    }
    q[n++] = &L->moe.gate;
    q[n++] = &L->moe.up;
    q[n++] = &L->moe.down;
    q[n++] = &L->moe.s_gate;
    q[n++] = &L->moe.s_up;
    q[n++] = &L->moe.s_down;
    return n;
}

void hd_model_release_layer(hd_model *m, int i)
{
    const hd_qlinear *q[LAYER_QLINEARS];
    const int n = layer_qlinears(&m->layers[i], q);
    for (int j = 0; j < n; j++)
        hd_model_release_qlinear(m, q[j]);
}

/* Calls f on the index of every synthetic tensor of layer i's int4
 * matrices. */
static void layer_synth_tensors(hd_model *m, int i, void (*f)(hd_model *, size_t))
{
    const hd_qlinear *q[LAYER_QLINEARS];
    const int n = layer_qlinears(&m->layers[i], q);
    for (int j = 0; j < n; j++) {
        const void *part[3];
        size_t bytes[3];
        qlinear_parts(q[j], part, bytes);
        for (int k = 0; k < 3; k++) {
            const long t = part[k] && bytes[k] ? synth_tensor(m, part[k], bytes[k]) : -1;
            if (t >= 0)
                f(m, (size_t)t);
        }
    }
}

void hd_model_acquire_layer(hd_model *m, int i)
{
    layer_synth_tensors(m, i, acquire_tensor);
}

void hd_model_acquire_all(hd_model *m)
{
    if (!m->synth_specs)
        return;
    for (size_t i = 0; i < m->n_tensors; i++)
        acquire_tensor(m, i);
}

/* A synthetic int4 tensor left to be made when a backend needs it. */
static void defer_tensor(hd_model *m, size_t i)
{
    m->tensors[i].released = 1;
}

static void model_destroy(hd_model *m)
{
    if (!m)
        return;
    if (m->backend && m->backend->model_free)
        m->backend->model_free(m);
    hd_st_close(&m->file);
    if (m->owned_lazy)
        hd_free_lazy(m->owned, m->owned_bytes);
    else
        hd_free_aligned(m->owned);
    free(m->synth_specs);
    free(m->tensors);
    m->magic = 0;
    free(m);
}

void hd_model_free(hd_model *model)
{
    if (model && model->magic == HD_MODEL_MAGIC)
        model_destroy(model);
}

/* Lays out specs, allocates model->tensors.  Returns the spec array. */
static hd_tensor_spec *model_layout(hd_model *m, char *err, size_t err_size,
                                    hd_status *st)
{
    size_t n = hd_motif_tensor_count(m->pattern);
    hd_tensor_spec *specs = calloc(n, sizeof *specs);
    m->tensors = calloc(n, sizeof *m->tensors);
    if (!specs || !m->tensors) {
        free(specs);
        *st = hd_fail(err, err_size, HD_ERR_OUT_OF_MEMORY,
                      "out of memory for the tensor table");
        return NULL;
    }
    m->n_tensors = n;
    hd_motif_layout(m, specs);
    return specs;
}

/* Records tensor i of the model and binds its pointer into the layers. */
static void model_bind(hd_model *m, const hd_tensor_spec *s, size_t i,
                       const void *data)
{
    hd_tensor *t = &m->tensors[i];
    snprintf(t->name, sizeof t->name, "%s", s->name);
    t->dtype = s->dtype;
    t->ndim = s->ndim;
    memcpy(t->shape, s->shape, sizeof t->shape);
    t->data = data;
    t->bytes = hd_motif_tensor_bytes(s);
    m->weight_bytes += t->bytes;
    if (s->u8_slot)
        *s->u8_slot = data;
    else
        *s->bf16_slot = data;
}

/* ops's model_init on m.  The CPU backend makes a synthetic model's int4
 * matrices itself, a layer at a time (hd_model_acquire_layer); the others
 * read them all from the model (the reference at every step, the CUDA
 * module while it copies them to the device), so they are made first. */
static hd_status backend_init(hd_model *m, const hd_backend_ops *ops, char *err,
                              size_t err_size)
{
    snprintf(m->backend_info, sizeof m->backend_info, "%s", ops->name);
    if (ops->kind != HD_BACKEND_CPU)
        hd_model_acquire_all(m);
    return ops->model_init(m, err, err_size);
}

static hd_status model_start_backend(hd_model *m, const hd_options *opt,
                                     char *err, size_t err_size)
{
    hd_options defaults;
    const hd_backend_ops *ops;
    hd_status st;
    int automatic = 0;

    if (!opt) {
        hd_options_init(&defaults);
        opt = &defaults;
    }
    if (opt->struct_size != 0 && opt->struct_size < sizeof(hd_options))
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                       "hd_options: struct_size %zu is too small; use hd_options_init",
                       opt->struct_size);
    if (opt->threads < 0)
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                       "hd_options: threads must be >= 0 (got %d)", opt->threads);
    if (opt->device < 0)
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                       "hd_options: device must be >= 0 (got %d)", opt->device);
    st = hd_backend_choose(opt->backend, &ops, &automatic, err, err_size);
    if (st != HD_OK)
        return st;
    m->threads = opt->threads;
    m->device = opt->device;
    st = backend_init(m, ops, err, err_size);
    /* auto: a backend that refuses this model hands it to the next one */
    while (st != HD_OK && automatic &&
           (st == HD_ERR_BACKEND || st == HD_ERR_BACKEND_UNAVAILABLE ||
            st == HD_ERR_OUT_OF_MEMORY)) {
        const hd_backend_ops *next = hd_backend_auto_next(ops);
        if (!next)
            break;
        ops = next;
        st = backend_init(m, ops, err, err_size);
    }
    if (st != HD_OK)
        return st;
    m->backend = ops;
    /* The CUDA module has copied every int4 matrix to the device and reads
     * the host's no more (the CPU backend gives them back itself, layer by
     * layer as it repacks). */
    if (ops->kind == HD_BACKEND_CUDA)
        for (int i = 0; i < m->n_layers; i++)
            hd_model_release_layer(m, i);
    return HD_OK;
}

hd_status hd_model_synth(uint32_t seed, int experts, const char *pattern,
                         const hd_options *options, hd_model **model,
                         char *err, size_t err_size)
{
    hd_model *m;
    hd_tensor_spec *specs;
    hd_status st = HD_OK;
    uint64_t total = 0;
    size_t i;

    if (!model)
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT, "model is NULL");
    *model = NULL;
    if (!pattern)
        pattern = "KKKM";
    if (!hd_motif_pattern_ok(pattern))
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                       "pattern must be 1 to %d letters K or M", HD_MAX_LAYERS);
    if (experts < HD_MIN_EXPERTS || experts > HD_MAX_EXPERTS)
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                       "experts must be in [%d, %d] (got %d)", HD_MIN_EXPERTS,
                       HD_MAX_EXPERTS, experts);
    m = model_new(pattern, experts);
    if (!m)
        return hd_fail(err, err_size, HD_ERR_OUT_OF_MEMORY, "out of memory");
    specs = model_layout(m, err, err_size, &st);
    if (!specs) {
        model_destroy(m);
        return st;
    }
    /* One buffer, every tensor at a 64-byte boundary. */
    for (i = 0; i < m->n_tensors; i++) {
        uint64_t b = (hd_motif_tensor_bytes(&specs[i]) + 63) & ~(uint64_t)63;
        if (!hd_add_u64(total, b, &total) || total > SIZE_MAX) {
            st = hd_fail(err, err_size, HD_ERR_OUT_OF_MEMORY,
                         "synthetic model too large");
            goto out;
        }
    }
    /* untouched until made: the int4 matrices are made when the backend
     * needs them (hd_model_acquire_layer) */
    m->owned = hd_alloc_lazy((size_t)total);
    if (!m->owned) {
        st = hd_fail(err, err_size, HD_ERR_OUT_OF_MEMORY,
                     "out of memory for %" PRIu64 " bytes of weights", total);
        goto out;
    }
    m->owned_bytes = (size_t)total;
    m->owned_lazy = 1;
    {
        unsigned char *p = m->owned;
        for (i = 0; i < m->n_tensors; i++) {
            uint64_t b = hd_motif_tensor_bytes(&specs[i]);
            model_bind(m, &specs[i], i, p);
            p += (b + 63) & ~(uint64_t)63;
        }
    }
    snprintf(m->source, sizeof m->source, "synth seed %" PRIu32, seed);
    /* kept: the int4 matrices are made later, and a backend may give them
     * back (hd_model_release_qlinear), which hd_model_save then makes
     * again */
    m->synth_specs = specs;
    m->synth_seed = seed;
    specs = NULL;
    for (int l = 0; l < m->n_layers; l++)
        layer_synth_tensors(m, l, defer_tensor);
    for (i = 0; i < m->n_tensors; i++)
        if (!m->tensors[i].released) /* the norms, the router, ...: made now */
            fill_tensor(m, i);
    st = model_start_backend(m, options, err, err_size);
out:
    free(specs);
    if (st != HD_OK) {
        model_destroy(m);
        return st;
    }
    *model = m;
    return HD_OK;
}

static const char *dtype_label(const hd_st_tensor *t)
{
    return t->dtype_name[0] ? t->dtype_name : "?";
}

static void shape_text(char *buf, size_t size, int ndim, const uint64_t *shape)
{
    size_t used = 0;
    buf[0] = 0;
    used += (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%" PRIu64,
                                 i ? ", " : "", shape[i]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
}

/* The pattern of a file: layers blocks.0 .. blocks.n-1, each KDA (it has
 * attn.g_proj) or MLA (it has attn.kv_a). */
static hd_status derive_pattern(const hd_st_file *f, char *pattern,
                                char *err, size_t err_size)
{
    char name[64];
    int n = 0;
    for (;; n++) {
        snprintf(name, sizeof name, "blocks.%d.attn_norm", n);
        if (!hd_st_find(f, name))
            break;
        if (n == HD_MAX_LAYERS)
            return hd_fail(err, err_size, HD_ERR_MODEL,
                           "more than %d layers (found %s)", HD_MAX_LAYERS, name);
        snprintf(name, sizeof name, "blocks.%d.attn.g_proj.w_q", n);
        if (hd_st_find(f, name)) {
            pattern[n] = 'K';
            continue;
        }
        snprintf(name, sizeof name, "blocks.%d.attn.kv_a.w_q", n);
        if (hd_st_find(f, name)) {
            pattern[n] = 'M';
            continue;
        }
        return hd_fail(err, err_size, HD_ERR_MODEL,
                       "layer %d is neither KDA (no blocks.%d.attn.g_proj.w_q) "
                       "nor MLA (no blocks.%d.attn.kv_a.w_q)", n, n, n);
    }
    pattern[n] = 0;
    if (n == 0)
        return hd_fail(err, err_size, HD_ERR_MODEL,
                       "tensor blocks.0.attn_norm missing: not a model of the motif");
    return HD_OK;
}

static hd_status derive_experts(const hd_st_file *f, int *experts, char *err,
                                size_t err_size)
{
    const char *name = "blocks.0.moe.router.weight";
    const hd_st_tensor *t = hd_st_find(f, name);
    if (!t)
        return hd_fail(err, err_size, HD_ERR_MODEL, "tensor %s missing", name);
    if (t->dtype != HD_DT_BF16 || t->ndim != 2 || t->shape[1] != HD_HIDDEN) {
        char sh[128];
        shape_text(sh, sizeof sh, t->ndim, t->shape);
        return hd_fail(err, err_size, HD_ERR_MODEL,
                       "tensor %s is %s %s, expected BF16 [E, %d]", name,
                       dtype_label(t), sh, HD_HIDDEN);
    }
    if (t->shape[0] < HD_MIN_EXPERTS || t->shape[0] > HD_MAX_EXPERTS)
        return hd_fail(err, err_size, HD_ERR_MODEL,
                       "tensor %s gives %" PRIu64 " experts; the motif needs %d to %d",
                       name, t->shape[0], HD_MIN_EXPERTS, HD_MAX_EXPERTS);
    *experts = (int)t->shape[0];
    return HD_OK;
}

static int spec_name_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Every expected tensor present with its dtype and shape; nothing else. */
static hd_status check_tensors(const hd_st_file *f, const hd_model *m,
                               const hd_tensor_spec *specs, char *err,
                               size_t err_size)
{
    const char **names;
    size_t n = m->n_tensors;

    for (size_t i = 0; i < n; i++) {
        const hd_tensor_spec *s = &specs[i];
        const hd_st_tensor *t = hd_st_find(f, s->name);
        int same = 1;
        if (!t)
            return hd_fail(err, err_size, HD_ERR_MODEL,
                           "tensor %s missing (pattern %s, %d experts)",
                           s->name, m->pattern, m->experts);
        if (t->ndim != s->ndim)
            same = 0;
        for (int d = 0; same && d < s->ndim; d++)
            same = t->shape[d] == s->shape[d];
        if (t->dtype != s->dtype || !same) {
            char got[128], want[128];
            shape_text(got, sizeof got, t->ndim, t->shape);
            shape_text(want, sizeof want, s->ndim, s->shape);
            return hd_fail(err, err_size, HD_ERR_MODEL,
                           "tensor %s is %s %s, expected %s %s (pattern %s, %d experts)",
                           s->name, dtype_label(t), got,
                           s->dtype == HD_DT_BF16 ? "BF16" : "U8", want,
                           m->pattern, m->experts);
        }
    }
    if (f->n_tensors == n)
        return HD_OK;
    /* More tensors than expected: name one that is not ours. */
    names = malloc(n * sizeof *names);
    if (!names)
        return hd_fail(err, err_size, HD_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < n; i++)
        names[i] = specs[i].name;
    qsort(names, n, sizeof *names, spec_name_cmp);
    for (size_t i = 0; i < f->n_tensors; i++) {
        const char *key = f->tensors[i].name;
        if (!bsearch(&key, names, n, sizeof *names, spec_name_cmp)) {
            hd_status st = hd_fail(err, err_size, HD_ERR_MODEL,
                                   "unexpected tensor %s (pattern %s, %d experts)",
                                   key, m->pattern, m->experts);
            free(names);
            return st;
        }
    }
    free(names);
    return hd_fail(err, err_size, HD_ERR_INTERNAL, "tensor count mismatch");
}

static hd_status check_metadata(const hd_st_file *f, const hd_model *m,
                                char *err, size_t err_size)
{
    const char *p = hd_st_meta_get(f, "pattern");
    const char *e = hd_st_meta_get(f, "experts");
    if (p && strcmp(p, m->pattern) != 0)
        return hd_fail(err, err_size, HD_ERR_MODEL,
                       "__metadata__ pattern \"%.64s\" disagrees with the tensors (%s)",
                       p, m->pattern);
    if (e) {
        char *end;
        long v;
        errno = 0;
        v = strtol(e, &end, 10);
        if (errno || end == e || *end || v != m->experts)
            return hd_fail(err, err_size, HD_ERR_MODEL,
                           "__metadata__ experts \"%.32s\" disagrees with the tensors (%d)",
                           e, m->experts);
    }
    return HD_OK;
}

/* Tensors whose bytes cannot be used in place (a bf16 tensor at an odd
 * address, or any bf16 tensor on a big-endian host) are copied once. */
static int needs_copy(const hd_tensor_spec *s, const void *data)
{
#ifdef WORDS_BIGENDIAN
    return s->dtype == HD_DT_BF16;
#else
    return s->dtype == HD_DT_BF16 && ((uintptr_t)data & 1);
#endif
}

static hd_status bind_file(hd_model *m, const hd_tensor_spec *specs,
                           char *err, size_t err_size)
{
    uint64_t copy_bytes = 0;
    unsigned char *p;

    for (size_t i = 0; i < m->n_tensors; i++) {
        const hd_st_tensor *t = hd_st_find(&m->file, specs[i].name);
        if (needs_copy(&specs[i], t->data))
            copy_bytes += (hd_motif_tensor_bytes(&specs[i]) + 63) & ~(uint64_t)63;
    }
    if (copy_bytes) {
        if (copy_bytes > SIZE_MAX || !(m->owned = hd_alloc_aligned((size_t)copy_bytes)))
            return hd_fail(err, err_size, HD_ERR_OUT_OF_MEMORY,
                           "out of memory for aligned copies of the weights");
    }
    p = m->owned;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const hd_st_tensor *t = hd_st_find(&m->file, specs[i].name);
        const void *data = t->data;
        if (needs_copy(&specs[i], t->data)) {
            uint64_t b = hd_motif_tensor_bytes(&specs[i]);
            uint16_t *dst = (uint16_t *)p;
            for (uint64_t j = 0; j < b / 2; j++)
                dst[j] = (uint16_t)(t->data[2 * j] | (t->data[2 * j + 1] << 8));
            data = p;
            p += (b + 63) & ~(uint64_t)63;
        }
        model_bind(m, &specs[i], i, data);
    }
    return HD_OK;
}

hd_status hd_model_from_st(hd_st_file *file, const char *source,
                           const hd_options *options, hd_model **model,
                           char *err, size_t err_size)
{
    char pattern[HD_MAX_LAYERS + 1];
    int experts = 0;
    hd_model *m;
    hd_tensor_spec *specs;
    hd_status st;

    if (model)
        *model = NULL;
    if (!file)
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT, "file is NULL");
    if (!model) {
        hd_st_close(file);
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT, "model is NULL");
    }
    st = derive_pattern(file, pattern, err, err_size);
    if (st == HD_OK)
        st = derive_experts(file, &experts, err, err_size);
    if (st != HD_OK) {
        hd_st_close(file);
        return st;
    }
    m = model_new(pattern, experts);
    if (!m) {
        hd_st_close(file);
        return hd_fail(err, err_size, HD_ERR_OUT_OF_MEMORY, "out of memory");
    }
    m->file = *file; /* the model owns the mapping from here on */
    memset(file, 0, sizeof *file);
    specs = model_layout(m, err, err_size, &st);
    if (!specs) {
        model_destroy(m);
        return st;
    }
    st = check_tensors(&m->file, m, specs, err, err_size);
    if (st == HD_OK)
        st = check_metadata(&m->file, m, err, err_size);
    if (st == HD_OK)
        st = bind_file(m, specs, err, err_size);
    free(specs);
    if (st == HD_OK) {
        snprintf(m->source, sizeof m->source, "%s", source ? source : "memory");
        st = model_start_backend(m, options, err, err_size);
    }
    if (st != HD_OK) {
        model_destroy(m);
        return st;
    }
    *model = m;
    return HD_OK;
}

hd_status hd_model_load(const char *path, const hd_options *options,
                        hd_model **model, char *err, size_t err_size)
{
    hd_st_file file;
    hd_status st;

    if (!model)
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT, "model is NULL");
    *model = NULL;
    if (!path)
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT, "path is NULL");
    st = hd_st_open(path, &file, err, err_size);
    if (st != HD_OK)
        return st;
    return hd_model_from_st(&file, path, options, model, err, err_size);
}

/* A released synthetic tensor, made again while its model is saved. */
typedef struct save_fill_ctx {
    uint32_t seed;
    const hd_tensor_spec *spec;
} save_fill_ctx;

static void save_fill(const void *ctx, void *dst)
{
    const save_fill_ctx *c = ctx;
    hd_synth_fill(c->seed, c->spec, dst);
}

hd_status hd_model_save(const hd_model *model, const char *path, char *err,
                        size_t err_size)
{
    hd_st_out *out;
    save_fill_ctx *fills;
    hd_st_meta meta[2];
    char experts[16], pattern[HD_MAX_LAYERS + 1];
    hd_status st;

    if (!model || model->magic != HD_MODEL_MAGIC)
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT, "model is NULL or invalid");
    if (!path)
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT, "path is NULL");
    out = calloc(model->n_tensors, sizeof *out);
    fills = calloc(model->n_tensors, sizeof *fills);
    if (!out || !fills) {
        free(out);
        free(fills);
        return hd_fail(err, err_size, HD_ERR_OUT_OF_MEMORY, "out of memory");
    }
#ifdef WORDS_BIGENDIAN
    free(out);
    free(fills);
    return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                   "saving models is not supported on big-endian hosts");
#endif
    for (size_t i = 0; i < model->n_tensors; i++) {
        const hd_tensor *t = &model->tensors[i];
        out[i].name = t->name;
        out[i].dtype = t->dtype;
        out[i].ndim = t->ndim;
        for (int d = 0; d < t->ndim; d++)
            out[i].shape[d] = t->shape[d];
        out[i].data = t->data;
        out[i].bytes = t->bytes;
        if (t->released) { /* given back by the backend: made again */
            out[i].data = NULL;
            out[i].fill = save_fill;
            out[i].fill_ctx = &fills[i];
            fills[i].seed = model->synth_seed;
            fills[i].spec = &model->synth_specs[i];
        }
    }
    snprintf(experts, sizeof experts, "%d", model->experts);
    snprintf(pattern, sizeof pattern, "%s", model->pattern);
    meta[0].key = (char *)"experts";
    meta[0].value = experts;
    meta[1].key = (char *)"pattern";
    meta[1].value = pattern;
    st = hd_st_write(path, out, model->n_tensors, meta, 2, err, err_size);
    free(out);
    free(fills);
    return st;
}
