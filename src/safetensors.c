/* safetensors.c - a strict safetensors reader (memory or mmap) and an atomic writer. */
#if !defined(_GNU_SOURCE) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* mmap, fsync, strdup, O_CLOEXEC */
#endif

#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <jansson.h>

#include "util.h"

/* A valid header nests three levels (root, tensor, arrays); anything much
 * deeper is refused before jansson's recursive parser sees it, so stack use
 * stays bounded whatever jansson's own limit is. */
#define ST_MAX_JSON_DEPTH 64

/* Room for a tensor name or other file text quoted in a message. */
#define ST_QUOTE_BYTES 80

/* Writes are issued in pieces of this size so that every return is checked
 * against a size that fits any size_t. */
#define ST_WRITE_CHUNK ((size_t)1 << 26)

typedef struct st_dtype_info {
    const char *name;
    unsigned bits; /* element size; a few float formats are narrower than a byte */
    hd_dtype dtype;
} st_dtype_info;

/* The dtypes of the safetensors format. */
static const st_dtype_info st_dtypes[] = {
    {"BOOL", 8, HD_DT_OTHER},    {"U8", 8, HD_DT_U8},
    {"I8", 8, HD_DT_OTHER},      {"F8_E5M2", 8, HD_DT_OTHER},
    {"F8_E4M3", 8, HD_DT_OTHER}, {"F8_E8M0", 8, HD_DT_OTHER},
    {"I16", 16, HD_DT_OTHER},    {"U16", 16, HD_DT_OTHER},
    {"F16", 16, HD_DT_OTHER},    {"BF16", 16, HD_DT_BF16},
    {"I32", 32, HD_DT_OTHER},    {"U32", 32, HD_DT_OTHER},
    {"F32", 32, HD_DT_OTHER},    {"F64", 64, HD_DT_OTHER},
    {"I64", 64, HD_DT_OTHER},    {"U64", 64, HD_DT_OTHER},
    {"C64", 64, HD_DT_OTHER},    {"F4", 4, HD_DT_OTHER},
    {"F6_E2M3", 6, HD_DT_OTHER}, {"F6_E3M2", 6, HD_DT_OTHER},
};

static const st_dtype_info *st_dtype_lookup(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strlen(st_dtypes[i].name) == len &&
            memcmp(st_dtypes[i].name, name, len) == 0)
            return &st_dtypes[i];
    return NULL;
}

/* Copies text from the file into out for a one-line message: control bytes
 * become '?', and long text is cut short with "...". */
static const char *st_quote(const char *s, size_t len, char *out,
                            size_t out_size)
{
    size_t room = out_size - 1, n = 0;
    bool cut = len > room;
    if (cut)
        room -= 3;
    for (; n < len && n < room; n++) {
        unsigned char c = (unsigned char)s[n];
        out[n] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    if (cut) {
        memcpy(out + n, "...", 3);
        n += 3;
    }
    out[n] = '\0';
    return out;
}

/* Strict UTF-8 check (no overlong forms, surrogates or code points past
 * U+10FFFF), for what the writer puts in the header. */
static bool st_utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        size_t k;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            k = 1, cp = c & 0x1f, min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            k = 2, cp = c & 0x0f, min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            k = 3, cp = c & 0x07, min = 0x10000;
        } else {
            return false;
        }
        if (n - i <= k)
            return false;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return false;
            cp = (cp << 6) | (s[i + j] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += k + 1;
    }
    return true;
}

/* True when brackets nest deeper than `limit` outside strings.  For any
 * prefix that is valid JSON this is exactly the depth jansson would recurse
 * to, so it bounds the parser's recursion. */
static bool st_json_too_deep(const unsigned char *p, size_t n, size_t limit)
{
    size_t depth = 0;
    bool in_string = false, escaped = false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        if (in_string) {
            if (escaped)
                escaped = false;
            else if (c == '\\')
                escaped = true;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > limit)
                return true;
        } else if ((c == ']' || c == '}') && depth > 0) {
            depth--;
        }
    }
    return false;
}

/* Key length, which can differ from strlen only when a key holds a NUL
 * (jansson refuses those when parsing; this checks it again). */
static size_t st_key_len(void *it)
{
#if JANSSON_VERSION_HEX >= 0x020e00
    return json_object_iter_key_len(it);
#else
    return strlen(json_object_iter_key(it)); /* no NUL keys before 2.14 */
#endif
}

/* ------------------------------------------------------------------ */
/* Reading                                                             */
/* ------------------------------------------------------------------ */

void hd_st_close(hd_st_file *file)
{
    if (!file)
        return;
    for (size_t i = 0; i < file->n_tensors; i++)
        free(file->tensors[i].name);
    free(file->tensors);
    for (size_t i = 0; i < file->n_meta; i++) {
        free(file->meta[i].key);
        free(file->meta[i].value);
    }
    free(file->meta);
    if (file->map)
        munmap(file->map, file->map_bytes);
    memset(file, 0, sizeof *file);
}

static hd_status st_oom(char *err, size_t err_size)
{
    return hd_fail(err, err_size, HD_ERR_OUT_OF_MEMORY,
                   "out of memory while reading a safetensors header");
}

static hd_status st_parse_meta(json_t *meta, hd_st_file *file, char *err,
                               size_t err_size)
{
    char q[ST_QUOTE_BYTES];
    if (!json_is_object(meta))
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "__metadata__ is not a JSON object");
    size_t n = json_object_size(meta);
    if (n == 0)
        return HD_OK;
    file->meta = calloc(n, sizeof *file->meta);
    if (!file->meta)
        return st_oom(err, err_size);
    for (void *it = json_object_iter(meta); it;
         it = json_object_iter_next(meta, it)) {
        const char *key = json_object_iter_key(it);
        size_t key_len = st_key_len(it);
        json_t *v = json_object_iter_value(it);
        if (strlen(key) != key_len)
            return hd_fail(err, err_size, HD_ERR_FORMAT,
                           "__metadata__ key contains a NUL byte");
        if (!json_is_string(v))
            return hd_fail(err, err_size, HD_ERR_FORMAT,
                           "__metadata__ value of key '%s' is not a string",
                           st_quote(key, key_len, q, sizeof q));
        const char *s = json_string_value(v);
        if (strlen(s) != json_string_length(v))
            return hd_fail(err, err_size, HD_ERR_FORMAT,
                           "__metadata__ value of key '%s' contains a NUL byte",
                           st_quote(key, key_len, q, sizeof q));
        hd_st_meta *m = &file->meta[file->n_meta];
        m->key = strdup(key);
        m->value = strdup(s);
        file->n_meta++; /* counted first so that close frees a half-made pair */
        if (!m->key || !m->value)
            return st_oom(err, err_size);
    }
    return HD_OK;
}

/* Reads one JSON integer >= 0; false for reals, negatives and other types. */
static bool st_get_u64(json_t *v, uint64_t *out)
{
    if (!json_is_integer(v))
        return false;
    json_int_t i = json_integer_value(v);
    if (i < 0)
        return false;
    *out = (uint64_t)i;
    return true;
}

static hd_status st_parse_tensor(const char *name, size_t name_len,
                                 json_t *entry, const unsigned char *data,
                                 uint64_t data_bytes, hd_st_tensor *t,
                                 char *err, size_t err_size)
{
    char q[ST_QUOTE_BYTES], q2[ST_QUOTE_BYTES];
    const char *qn = st_quote(name, name_len, q, sizeof q);

    if (name_len == 0)
        return hd_fail(err, err_size, HD_ERR_FORMAT, "empty tensor name");
    if (strlen(name) != name_len)
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "tensor name '%s' contains a NUL byte", qn);
    if (name_len > HD_ST_MAX_NAME)
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "tensor name '%s' is %zu bytes long, more than %d",
                       qn, name_len, HD_ST_MAX_NAME);
    if (!json_is_object(entry))
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "tensor '%s': entry is not a JSON object", qn);

    /* Exactly the three keys of the format, nothing else. */
    for (void *it = json_object_iter(entry); it;
         it = json_object_iter_next(entry, it)) {
        const char *k = json_object_iter_key(it);
        if (strcmp(k, "dtype") != 0 && strcmp(k, "shape") != 0 &&
            strcmp(k, "data_offsets") != 0)
            return hd_fail(err, err_size, HD_ERR_FORMAT,
                           "tensor '%s': unexpected key '%s'", qn,
                           st_quote(k, st_key_len(it), q2, sizeof q2));
    }

    json_t *jdtype = json_object_get(entry, "dtype");
    json_t *jshape = json_object_get(entry, "shape");
    json_t *joffs = json_object_get(entry, "data_offsets");
    if (!jdtype)
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "tensor '%s': missing dtype", qn);
    if (!jshape)
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "tensor '%s': missing shape", qn);
    if (!joffs)
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "tensor '%s': missing data_offsets", qn);

    if (!json_is_string(jdtype))
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "tensor '%s': dtype is not a string", qn);
    const char *dname = json_string_value(jdtype);
    size_t dlen = json_string_length(jdtype);
    const st_dtype_info *info = st_dtype_lookup(dname, dlen);
    if (!info)
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "tensor '%s': unknown dtype '%s'", qn,
                       st_quote(dname, dlen, q2, sizeof q2));

    if (!json_is_array(jshape))
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "tensor '%s': shape is not an array", qn);
    size_t ndim = json_array_size(jshape);
    if (ndim > HD_ST_MAX_DIMS)
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "tensor '%s': shape has %zu dimensions, at most %d "
                       "are supported",
                       qn, ndim, HD_ST_MAX_DIMS);
    uint64_t elems = 1;
    bool overflow = false;
    for (size_t d = 0; d < ndim; d++) {
        if (!st_get_u64(json_array_get(jshape, d), &t->shape[d]))
            return hd_fail(err, err_size, HD_ERR_FORMAT,
                           "tensor '%s': shape[%zu] is not a non-negative "
                           "integer",
                           qn, d);
        if (!hd_mul_u64(elems, t->shape[d], &elems))
            overflow = true; /* reported after every dimension is checked */
    }
    if (overflow)
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "tensor '%s': shape product overflows 64 bits", qn);

    if (!json_is_array(joffs) || json_array_size(joffs) != 2)
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "tensor '%s': data_offsets is not an array of 2 "
                       "integers",
                       qn);
    uint64_t begin, end;
    if (!st_get_u64(json_array_get(joffs, 0), &begin))
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "tensor '%s': data_offsets[0] is not a non-negative "
                       "integer",
                       qn);
    if (!st_get_u64(json_array_get(joffs, 1), &end))
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "tensor '%s': data_offsets[1] is not a non-negative "
                       "integer",
                       qn);
    if (begin > end)
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                       "] are reversed (begin > end)",
                       qn, begin, end);
    if (end > data_bytes)
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "tensor '%s': data_offsets end %" PRIu64
                       " is past the end of the data (%" PRIu64 " bytes)",
                       qn, end, data_bytes);

    uint64_t bits;
    if (!hd_mul_u64(elems, info->bits, &bits))
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "tensor '%s': byte size of shape overflows 64 bits",
                       qn);
    if (bits % 8 != 0)
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "tensor '%s': %" PRIu64 " elements of %s are not a "
                       "whole number of bytes",
                       qn, elems, info->name);
    if (bits / 8 != end - begin)
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "tensor '%s': shape and dtype %s need %" PRIu64
                       " bytes but data_offsets [%" PRIu64 ", %" PRIu64
                       "] span %" PRIu64,
                       qn, info->name, bits / 8, begin, end, end - begin);

    t->name = strdup(name);
    if (!t->name)
        return st_oom(err, err_size);
    t->dtype = info->dtype;
    /* The longest dtype name has 7 letters: it fits dtype_name[8]. */
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", info->name);
    t->ndim = (int)ndim;
    t->begin = begin;
    t->end = end;
    t->data = data + begin;
    return HD_OK;
}

static int st_cmp_offsets(const void *a, const void *b)
{
    const hd_st_tensor *x = *(const hd_st_tensor *const *)a;
    const hd_st_tensor *y = *(const hd_st_tensor *const *)b;
    /* Ties on begin put the empty tensors first, so that a zero-size tensor
     * sharing its offset with a real one never looks like an overlap. */
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int st_cmp_names(const void *a, const void *b)
{
    return strcmp(((const hd_st_tensor *)a)->name,
                  ((const hd_st_tensor *)b)->name);
}

/* The tensors, in offset order, must cover the data exactly once. */
static hd_status st_check_tiling(hd_st_file *file, char *err, size_t err_size)
{
    char q[ST_QUOTE_BYTES], q2[ST_QUOTE_BYTES];
    size_t n = file->n_tensors;
    if (n == 0) {
        if (file->data_bytes != 0)
            return hd_fail(err, err_size, HD_ERR_FORMAT,
                           "%" PRIu64 " trailing bytes after the header but "
                           "no tensors",
                           file->data_bytes);
        return HD_OK;
    }
    const hd_st_tensor **order = malloc(n * sizeof *order);
    if (!order)
        return st_oom(err, err_size);
    for (size_t i = 0; i < n; i++)
        order[i] = &file->tensors[i];
    qsort(order, n, sizeof *order, st_cmp_offsets);

    hd_status status = HD_OK;
    uint64_t expect = 0;
    for (size_t i = 0; i < n && status == HD_OK; i++) {
        const hd_st_tensor *t = order[i];
        const char *qn = st_quote(t->name, strlen(t->name), q, sizeof q);
        if (t->begin < expect)
            status = hd_fail(err, err_size, HD_ERR_FORMAT,
                             "tensor '%s': data_offsets [%" PRIu64
                             ", %" PRIu64 "] overlap tensor '%s'",
                             qn, t->begin, t->end,
                             st_quote(order[i - 1]->name,
                                      strlen(order[i - 1]->name), q2,
                                      sizeof q2));
        else if (t->begin > expect)
            status = hd_fail(err, err_size, HD_ERR_FORMAT,
                             "tensor '%s': data_offsets begin %" PRIu64
                             " leaves a gap of %" PRIu64
                             " bytes after offset %" PRIu64,
                             qn, t->begin, t->begin - expect, expect);
        expect = t->end;
    }
    if (status == HD_OK && expect != file->data_bytes)
        status = hd_fail(err, err_size, HD_ERR_FORMAT,
                         "%" PRIu64 " trailing bytes after the last tensor "
                         "(tensors end at data offset %" PRIu64
                         ", the data has %" PRIu64 " bytes)",
                         file->data_bytes - expect, expect, file->data_bytes);
    free(order);
    return status;
}

static hd_status st_parse_root(json_t *root, hd_st_file *file, char *err,
                               size_t err_size)
{
    char q[ST_QUOTE_BYTES];
    json_t *meta = json_object_get(root, "__metadata__");
    size_t n = json_object_size(root) - (meta ? 1 : 0);
    if (n > HD_ST_MAX_TENSORS)
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "%zu tensors, more than the %u supported", n,
                       HD_ST_MAX_TENSORS);
    if (meta) {
        hd_status s = st_parse_meta(meta, file, err, err_size);
        if (s != HD_OK)
            return s;
    }
    if (n > 0) {
        file->tensors = calloc(n, sizeof *file->tensors);
        if (!file->tensors)
            return st_oom(err, err_size);
    }
    /* jansson iterates in file order, so the first bad entry is reported. */
    for (void *it = json_object_iter(root); it;
         it = json_object_iter_next(root, it)) {
        const char *key = json_object_iter_key(it);
        size_t key_len = st_key_len(it);
        if (key_len == 12 && memcmp(key, "__metadata__", 12) == 0)
            continue;
        if (file->n_tensors >= n) /* cannot happen; never write past */
            return hd_fail(err, err_size, HD_ERR_INTERNAL,
                           "tensor count changed while reading the header");
        hd_status s = st_parse_tensor(key, key_len, json_object_iter_value(it),
                                      file->data, file->data_bytes,
                                      &file->tensors[file->n_tensors], err,
                                      err_size);
        if (s != HD_OK)
            return s;
        file->n_tensors++;
    }

    hd_status s = st_check_tiling(file, err, err_size);
    if (s != HD_OK)
        return s;

    if (file->n_tensors > 1) /* qsort's base must not be NULL */
        qsort(file->tensors, file->n_tensors, sizeof *file->tensors,
              st_cmp_names);
    /* The JSON parser already refuses duplicate keys; this keeps the binary
     * search sound whatever it does. */
    for (size_t i = 1; i < file->n_tensors; i++)
        if (strcmp(file->tensors[i - 1].name, file->tensors[i].name) == 0)
            return hd_fail(err, err_size, HD_ERR_FORMAT,
                           "duplicate tensor name '%s'",
                           st_quote(file->tensors[i].name,
                                    strlen(file->tensors[i].name), q,
                                    sizeof q));
    return HD_OK;
}

hd_status hd_st_parse(const unsigned char *buf, size_t len, hd_st_file *file,
                      char *err, size_t err_size)
{
    if (!file)
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                       "hd_st_parse: file is NULL");
    memset(file, 0, sizeof *file);
    if (!buf && len > 0)
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                       "hd_st_parse: buffer is NULL");
    if (len < 8)
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "file too short: %zu bytes, the header length alone "
                       "takes 8",
                       len);

    uint64_t hlen = hd_load_le64(buf);
    uint64_t after = (uint64_t)len - 8; /* no overflow: len >= 8 */
    if (hlen == 0)
        return hd_fail(err, err_size, HD_ERR_FORMAT, "header length is 0");
    if (hlen > HD_ST_MAX_HEADER)
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "header length %" PRIu64 " exceeds the limit of %u "
                       "bytes",
                       hlen, (unsigned)HD_ST_MAX_HEADER);
    if (hlen > after)
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "header length %" PRIu64 " exceeds the %" PRIu64
                       " bytes after the length field",
                       hlen, after);

    const unsigned char *hdr = buf + 8;
    size_t n = (size_t)hlen; /* <= HD_ST_MAX_HEADER: fits */
    const unsigned char *nul = memchr(hdr, 0, n);
    if (nul)
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "header contains a NUL byte at header offset %zu",
                       (size_t)(nul - hdr));
    if (st_json_too_deep(hdr, n, ST_MAX_JSON_DEPTH))
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "header JSON nests more than %d levels deep",
                       ST_MAX_JSON_DEPTH);

    json_error_t jerr;
    json_t *root = json_loadb((const char *)hdr, n, JSON_REJECT_DUPLICATES,
                              &jerr);
    if (!root) {
#if JANSSON_VERSION_HEX >= 0x020b00
        if (json_error_code(&jerr) == json_error_out_of_memory)
            return st_oom(err, err_size);
#endif
        /* jansson quotes the offending text, which may hold a newline. */
        char text[sizeof jerr.text];
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "header is not valid JSON: %s (line %d, column %d, "
                       "header offset %d)",
                       st_quote(jerr.text, strnlen(jerr.text, sizeof jerr.text),
                                text, sizeof text),
                       jerr.line, jerr.column, jerr.position);
    }
    if (!json_is_object(root)) {
        json_decref(root);
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "header is not a JSON object");
    }

    file->data = hdr + n;
    file->data_bytes = after - hlen;
    hd_status s = st_parse_root(root, file, err, err_size);
    json_decref(root);
    if (s != HD_OK)
        hd_st_close(file); /* frees what was made and zeroes *file */
    return s;
}

hd_status hd_st_open(const char *path, hd_st_file *file, char *err,
                     size_t err_size)
{
    if (!file)
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                       "hd_st_open: file is NULL");
    memset(file, 0, sizeof *file);
    if (!path)
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                       "hd_st_open: path is NULL");

    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return hd_fail(err, err_size, HD_ERR_IO, "cannot open '%s': %s", path,
                       strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return hd_fail(err, err_size, HD_ERR_IO, "cannot stat '%s': %s",
                       path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return hd_fail(err, err_size, HD_ERR_IO, "'%s' is not a regular file",
                       path);
    }
    if (st.st_size < 8) {
        close(fd);
        return hd_fail(err, err_size, HD_ERR_FORMAT,
                       "'%s': file too short (%lld bytes), the header length "
                       "alone takes 8",
                       path, (long long)st.st_size);
    }
    if ((uintmax_t)st.st_size > SIZE_MAX) {
        close(fd);
        return hd_fail(err, err_size, HD_ERR_IO,
                       "'%s' is too large to map on this system", path);
    }
    size_t bytes = (size_t)st.st_size;
    void *map = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd); /* the mapping keeps the file alive */
    if (map == MAP_FAILED)
        return hd_fail(err, err_size, HD_ERR_IO, "cannot map '%s': %s", path,
                       strerror(e));

    hd_status s = hd_st_parse(map, bytes, file, err, err_size);
    if (s != HD_OK) {
        munmap(map, bytes);
        return s;
    }
    file->map = map;
    file->map_bytes = bytes;
    return HD_OK;
}

const hd_st_tensor *hd_st_find(const hd_st_file *file, const char *name)
{
    if (!file || !name)
        return NULL;
    size_t lo = 0, hi = file->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, file->tensors[mid].name);
        if (c == 0)
            return &file->tensors[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

const char *hd_st_meta_get(const hd_st_file *file, const char *key)
{
    if (!file || !key)
        return NULL;
    for (size_t i = 0; i < file->n_meta; i++)
        if (strcmp(file->meta[i].key, key) == 0)
            return file->meta[i].value;
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Writing                                                             */
/* ------------------------------------------------------------------ */

static int st_cmp_out_names(const void *a, const void *b)
{
    const hd_st_out *x = *(const hd_st_out *const *)a;
    const hd_st_out *y = *(const hd_st_out *const *)b;
    return strcmp(x->name, y->name);
}

static hd_status st_check_out(const hd_st_out *t, size_t i, char *err,
                              size_t err_size)
{
    char q[ST_QUOTE_BYTES];
    if (!t->name || !t->name[0])
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                       "hd_st_write: tensor %zu has no name", i);
    size_t len = strlen(t->name);
    const char *qn = st_quote(t->name, len, q, sizeof q);
    if (len > HD_ST_MAX_NAME)
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                       "hd_st_write: tensor name '%s' is longer than %d bytes",
                       qn, HD_ST_MAX_NAME);
    if (!st_utf8_valid((const unsigned char *)t->name, len))
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                       "hd_st_write: tensor name '%s' is not valid UTF-8",
                       qn);
    if (strcmp(t->name, "__metadata__") == 0)
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                       "hd_st_write: '__metadata__' is reserved, not a "
                       "tensor name");
    uint64_t size;
    if (t->dtype == HD_DT_U8)
        size = 1;
    else if (t->dtype == HD_DT_BF16)
        size = 2;
    else
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                       "hd_st_write: tensor '%s': only U8 and BF16 can be "
                       "written",
                       qn);
    if (t->ndim < 0 || t->ndim > HD_ST_MAX_DIMS)
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                       "hd_st_write: tensor '%s': ndim %d is not in 0..%d",
                       qn, t->ndim, HD_ST_MAX_DIMS);
    uint64_t bytes = size;
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] > (uint64_t)INT64_MAX || /* JSON integers are signed */
            !hd_mul_u64(bytes, t->shape[d], &bytes))
            return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                           "hd_st_write: tensor '%s': shape size overflows",
                           qn);
    if (bytes != t->bytes)
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                       "hd_st_write: tensor '%s': shape needs %" PRIu64
                       " bytes but %" PRIu64 " were given",
                       qn, bytes, t->bytes);
    if (bytes > 0 && !t->data && !t->fill)
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                       "hd_st_write: tensor '%s': data is NULL", qn);
    return HD_OK;
}

/* Builds the header: tensors in `order` get contiguous offsets. */
static hd_status st_build_header(const hd_st_out *const *order, size_t n,
                                 const hd_st_meta *meta, size_t n_meta,
                                 char **out, char *err, size_t err_size)
{
    char q[ST_QUOTE_BYTES];
    hd_status s = HD_OK;
    json_t *root = json_object();
    if (!root)
        goto oom;
    if (n_meta > 0) {
        json_t *m = json_object();
        if (!m || json_object_set_new(root, "__metadata__", m) != 0)
            goto oom;
        for (size_t i = 0; i < n_meta; i++) {
            const char *k = meta[i].key, *v = meta[i].value;
            if (!k || !v) {
                s = hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                            "hd_st_write: metadata entry %zu has a NULL key "
                            "or value",
                            i);
                goto done;
            }
            if (!st_utf8_valid((const unsigned char *)k, strlen(k)) ||
                !st_utf8_valid((const unsigned char *)v, strlen(v))) {
                s = hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                            "hd_st_write: metadata '%s' is not valid UTF-8",
                            st_quote(k, strlen(k), q, sizeof q));
                goto done;
            }
            if (json_object_get(m, k)) {
                s = hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                            "hd_st_write: duplicate metadata key '%s'",
                            st_quote(k, strlen(k), q, sizeof q));
                goto done;
            }
            if (json_object_set_new(m, k, json_string(v)) != 0)
                goto oom;
        }
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const hd_st_out *t = order[i];
        uint64_t end;
        /* jansson integers are signed 64-bit. */
        if (!hd_add_u64(off, t->bytes, &end) || end > (uint64_t)INT64_MAX) {
            s = hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                        "hd_st_write: total tensor size overflows");
            goto done;
        }
        json_t *e = json_object();
        if (!e || json_object_set_new(root, t->name, e) != 0)
            goto oom;
        const char *dt = t->dtype == HD_DT_U8 ? "U8" : "BF16";
        /* Each new value is owned by its parent at once (set_new frees it
         * on failure), so nothing leaks on the way out. */
        if (json_object_set_new(e, "dtype", json_string(dt)) != 0)
            goto oom;
        json_t *shape = json_array();
        if (json_object_set_new(e, "shape", shape) != 0)
            goto oom;
        json_t *offs = json_array();
        if (json_object_set_new(e, "data_offsets", offs) != 0)
            goto oom;
        for (int d = 0; d < t->ndim; d++)
            if (json_array_append_new(
                    shape, json_integer((json_int_t)t->shape[d])) != 0)
                goto oom;
        if (json_array_append_new(offs, json_integer((json_int_t)off)) != 0 ||
            json_array_append_new(offs, json_integer((json_int_t)end)) != 0)
            goto oom;
        off = end;
    }
    *out = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
    if (!*out)
        goto oom;
    goto done;
oom:
    s = hd_fail(err, err_size, HD_ERR_OUT_OF_MEMORY,
                "out of memory while building a safetensors header");
done:
    json_decref(root);
    return s;
}

static bool st_fwrite_all(FILE *f, const void *p, uint64_t n)
{
    const unsigned char *c = p;
    while (n > 0) {
        size_t k = n > ST_WRITE_CHUNK ? ST_WRITE_CHUNK : (size_t)n;
        if (fwrite(c, 1, k, f) != k)
            return false;
        c += k;
        n -= k;
    }
    return true;
}

static hd_status st_write_file(const char *path, const char *tmp,
                               const char *header,
                               const hd_st_out *const *order, size_t n,
                               char *err, size_t err_size)
{
    size_t hlen = strlen(header);
    size_t padded = (hlen + 7) & ~(size_t)7; /* header <= a few GB: no wrap */
    static const char spaces[] = "       "; /* up to 7 of padding */
    unsigned char lenbuf[8];
    hd_store_le64(lenbuf, (uint64_t)padded);

    FILE *f = fopen(tmp, "wb");
    if (!f)
        return hd_fail(err, err_size, HD_ERR_IO, "cannot create '%s': %s",
                       tmp, strerror(errno));
    bool ok = st_fwrite_all(f, lenbuf, 8) && st_fwrite_all(f, header, hlen) &&
              st_fwrite_all(f, spaces, padded - hlen);
    for (size_t i = 0; ok && i < n; i++) {
        const hd_st_out *t = order[i];
        if (t->data || t->bytes == 0) {
            ok = st_fwrite_all(f, t->data, t->bytes);
        } else {
            void *buf = t->bytes <= SIZE_MAX ? malloc((size_t)t->bytes) : NULL;
            if (!buf) {
                fclose(f);
                remove(tmp);
                return hd_fail(err, err_size, HD_ERR_OUT_OF_MEMORY,
                               "out of memory for tensor '%s' while writing '%s'",
                               t->name, path);
            }
            t->fill(t->fill_ctx, buf);
            ok = st_fwrite_all(f, buf, t->bytes);
            free(buf);
        }
    }
    /* fsync before rename, so that a crash cannot leave an empty file under
     * the final name. */
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int e = errno;
    if (fclose(f) != 0 && ok) {
        ok = false;
        e = errno;
    }
    if (!ok) {
        remove(tmp);
        return hd_fail(err, err_size, HD_ERR_IO, "cannot write '%s': %s", tmp,
                       strerror(e ? e : EIO));
    }
    if (rename(tmp, path) != 0) {
        e = errno;
        remove(tmp);
        return hd_fail(err, err_size, HD_ERR_IO,
                       "cannot rename '%s' to '%s': %s", tmp, path,
                       strerror(e));
    }
    return HD_OK;
}

hd_status hd_st_write(const char *path, const hd_st_out *tensors, size_t n,
                      const hd_st_meta *meta, size_t n_meta, char *err,
                      size_t err_size)
{
    char q[ST_QUOTE_BYTES];
    if (!path || !path[0])
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                       "hd_st_write: path is NULL or empty");
    if (n > 0 && !tensors)
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                       "hd_st_write: tensors is NULL");
    if (n_meta > 0 && !meta)
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                       "hd_st_write: meta is NULL");
    if (n > HD_ST_MAX_TENSORS)
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                       "hd_st_write: %zu tensors, more than the %u supported",
                       n, HD_ST_MAX_TENSORS);
    for (size_t i = 0; i < n; i++) {
        hd_status s = st_check_out(&tensors[i], i, err, err_size);
        if (s != HD_OK)
            return s;
    }

    hd_status s = HD_OK;
    char *header = NULL, *tmp = NULL;
    const hd_st_out **order = NULL;
    if (n > 0) {
        order = malloc(n * sizeof *order);
        if (!order)
            goto oom;
        for (size_t i = 0; i < n; i++)
            order[i] = &tensors[i];
        qsort(order, n, sizeof *order, st_cmp_out_names);
        for (size_t i = 1; i < n; i++)
            if (strcmp(order[i - 1]->name, order[i]->name) == 0) {
                s = hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                            "hd_st_write: duplicate tensor name '%s'",
                            st_quote(order[i]->name, strlen(order[i]->name),
                                     q, sizeof q));
                goto done;
            }
    }
    s = st_build_header(order, n, meta, n_meta, &header, err, err_size);
    if (s != HD_OK)
        goto done;
    if (strlen(header) > HD_ST_MAX_HEADER - 8) {
        s = hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                    "hd_st_write: the header would exceed %u bytes",
                    (unsigned)HD_ST_MAX_HEADER);
        goto done;
    }

    size_t tmp_size = strlen(path) + 32;
    tmp = malloc(tmp_size);
    if (!tmp)
        goto oom;
    snprintf(tmp, tmp_size, "%s.tmp.%ld", path, (long)getpid());
    s = st_write_file(path, tmp, header, order, n, err, err_size);
    goto done;
oom:
    s = hd_fail(err, err_size, HD_ERR_OUT_OF_MEMORY,
                "out of memory while writing '%s'", path);
done:
    free(tmp);
    free(header);
    free(order);
    return s;
}
