/* test_safetensors.c - Check tests of the safetensors reader and writer. */
#if !defined(_GNU_SOURCE) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* mkstemp, opendir */
#endif

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hd.h"
#include "safetensors.h"
#include "util.h"

#define ERR_BYTES 512

/* ------------------------------------------------------------------ */
/* Helpers                                                             */
/* ------------------------------------------------------------------ */

/* An image: 8-byte length `hlen_field`, then hlen bytes of header text,
 * then the data.  Separate length and field let tests lie about it. */
static unsigned char *image_raw(uint64_t hlen_field, const char *hdr,
                                size_t hlen, const void *data, size_t dlen,
                                size_t *len)
{
    *len = 8 + hlen + dlen;
    unsigned char *b = malloc(*len ? *len : 1);
    ck_assert_ptr_nonnull(b);
    hd_store_le64(b, hlen_field);
    if (hlen)
        memcpy(b + 8, hdr, hlen);
    if (dlen)
        memcpy(b + 8 + hlen, data, dlen);
    return b;
}

/* The usual case: header text as given, true length, data after it. */
static unsigned char *image(const char *hdr, const void *data, size_t dlen,
                            size_t *len)
{
    return image_raw(strlen(hdr), hdr, strlen(hdr), data, dlen, len);
}

/* A header plus `dlen` bytes of a counting pattern. */
static unsigned char *image_n(const char *hdr, size_t dlen, size_t *len)
{
    unsigned char *d = malloc(dlen ? dlen : 1);
    ck_assert_ptr_nonnull(d);
    for (size_t i = 0; i < dlen; i++)
        d[i] = (unsigned char)(i * 7 + 1);
    unsigned char *b = image(hdr, d, dlen, len);
    free(d);
    return b;
}

static bool all_zero(const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i])
            return false;
    return true;
}

/* Parses buf and asserts HD_ERR_FORMAT, a message containing `needle`, and
 * a zeroed result that close accepts. */
static void expect_format_buf(const unsigned char *buf, size_t len,
                              const char *needle)
{
    hd_st_file f;
    char err[ERR_BYTES] = "";
    memset(&f, 0xab, sizeof f);
    hd_status s = hd_st_parse(buf, len, &f, err, sizeof err);
    ck_assert_msg(s == HD_ERR_FORMAT, "status %d, want HD_ERR_FORMAT (%s)",
                  (int)s, err);
    ck_assert_msg(err[0] != '\0', "empty error message");
    ck_assert_msg(strchr(err, '\n') == NULL, "message not one line: %s",
                  err);
    ck_assert_msg(strstr(err, needle) != NULL,
                  "message \"%s\" does not mention \"%s\"", err, needle);
    ck_assert_msg(all_zero(&f, sizeof f), "file not zeroed after failure");
    hd_st_close(&f);
}

static void expect_format(const char *hdr, size_t dlen, const char *needle)
{
    size_t len;
    unsigned char *b = image_n(hdr, dlen, &len);
    expect_format_buf(b, len, needle);
    free(b);
}

static void expect_ok(const char *hdr, size_t dlen, hd_st_file *f)
{
    size_t len;
    char err[ERR_BYTES] = "";
    unsigned char *b = image_n(hdr, dlen, &len);
    hd_status s = hd_st_parse(b, len, f, err, sizeof err);
    ck_assert_msg(s == HD_OK, "status %d: %s", (int)s, err);
    /* The caller only looks at names and offsets: the buffer can go, but
     * the data pointers must not be used after this. */
    free(b);
}

/* A fresh, unused name in the current directory (tests run in the build
 * directory).  The file mkstemp made is removed; the name is returned. */
static void temp_name(char *path, size_t size)
{
    snprintf(path, size, "st_test_XXXXXX");
    int fd = mkstemp(path);
    ck_assert_msg(fd >= 0, "mkstemp: %s", strerror(errno));
    close(fd);
    unlink(path);
}

/* True when the current directory holds a name starting with `prefix`. */
static bool dir_has_prefix(const char *prefix)
{
    DIR *d = opendir(".");
    ck_assert_ptr_nonnull(d);
    bool found = false;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0)
            found = true;
    closedir(d);
    return found;
}

static bool file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Neither the file nor any "<path>.tmp.*" is left. */
static void assert_nothing_left(const char *path)
{
    char prefix[256];
    snprintf(prefix, sizeof prefix, "%s.tmp.", path);
    ck_assert_msg(!file_exists(path), "%s exists after a failed write", path);
    ck_assert_msg(!dir_has_prefix(prefix), "a temp file %s* was left",
                  prefix);
}

/* ------------------------------------------------------------------ */
/* Valid images                                                        */
/* ------------------------------------------------------------------ */

static const char valid_hdr[] =
    "{\"__metadata__\":{\"format\":\"pt\",\"answer\":\"42\"},"
    "\"w.bf16\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[4,16]},"
    "\"a.u8\":{\"shape\":[4],\"dtype\":\"U8\",\"data_offsets\":[0,4]}}";

START_TEST(test_valid_u8_bf16_and_metadata)
{
    size_t len;
    unsigned char *b = image_n(valid_hdr, 16, &len);
    hd_st_file f;
    char err[ERR_BYTES] = "";
    ck_assert_int_eq(hd_st_parse(b, len, &f, err, sizeof err), HD_OK);

    ck_assert_uint_eq(f.n_tensors, 2);
    ck_assert_uint_eq(f.data_bytes, 16);
    ck_assert_ptr_eq(f.data, b + 8 + strlen(valid_hdr));
    ck_assert_ptr_null(f.map);

    /* Sorted by name. */
    ck_assert_str_eq(f.tensors[0].name, "a.u8");
    ck_assert_str_eq(f.tensors[1].name, "w.bf16");

    const hd_st_tensor *a = hd_st_find(&f, "a.u8");
    ck_assert_ptr_eq(a, &f.tensors[0]);
    ck_assert_int_eq(a->dtype, HD_DT_U8);
    ck_assert_str_eq(a->dtype_name, "U8");
    ck_assert_int_eq(a->ndim, 1);
    ck_assert_uint_eq(a->shape[0], 4);
    ck_assert_uint_eq(a->begin, 0);
    ck_assert_uint_eq(a->end, 4);
    ck_assert_ptr_eq(a->data, f.data);
    ck_assert_int_eq(a->data[3], (unsigned char)(3 * 7 + 1));

    const hd_st_tensor *w = hd_st_find(&f, "w.bf16");
    ck_assert_ptr_eq(w, &f.tensors[1]);
    ck_assert_int_eq(w->dtype, HD_DT_BF16);
    ck_assert_str_eq(w->dtype_name, "BF16");
    ck_assert_int_eq(w->ndim, 2);
    ck_assert_uint_eq(w->shape[0], 2);
    ck_assert_uint_eq(w->shape[1], 3);
    ck_assert_uint_eq(w->begin, 4);
    ck_assert_uint_eq(w->end, 16);
    ck_assert_ptr_eq(w->data, f.data + 4);
    ck_assert_int_eq(w->data[0], (unsigned char)(4 * 7 + 1));

    /* Misses, before, between and after the names. */
    ck_assert_ptr_null(hd_st_find(&f, "a"));
    ck_assert_ptr_null(hd_st_find(&f, "b"));
    ck_assert_ptr_null(hd_st_find(&f, "z"));
    ck_assert_ptr_null(hd_st_find(&f, ""));
    ck_assert_ptr_null(hd_st_find(&f, "__metadata__"));
    ck_assert_ptr_null(hd_st_find(&f, NULL));
    ck_assert_ptr_null(hd_st_find(NULL, "a.u8"));

    /* Metadata, in file order. */
    ck_assert_uint_eq(f.n_meta, 2);
    ck_assert_str_eq(f.meta[0].key, "format");
    ck_assert_str_eq(f.meta[0].value, "pt");
    ck_assert_str_eq(f.meta[1].key, "answer");
    ck_assert_str_eq(f.meta[1].value, "42");
    ck_assert_str_eq(hd_st_meta_get(&f, "answer"), "42");
    ck_assert_str_eq(hd_st_meta_get(&f, "format"), "pt");
    ck_assert_ptr_null(hd_st_meta_get(&f, "missing"));
    ck_assert_ptr_null(hd_st_meta_get(&f, NULL));

    hd_st_close(&f);
    ck_assert(all_zero(&f, sizeof f));
    hd_st_close(&f); /* twice is fine */
    free(b);
}
END_TEST

START_TEST(test_valid_empty_header_object)
{
    hd_st_file f;
    expect_ok("{}", 0, &f);
    ck_assert_uint_eq(f.n_tensors, 0);
    ck_assert_uint_eq(f.n_meta, 0);
    ck_assert_ptr_null(hd_st_find(&f, "x"));
    hd_st_close(&f);
    /* Padding spaces after the JSON are allowed. */
    expect_ok("{}      ", 0, &f);
    hd_st_close(&f);
    expect_ok("{\"__metadata__\":{}}  ", 0, &f);
    ck_assert_uint_eq(f.n_meta, 0);
    hd_st_close(&f);
}
END_TEST

START_TEST(test_valid_zero_size_tensors_and_ties)
{
    /* Empty tensors at 0, in the middle (sharing an offset with a real
     * tensor on both sides) and at the very end. */
    hd_st_file f;
    expect_ok("{\"e0\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},"
              "\"x\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"
              "\"e3\":{\"dtype\":\"BF16\",\"shape\":[2,0],"
              "\"data_offsets\":[3,3]},"
              "\"y\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[3,5]},"
              "\"e5\":{\"dtype\":\"F32\",\"shape\":[0,7],"
              "\"data_offsets\":[5,5]},"
              "\"e5b\":{\"dtype\":\"U8\",\"shape\":[0],"
              "\"data_offsets\":[5,5]}}   ",
              5, &f);
    ck_assert_uint_eq(f.n_tensors, 6);
    for (size_t i = 1; i < f.n_tensors; i++)
        ck_assert(strcmp(f.tensors[i - 1].name, f.tensors[i].name) < 0);
    ck_assert_uint_eq(hd_st_find(&f, "e5")->begin, 5);
    ck_assert_int_eq(hd_st_find(&f, "e5")->dtype, HD_DT_OTHER);
    ck_assert_uint_eq(hd_st_find(&f, "y")->end, 5);
    hd_st_close(&f);

    /* Only empty tensors, no data. */
    expect_ok("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},"
              "\"b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}",
              0, &f);
    ck_assert_uint_eq(f.n_tensors, 2);
    hd_st_close(&f);
}
END_TEST

START_TEST(test_valid_other_dtypes_and_scalar)
{
    hd_st_file f;
    expect_ok("{\"f32\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"f64\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[8,16]},"
              "\"bool\":{\"dtype\":\"BOOL\",\"shape\":[3],"
              "\"data_offsets\":[16,19]},"
              "\"e4\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],"
              "\"data_offsets\":[19,20]},"
              "\"i64\":{\"dtype\":\"I64\",\"shape\":[1,1],"
              "\"data_offsets\":[20,28]},"
              "\"f4\":{\"dtype\":\"F4\",\"shape\":[4],"
              "\"data_offsets\":[28,30]}}",
              30, &f);
    const hd_st_tensor *t = hd_st_find(&f, "f64");
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(t->ndim, 0);
    ck_assert_int_eq(t->dtype, HD_DT_OTHER);
    ck_assert_str_eq(t->dtype_name, "F64");
    ck_assert_str_eq(hd_st_find(&f, "e4")->dtype_name, "F8_E4M3");
    ck_assert_str_eq(hd_st_find(&f, "f4")->dtype_name, "F4");
    hd_st_close(&f);
}
END_TEST

START_TEST(test_close_on_zeroed_struct)
{
    hd_st_file f;
    memset(&f, 0, sizeof f);
    hd_st_close(&f);
    hd_st_close(NULL);
    ck_assert(all_zero(&f, sizeof f));
}
END_TEST

/* ------------------------------------------------------------------ */
/* Length field                                                        */
/* ------------------------------------------------------------------ */

START_TEST(test_reject_empty_buffer)
{
    unsigned char b[1] = {0};
    expect_format_buf(b, 0, "short");
    expect_format_buf(NULL, 0, "short");
}
END_TEST

START_TEST(test_reject_seven_bytes)
{
    unsigned char b[7] = {2, 0, 0, 0, 0, 0, 0};
    expect_format_buf(b, sizeof b, "short");
}
END_TEST

START_TEST(test_reject_header_length_zero)
{
    size_t len;
    unsigned char *b = image_raw(0, "{}", 2, NULL, 0, &len);
    expect_format_buf(b, len, "header length");
    free(b);
}
END_TEST

START_TEST(test_reject_header_length_huge)
{
    static const uint64_t bad[] = {
        (uint64_t)1 << 63, UINT64_MAX, UINT64_MAX - 7, (uint64_t)HD_ST_MAX_HEADER + 1,
        3,  /* more than the 2 bytes that follow */
        100,
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t len;
        unsigned char *b = image_raw(bad[i], "{}", 2, NULL, 0, &len);
        expect_format_buf(b, len, "header length");
        free(b);
    }
}
END_TEST

/* ------------------------------------------------------------------ */
/* JSON                                                                */
/* ------------------------------------------------------------------ */

START_TEST(test_reject_invalid_utf8)
{
    expect_format("{\"a\":{\"dtype\":\"U\xff\",\"shape\":[0],"
                  "\"data_offsets\":[0,0]}}",
                  0, "JSON");
    expect_format("{\"a\xc0\xaf\":{\"dtype\":\"U8\",\"shape\":[0],"
                  "\"data_offsets\":[0,0]}}",
                  0, "JSON");
    expect_format("{\"__metadata__\":{\"k\":\"\xed\xa0\x80\"}}", 0, "JSON");
}
END_TEST

START_TEST(test_reject_not_json)
{
    expect_format("hello world", 0, "JSON");
    expect_format("{'a': 1}", 0, "JSON");
    expect_format("{} {}", 0, "JSON");
    expect_format("\"a string\"", 0, "JSON");
    /* A raw newline in a string: the message must stay on one line. */
    expect_format("{\"a\":\"x\ny\"}", 0, "JSON");
}
END_TEST

START_TEST(test_reject_json_array)
{
    expect_format("[{\"a\":1}]", 0, "object");
}
END_TEST

START_TEST(test_reject_truncated_json)
{
    expect_format("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_of", 4,
                  "JSON");
    expect_format("{", 0, "JSON");
}
END_TEST

START_TEST(test_reject_deeply_nested_json)
{
    size_t n = 100000;
    char *h = malloc(n + 1);
    ck_assert_ptr_nonnull(h);
    memset(h, '[', n);
    h[n] = '\0';
    expect_format(h, 0, "deep");
    /* The same inside an object, closed properly this time. */
    char *h2 = malloc(2 * n + 16);
    ck_assert_ptr_nonnull(h2);
    strcpy(h2, "{\"a\":");
    size_t k = strlen(h2);
    memset(h2 + k, '[', n);
    memset(h2 + k + n, ']', n);
    strcpy(h2 + k + 2 * n, "}");
    expect_format(h2, 0, "deep");
    free(h2);
    free(h);
}
END_TEST

START_TEST(test_reject_nul_in_header)
{
    static const char hdr[] = "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],"
                              "\"data_offsets\":[0,0]}}  ";
    size_t hlen = sizeof hdr - 1;
    char *h = malloc(hlen);
    ck_assert_ptr_nonnull(h);
    memcpy(h, hdr, hlen);
    size_t len;
    /* In the padding, and inside a name. */
    h[hlen - 1] = '\0';
    unsigned char *b = image_raw(hlen, h, hlen, NULL, 0, &len);
    expect_format_buf(b, len, "NUL");
    free(b);
    memcpy(h, hdr, hlen);
    h[2] = '\0';
    b = image_raw(hlen, h, hlen, NULL, 0, &len);
    expect_format_buf(b, len, "NUL");
    free(b);
    free(h);
    /* An escaped NUL is refused too (by the JSON parser). */
    expect_format("{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[0],"
                  "\"data_offsets\":[0,0]}}",
                  0, "NUL");
}
END_TEST

START_TEST(test_reject_duplicate_tensor_name)
{
    expect_format("{\"dup\":{\"dtype\":\"U8\",\"shape\":[1],"
                  "\"data_offsets\":[0,1]},"
                  "\"dup\":{\"dtype\":\"U8\",\"shape\":[1],"
                  "\"data_offsets\":[1,2]}}",
                  2, "dup");
}
END_TEST

/* ------------------------------------------------------------------ */
/* Tensor entries                                                      */
/* ------------------------------------------------------------------ */

START_TEST(test_reject_entry_not_object)
{
    expect_format("{\"t9\":[1,2]}", 0, "t9");
    expect_format("{\"t9\":5}", 0, "not a JSON object");
}
END_TEST

START_TEST(test_reject_extra_key_in_entry)
{
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"shape\":[1],"
                  "\"data_offsets\":[0,1],\"extra\":1}}",
                  1, "extra");
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"shape\":[1],"
                  "\"data_offsets\":[0,1],\"Dtype\":\"U8\"}}",
                  1, "t9");
}
END_TEST

START_TEST(test_reject_missing_keys)
{
    expect_format("{\"t9\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                  "dtype");
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1,
                  "shape");
}
END_TEST

START_TEST(test_reject_unknown_dtype)
{
    expect_format("{\"t9\":{\"dtype\":\"Q4\",\"shape\":[1],"
                  "\"data_offsets\":[0,1]}}",
                  1, "Q4");
    expect_format("{\"t9\":{\"dtype\":\"u8\",\"shape\":[1],"
                  "\"data_offsets\":[0,1]}}",
                  1, "t9");
    expect_format("{\"t9\":{\"dtype\":\"\",\"shape\":[1],"
                  "\"data_offsets\":[0,1]}}",
                  1, "dtype");
}
END_TEST

START_TEST(test_reject_dtype_not_string)
{
    expect_format("{\"t9\":{\"dtype\":8,\"shape\":[1],"
                  "\"data_offsets\":[0,1]}}",
                  1, "dtype");
    expect_format("{\"t9\":{\"dtype\":[\"U8\"],\"shape\":[1],"
                  "\"data_offsets\":[0,1]}}",
                  1, "t9");
}
END_TEST

START_TEST(test_reject_data_offsets_missing)
{
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1,
                  "data_offsets");
}
END_TEST

START_TEST(test_reject_data_offsets_wrong_length)
{
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"shape\":[1],"
                  "\"data_offsets\":[0]}}",
                  1, "data_offsets");
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"shape\":[1],"
                  "\"data_offsets\":[0,1,1]}}",
                  1, "data_offsets");
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"shape\":[0],"
                  "\"data_offsets\":[]}}",
                  0, "data_offsets");
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"shape\":[1],"
                  "\"data_offsets\":{\"a\":0}}}",
                  1, "t9");
}
END_TEST

START_TEST(test_reject_data_offsets_negative)
{
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"shape\":[0],"
                  "\"data_offsets\":[-1,-1]}}",
                  0, "data_offsets");
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"shape\":[1],"
                  "\"data_offsets\":[0,-1]}}",
                  1, "t9");
}
END_TEST

START_TEST(test_reject_data_offsets_fractional)
{
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"shape\":[1],"
                  "\"data_offsets\":[0,1.5]}}",
                  2, "data_offsets");
    /* Reals are refused even when they are whole. */
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"shape\":[1],"
                  "\"data_offsets\":[0.0,1]}}",
                  1, "data_offsets");
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"shape\":[1],"
                  "\"data_offsets\":[0,1e0]}}",
                  1, "data_offsets");
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"shape\":[1],"
                  "\"data_offsets\":[\"0\",\"1\"]}}",
                  1, "data_offsets");
}
END_TEST

START_TEST(test_reject_data_offsets_reversed)
{
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"shape\":[0],"
                  "\"data_offsets\":[2,1]}}",
                  2, "reversed");
}
END_TEST

START_TEST(test_reject_data_offsets_past_end)
{
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"shape\":[4],"
                  "\"data_offsets\":[0,4]}}",
                  3, "past the end");
    /* Too big for any file, and too big for a signed 64-bit integer. */
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"shape\":[4],"
                  "\"data_offsets\":[9223372036854775800,"
                  "9223372036854775804]}}",
                  3, "past the end");
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"shape\":[4],"
                  "\"data_offsets\":[0,18446744073709551615]}}",
                  3, "JSON");
}
END_TEST

START_TEST(test_reject_data_offsets_overlapping)
{
    expect_format("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],"
                  "\"data_offsets\":[0,4]},"
                  "\"b\":{\"dtype\":\"U8\",\"shape\":[4],"
                  "\"data_offsets\":[2,6]}}",
                  6, "overlap");
    /* Two tensors on the same bytes. */
    expect_format("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],"
                  "\"data_offsets\":[0,4]},"
                  "\"b\":{\"dtype\":\"U8\",\"shape\":[4],"
                  "\"data_offsets\":[0,4]}}",
                  4, "overlap");
    /* A zero-size tensor strictly inside another. */
    expect_format("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],"
                  "\"data_offsets\":[0,4]},"
                  "\"b\":{\"dtype\":\"U8\",\"shape\":[0],"
                  "\"data_offsets\":[2,2]}}",
                  4, "overlap");
}
END_TEST

START_TEST(test_reject_data_offsets_gap)
{
    expect_format("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],"
                  "\"data_offsets\":[0,2]},"
                  "\"b\":{\"dtype\":\"U8\",\"shape\":[2],"
                  "\"data_offsets\":[3,5]}}",
                  5, "gap");
}
END_TEST

START_TEST(test_reject_data_offsets_not_starting_at_zero)
{
    expect_format("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],"
                  "\"data_offsets\":[1,3]}}",
                  3, "gap");
}
END_TEST

START_TEST(test_reject_trailing_bytes)
{
    expect_format("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],"
                  "\"data_offsets\":[0,2]}}",
                  3, "trailing");
    expect_format("{}", 1, "trailing");
    expect_format("{\"__metadata__\":{\"k\":\"v\"}}", 8, "trailing");
}
END_TEST

START_TEST(test_reject_shape_negative)
{
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"shape\":[-1],"
                  "\"data_offsets\":[0,0]}}",
                  0, "shape");
}
END_TEST

START_TEST(test_reject_shape_fractional)
{
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"shape\":[1.5],"
                  "\"data_offsets\":[0,1]}}",
                  1, "shape");
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"shape\":[2.0],"
                  "\"data_offsets\":[0,2]}}",
                  2, "t9");
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"shape\":[null],"
                  "\"data_offsets\":[0,1]}}",
                  1, "shape");
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"shape\":2,"
                  "\"data_offsets\":[0,2]}}",
                  2, "shape");
}
END_TEST

START_TEST(test_reject_shape_too_many_dims)
{
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                  "\"data_offsets\":[0,1]}}",
                  1, "dimensions");
    /* Eight is the limit and is fine. */
    hd_st_file f;
    expect_ok("{\"t9\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,2],"
              "\"data_offsets\":[0,2]}}",
              2, &f);
    ck_assert_int_eq(f.tensors[0].ndim, 8);
    ck_assert_uint_eq(f.tensors[0].shape[7], 2);
    hd_st_close(&f);
}
END_TEST

START_TEST(test_reject_shape_product_overflow)
{
    /* 2^32 * 2^32 = 2^64. */
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"shape\":[4294967296,"
                  "4294967296],\"data_offsets\":[0,0]}}",
                  0, "overflow");
    /* Elements fit, bytes do not: 2^62 * 4. */
    expect_format("{\"t9\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],"
                  "\"data_offsets\":[0,0]}}",
                  0, "overflow");
    /* 2^62 * 2 * 2 BF16 elements are 2^65 bytes, which would wrap to 0
     * and match empty offsets if unchecked. */
    expect_format("{\"t9\":{\"dtype\":\"BF16\",\"shape\":[4611686018427387904,"
                  "2,2],\"data_offsets\":[0,0]}}",
                  0, "t9");
}
END_TEST

START_TEST(test_reject_size_mismatch)
{
    expect_format("{\"t9\":{\"dtype\":\"BF16\",\"shape\":[2,3],"
                  "\"data_offsets\":[0,6]}}",
                  6, "span");
    expect_format("{\"t9\":{\"dtype\":\"U8\",\"shape\":[],"
                  "\"data_offsets\":[0,0]}}",
                  0, "t9");
    /* Half a byte of F4. */
    expect_format("{\"t9\":{\"dtype\":\"F4\",\"shape\":[3],"
                  "\"data_offsets\":[0,1]}}",
                  1, "t9");
}
END_TEST

START_TEST(test_reject_bad_names)
{
    expect_format("{\"\":{\"dtype\":\"U8\",\"shape\":[0],"
                  "\"data_offsets\":[0,0]}}",
                  0, "empty");
    char name[HD_ST_MAX_NAME + 2];
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    char hdr[1024];
    snprintf(hdr, sizeof hdr,
             "{\"%s\":{\"dtype\":\"U8\",\"shape\":[0],"
             "\"data_offsets\":[0,0]}}",
             name);
    expect_format(hdr, 0, "long");
    /* HD_ST_MAX_NAME bytes is still fine. */
    name[HD_ST_MAX_NAME] = '\0';
    snprintf(hdr, sizeof hdr,
             "{\"%s\":{\"dtype\":\"U8\",\"shape\":[0],"
             "\"data_offsets\":[0,0]}}",
             name);
    hd_st_file f;
    expect_ok(hdr, 0, &f);
    ck_assert_ptr_nonnull(hd_st_find(&f, name));
    hd_st_close(&f);
}
END_TEST

START_TEST(test_reject_metadata_not_object)
{
    expect_format("{\"__metadata__\":[\"a\",\"b\"]}", 0, "__metadata__");
    expect_format("{\"__metadata__\":\"x\"}", 0, "__metadata__");
}
END_TEST

START_TEST(test_reject_metadata_non_string_value)
{
    expect_format("{\"__metadata__\":{\"ok\":\"1\",\"n\":1}}", 0,
                  "__metadata__");
    expect_format("{\"__metadata__\":{\"n\":null}}", 0, "'n'");
    expect_format("{\"__metadata__\":{\"n\":{\"a\":\"b\"}}}", 0,
                  "__metadata__");
}
END_TEST

/* Every truncation and many one-byte changes of a valid image parse or
 * fail cleanly; what parses stays inside the buffer and tiles it. */
START_TEST(test_mutations_never_crash)
{
    size_t len;
    unsigned char *good = image_n(valid_hdr, 16, &len);
    unsigned char *b = malloc(len);
    ck_assert_ptr_nonnull(b);
    static const unsigned char vals[] = {0x00, 0xff, '"', '[', ']', '{', '}',
                                         '0', '9', '-', ' ', ',', ':', '.',
                                         'e', '\\'};
    for (size_t cut = 0; cut < len; cut++) {
        hd_st_file f;
        hd_status s = hd_st_parse(good, cut, &f, NULL, 0);
        ck_assert_int_eq(s, HD_ERR_FORMAT);
        ck_assert(all_zero(&f, sizeof f));
    }
    for (size_t pos = 0; pos < len - 16; pos++) {
        for (size_t v = 0; v < sizeof vals; v++) {
            memcpy(b, good, len);
            b[pos] = vals[v];
            hd_st_file f;
            char err[64];
            hd_status s = hd_st_parse(b, len, &f, err, sizeof err);
            ck_assert(s == HD_OK || s == HD_ERR_FORMAT);
            if (s != HD_OK) {
                ck_assert(all_zero(&f, sizeof f));
                continue;
            }
            uint64_t sum = 0;
            for (size_t i = 0; i < f.n_tensors; i++) {
                const hd_st_tensor *t = &f.tensors[i];
                ck_assert(t->end <= f.data_bytes);
                ck_assert(t->data >= b && t->data + (t->end - t->begin) <= b + len);
                sum += t->end - t->begin;
            }
            ck_assert_uint_eq(sum, f.data_bytes);
            hd_st_close(&f);
        }
    }
    free(b);
    free(good);
}
END_TEST

START_TEST(test_parse_null_arguments)
{
    unsigned char b[16] = {0};
    ck_assert_int_eq(hd_st_parse(b, sizeof b, NULL, NULL, 0),
                     HD_ERR_INVALID_ARGUMENT);
    hd_st_file f;
    ck_assert_int_eq(hd_st_parse(NULL, 16, &f, NULL, 0),
                     HD_ERR_INVALID_ARGUMENT);
    ck_assert(all_zero(&f, sizeof f));
}
END_TEST

/* ------------------------------------------------------------------ */
/* Writing and opening files                                           */
/* ------------------------------------------------------------------ */

START_TEST(test_write_open_round_trip)
{
    char path[64], err[ERR_BYTES] = "";
    temp_name(path, sizeof path);

    unsigned char u8[5] = {1, 2, 3, 250, 255};
    uint16_t bf[6] = {0x3f80, 0xbf80, 0x0000, 0x7f80, 0x4000, 0x1234};
    unsigned char bfle[12];
    for (int i = 0; i < 6; i++) {
        bfle[2 * i] = (unsigned char)(bf[i] & 0xff);
        bfle[2 * i + 1] = (unsigned char)(bf[i] >> 8);
    }
    unsigned char scalar[2] = {0x80, 0x3f};
    hd_st_out out[4] = {
        {.name = "zeta.weight", .dtype = HD_DT_BF16, .ndim = 2,
         .shape = {2, 3}, .data = bfle, .bytes = 12},
        {.name = "alpha", .dtype = HD_DT_U8, .ndim = 1, .shape = {5},
         .data = u8, .bytes = 5},
        {.name = "empty", .dtype = HD_DT_U8, .ndim = 2, .shape = {3, 0},
         .data = NULL, .bytes = 0},
        {.name = "scalar \"quoted\" \xc3\xa9", .dtype = HD_DT_BF16,
         .ndim = 0, .data = scalar, .bytes = 2},
    };
    hd_st_meta meta[2] = {{.key = "pattern", .value = "KKKM"},
                          {.key = "experts", .value = "8"}};
    ck_assert_msg(hd_st_write(path, out, 4, meta, 2, err, sizeof err) ==
                      HD_OK,
                  "%s", err);

    hd_st_file f;
    ck_assert_msg(hd_st_open(path, &f, err, sizeof err) == HD_OK, "%s", err);
    ck_assert_ptr_nonnull(f.map);
    ck_assert_uint_eq(f.n_tensors, 4);
    ck_assert_uint_eq(f.data_bytes, 19);
    for (size_t i = 0; i < 4; i++) {
        const hd_st_tensor *t = hd_st_find(&f, out[i].name);
        ck_assert_msg(t != NULL, "%s missing", out[i].name);
        ck_assert_int_eq(t->dtype, out[i].dtype);
        ck_assert_int_eq(t->ndim, out[i].ndim);
        for (int d = 0; d < t->ndim; d++)
            ck_assert_uint_eq(t->shape[d], out[i].shape[d]);
        ck_assert_uint_eq(t->end - t->begin, out[i].bytes);
        if (out[i].bytes)
            ck_assert(memcmp(t->data, out[i].data, out[i].bytes) == 0);
    }
    /* Data in sorted-name order, contiguous. */
    uint64_t off = 0;
    for (size_t i = 0; i < f.n_tensors; i++) {
        ck_assert_uint_eq(f.tensors[i].begin, off);
        off = f.tensors[i].end;
    }
    ck_assert_str_eq(hd_st_meta_get(&f, "pattern"), "KKKM");
    ck_assert_str_eq(hd_st_meta_get(&f, "experts"), "8");
    ck_assert_uint_eq(f.n_meta, 2);

    /* The header length is a multiple of 8 and the data follows it. */
    const unsigned char *m = f.map;
    uint64_t hlen = hd_load_le64(m);
    ck_assert_uint_eq(hlen % 8, 0);
    ck_assert_ptr_eq(f.data, m + 8 + hlen);
    ck_assert_uint_eq(f.map_bytes, 8 + hlen + 19);
    ck_assert_int_eq(m[8], '{');
    hd_st_close(&f);
    ck_assert(all_zero(&f, sizeof f));

    char prefix[128];
    snprintf(prefix, sizeof prefix, "%s.tmp.", path);
    ck_assert(!dir_has_prefix(prefix));

    /* Writing again replaces the file; no tensors at all is valid. */
    ck_assert_int_eq(hd_st_write(path, NULL, 0, NULL, 0, err, sizeof err),
                     HD_OK);
    ck_assert_int_eq(hd_st_open(path, &f, err, sizeof err), HD_OK);
    ck_assert_uint_eq(f.n_tensors, 0);
    ck_assert_uint_eq(f.n_meta, 0);
    ck_assert_uint_eq(f.map_bytes % 8, 0);
    hd_st_close(&f);
    ck_assert_int_eq(unlink(path), 0);
}
END_TEST

START_TEST(test_write_large_tensor_in_chunks)
{
    /* Bigger than one write chunk of the writer (64 MiB). */
    uint64_t n = ((uint64_t)1 << 25) + 3; /* BF16 elements: 64 MiB + 6 */
    unsigned char *d = malloc((size_t)n * 2);
    ck_assert_ptr_nonnull(d);
    for (uint64_t i = 0; i < n * 2; i++)
        d[i] = (unsigned char)(i * 131 + (i >> 20));
    char path[64], err[ERR_BYTES] = "";
    temp_name(path, sizeof path);
    hd_st_out out[2] = {
        {.name = "big", .dtype = HD_DT_BF16, .ndim = 1, .shape = {n},
         .data = d, .bytes = n * 2},
        {.name = "a", .dtype = HD_DT_U8, .ndim = 1, .shape = {3},
         .data = "xyz", .bytes = 3},
    };
    ck_assert_msg(hd_st_write(path, out, 2, NULL, 0, err, sizeof err) ==
                      HD_OK,
                  "%s", err);
    hd_st_file f;
    ck_assert_msg(hd_st_open(path, &f, err, sizeof err) == HD_OK, "%s", err);
    const hd_st_tensor *t = hd_st_find(&f, "big");
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq(t->begin, 3);
    ck_assert_uint_eq(t->end, 3 + n * 2);
    ck_assert(memcmp(t->data, d, (size_t)n * 2) == 0);
    ck_assert(memcmp(hd_st_find(&f, "a")->data, "xyz", 3) == 0);
    hd_st_close(&f);
    unlink(path);
    free(d);
}
END_TEST

static void expect_write_invalid(const hd_st_out *out, size_t n,
                                 const hd_st_meta *meta, size_t n_meta,
                                 const char *needle)
{
    char path[64], err[ERR_BYTES] = "";
    temp_name(path, sizeof path);
    hd_status s = hd_st_write(path, out, n, meta, n_meta, err, sizeof err);
    ck_assert_msg(s == HD_ERR_INVALID_ARGUMENT, "status %d (%s)", (int)s,
                  err);
    ck_assert_msg(strstr(err, needle) != NULL,
                  "message \"%s\" does not mention \"%s\"", err, needle);
    assert_nothing_left(path);
}

START_TEST(test_write_rejects_bad_arguments)
{
    unsigned char d[8] = {0};
    hd_st_out dup[2] = {
        {.name = "same", .dtype = HD_DT_U8, .ndim = 1, .shape = {2},
         .data = d, .bytes = 2},
        {.name = "same", .dtype = HD_DT_U8, .ndim = 1, .shape = {1},
         .data = d, .bytes = 1},
    };
    expect_write_invalid(dup, 2, NULL, 0, "duplicate");

    hd_st_out mismatch = {.name = "m", .dtype = HD_DT_BF16, .ndim = 1,
                          .shape = {3}, .data = d, .bytes = 3};
    expect_write_invalid(&mismatch, 1, NULL, 0, "bytes");

    hd_st_out other = {.name = "o", .dtype = HD_DT_OTHER, .ndim = 1,
                       .shape = {3}, .data = d, .bytes = 3};
    expect_write_invalid(&other, 1, NULL, 0, "U8");

    hd_st_out noname = {.name = "", .dtype = HD_DT_U8, .ndim = 1,
                        .shape = {1}, .data = d, .bytes = 1};
    expect_write_invalid(&noname, 1, NULL, 0, "name");

    hd_st_out reserved = {.name = "__metadata__", .dtype = HD_DT_U8,
                          .ndim = 1, .shape = {1}, .data = d, .bytes = 1};
    expect_write_invalid(&reserved, 1, NULL, 0, "reserved");

    hd_st_out dims = {.name = "d", .dtype = HD_DT_U8, .ndim = 9,
                      .shape = {1}, .data = d, .bytes = 1};
    expect_write_invalid(&dims, 1, NULL, 0, "ndim");

    hd_st_out huge = {.name = "h", .dtype = HD_DT_U8, .ndim = 2,
                      .shape = {0, UINT64_MAX}, .data = d, .bytes = 0};
    expect_write_invalid(&huge, 1, NULL, 0, "overflows");

    hd_st_out nodata = {.name = "n", .dtype = HD_DT_U8, .ndim = 1,
                        .shape = {1}, .data = NULL, .bytes = 1};
    expect_write_invalid(&nodata, 1, NULL, 0, "NULL");

    hd_st_out ok = {.name = "ok", .dtype = HD_DT_U8, .ndim = 1,
                    .shape = {1}, .data = d, .bytes = 1};
    hd_st_meta dupmeta[2] = {{.key = "k", .value = "1"},
                             {.key = "k", .value = "2"}};
    expect_write_invalid(&ok, 1, dupmeta, 2, "duplicate");
    hd_st_meta badutf8 = {.key = "k", .value = "\xff"};
    expect_write_invalid(&ok, 1, &badutf8, 1, "UTF-8");

    char err[ERR_BYTES];
    ck_assert_int_eq(hd_st_write(NULL, &ok, 1, NULL, 0, err, sizeof err),
                     HD_ERR_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_write_into_missing_directory_fails)
{
    unsigned char d[1] = {7};
    hd_st_out ok = {.name = "ok", .dtype = HD_DT_U8, .ndim = 1,
                    .shape = {1}, .data = d, .bytes = 1};
    char err[ERR_BYTES] = "";
    ck_assert_int_eq(hd_st_write("st_no_such_dir_91/x.safetensors", &ok, 1,
                                 NULL, 0, err, sizeof err),
                     HD_ERR_IO);
    ck_assert_ptr_nonnull(strstr(err, "st_no_such_dir_91"));
}
END_TEST

START_TEST(test_open_missing_path)
{
    char path[64], err[ERR_BYTES] = "";
    temp_name(path, sizeof path);
    hd_st_file f;
    ck_assert_int_eq(hd_st_open(path, &f, err, sizeof err), HD_ERR_IO);
    ck_assert_ptr_nonnull(strstr(err, path));
    ck_assert(all_zero(&f, sizeof f));
    hd_st_close(&f);
}
END_TEST

START_TEST(test_open_directory)
{
    char err[ERR_BYTES] = "";
    hd_st_file f;
    ck_assert_int_eq(hd_st_open(".", &f, err, sizeof err), HD_ERR_IO);
    ck_assert(err[0] != '\0');
    ck_assert(all_zero(&f, sizeof f));
}
END_TEST

START_TEST(test_open_empty_and_short_files)
{
    char path[64], err[ERR_BYTES] = "";
    snprintf(path, sizeof path, "st_test_XXXXXX");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    hd_st_file f;
    ck_assert_int_eq(hd_st_open(path, &f, err, sizeof err), HD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err, "short"));
    ck_assert(all_zero(&f, sizeof f));
    ck_assert_int_eq(write(fd, "\x02\0\0\0\0\0\0", 7), 7);
    ck_assert_int_eq(hd_st_open(path, &f, err, sizeof err), HD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err, "short"));
    close(fd);
    unlink(path);
}
END_TEST

START_TEST(test_open_malformed_file)
{
    /* A bad image on disk fails like in memory, and unmaps. */
    char path[64], err[ERR_BYTES] = "";
    snprintf(path, sizeof path, "st_test_XXXXXX");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    size_t len;
    unsigned char *b = image_n("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],"
                               "\"data_offsets\":[0,2]}}",
                               3, &len);
    ck_assert_int_eq(write(fd, b, len), (ssize_t)len);
    close(fd);
    hd_st_file f;
    ck_assert_int_eq(hd_st_open(path, &f, err, sizeof err), HD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err, "trailing"));
    ck_assert(all_zero(&f, sizeof f));
    unlink(path);
    free(b);
}
END_TEST

/* ------------------------------------------------------------------ */

static Suite *safetensors_suite(void)
{
    Suite *s = suite_create("safetensors");

    TCase *tc = tcase_create("valid");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_valid_u8_bf16_and_metadata);
    tcase_add_test(tc, test_valid_empty_header_object);
    tcase_add_test(tc, test_valid_zero_size_tensors_and_ties);
    tcase_add_test(tc, test_valid_other_dtypes_and_scalar);
    tcase_add_test(tc, test_close_on_zeroed_struct);
    suite_add_tcase(s, tc);

    tc = tcase_create("malformed");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_reject_empty_buffer);
    tcase_add_test(tc, test_reject_seven_bytes);
    tcase_add_test(tc, test_reject_header_length_zero);
    tcase_add_test(tc, test_reject_header_length_huge);
    tcase_add_test(tc, test_reject_invalid_utf8);
    tcase_add_test(tc, test_reject_not_json);
    tcase_add_test(tc, test_reject_json_array);
    tcase_add_test(tc, test_reject_truncated_json);
    tcase_add_test(tc, test_reject_deeply_nested_json);
    tcase_add_test(tc, test_reject_nul_in_header);
    tcase_add_test(tc, test_reject_duplicate_tensor_name);
    tcase_add_test(tc, test_reject_entry_not_object);
    tcase_add_test(tc, test_reject_extra_key_in_entry);
    tcase_add_test(tc, test_reject_missing_keys);
    tcase_add_test(tc, test_reject_unknown_dtype);
    tcase_add_test(tc, test_reject_dtype_not_string);
    tcase_add_test(tc, test_reject_data_offsets_missing);
    tcase_add_test(tc, test_reject_data_offsets_wrong_length);
    tcase_add_test(tc, test_reject_data_offsets_negative);
    tcase_add_test(tc, test_reject_data_offsets_fractional);
    tcase_add_test(tc, test_reject_data_offsets_reversed);
    tcase_add_test(tc, test_reject_data_offsets_past_end);
    tcase_add_test(tc, test_reject_data_offsets_overlapping);
    tcase_add_test(tc, test_reject_data_offsets_gap);
    tcase_add_test(tc, test_reject_data_offsets_not_starting_at_zero);
    tcase_add_test(tc, test_reject_trailing_bytes);
    tcase_add_test(tc, test_reject_shape_negative);
    tcase_add_test(tc, test_reject_shape_fractional);
    tcase_add_test(tc, test_reject_shape_too_many_dims);
    tcase_add_test(tc, test_reject_shape_product_overflow);
    tcase_add_test(tc, test_reject_size_mismatch);
    tcase_add_test(tc, test_reject_bad_names);
    tcase_add_test(tc, test_reject_metadata_not_object);
    tcase_add_test(tc, test_reject_metadata_non_string_value);
    tcase_add_test(tc, test_mutations_never_crash);
    tcase_add_test(tc, test_parse_null_arguments);
    suite_add_tcase(s, tc);

    tc = tcase_create("files");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_write_open_round_trip);
    tcase_add_test(tc, test_write_large_tensor_in_chunks);
    tcase_add_test(tc, test_write_rejects_bad_arguments);
    tcase_add_test(tc, test_write_into_missing_directory_fails);
    tcase_add_test(tc, test_open_missing_path);
    tcase_add_test(tc, test_open_directory);
    tcase_add_test(tc, test_open_empty_and_short_files);
    tcase_add_test(tc, test_open_malformed_file);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(safetensors_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
