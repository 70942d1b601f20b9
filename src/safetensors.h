/* safetensors.h - a strict reader and a writer for the safetensors format.
 *
 * Format: an 8-byte little-endian header length N, N bytes of UTF-8 JSON
 * (an object; optional "__metadata__" maps strings to strings; every other
 * key is a tensor {"dtype": str, "shape": [int...], "data_offsets": [b, e]}
 * with offsets relative to the data that follows the header), then the data.
 * The reader checks everything before anything is used: lengths, JSON, UTF-8,
 * dtypes, shapes (overflow), offsets (in bounds, begin <= end, size =
 * product(shape) * dtype size, the tensors tiling the data exactly: no gap,
 * no overlap, no trailing bytes) and duplicate names.
 */
#ifndef HD_SAFETENSORS_H
#define HD_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "hd.h"

#define HD_ST_MAX_DIMS 8
#define HD_ST_MAX_NAME 256           /* longest tensor name accepted, bytes */
#define HD_ST_MAX_HEADER (100u << 20) /* largest header accepted, bytes */
#define HD_ST_MAX_TENSORS 1000000u

typedef enum hd_dtype {
    HD_DT_U8 = 0,   /* "U8"   */
    HD_DT_BF16 = 1, /* "BF16" */
    HD_DT_OTHER = 2 /* a valid safetensors dtype that libhd does not use */
} hd_dtype;

typedef struct hd_st_tensor {
    char *name;             /* NUL-terminated, owned by the file */
    hd_dtype dtype;
    char dtype_name[8];     /* as written, e.g. "F32" */
    int ndim;
    uint64_t shape[HD_ST_MAX_DIMS];
    uint64_t begin, end;    /* data_offsets, relative to data */
    const unsigned char *data; /* = file data + begin */
} hd_st_tensor;

typedef struct hd_st_meta {
    char *key, *value;      /* owned */
} hd_st_meta;

typedef struct hd_st_file {
    void *map;              /* the mapping (or NULL for a memory buffer) */
    size_t map_bytes;
    const unsigned char *data; /* start of the data section */
    uint64_t data_bytes;
    hd_st_tensor *tensors;  /* sorted by name */
    size_t n_tensors;
    hd_st_meta *meta;       /* __metadata__, in file order */
    size_t n_meta;
} hd_st_file;

/* Parses and validates a safetensors image in memory.  `buf` must outlive
 * the result (tensors point into it).  HD_ERR_FORMAT with a message naming
 * the problem (and the tensor, where there is one); HD_ERR_OUT_OF_MEMORY. */
hd_status hd_st_parse(const unsigned char *buf, size_t len, hd_st_file *file,
                      char *err, size_t err_size);

/* Maps the file read-only and parses it (HD_ERR_IO when it cannot be opened
 * or mapped).  On success hd_st_close unmaps it. */
hd_status hd_st_open(const char *path, hd_st_file *file, char *err,
                     size_t err_size);

/* Releases what parse/open made (safe on a zeroed or failed file). */
void hd_st_close(hd_st_file *file);

/* Binary search by name; NULL if absent. */
const hd_st_tensor *hd_st_find(const hd_st_file *file, const char *name);

/* Metadata value for key; NULL if absent. */
const char *hd_st_meta_get(const hd_st_file *file, const char *key);

/* A tensor to write: the data is copied to the file as it is (the caller
 * gives little-endian bytes).  With data NULL and fill set, fill(fill_ctx,
 * buf) writes the tensor's bytes into a buffer of `bytes` made for it
 * while the file is written (one tensor's at a time). */
typedef struct hd_st_out {
    const char *name;
    hd_dtype dtype;
    int ndim;
    uint64_t shape[HD_ST_MAX_DIMS];
    const void *data;
    uint64_t bytes;        /* must equal product(shape) * dtype size */
    void (*fill)(const void *fill_ctx, void *buf);
    const void *fill_ctx;
} hd_st_out;

/* Writes a safetensors file: header keys sorted by name, data in that order
 * and contiguous, header padded with spaces to a multiple of 8 bytes.
 * Writes to "<path>.tmp.<pid>" and renames it over path at the end, so a
 * failure never leaves a partial file.  meta: n_meta key/value pairs for
 * __metadata__ (may be 0). */
hd_status hd_st_write(const char *path, const hd_st_out *tensors, size_t n,
                      const hd_st_meta *meta, size_t n_meta, char *err,
                      size_t err_size);

#endif /* HD_SAFETENSORS_H */
