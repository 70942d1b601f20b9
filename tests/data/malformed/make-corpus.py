#!/usr/bin/env python3
"""Writes the malformed-file corpus of tests/data/malformed and its MANIFEST.

One small file per failure class of a safetensors weight file.  The files
are committed; this script documents how each was made (run it from this
folder to regenerate them).  Model-level classes that need a whole model
(about 49 MB for pattern "M", E 8) are not files here: tests/test_corpus.c
generates them at test time.

MANIFEST columns: file, status of the raw parser (hd_st_open), status of
hd_model_load, and the rest of the line: text that both messages (or the
failing one) contain.
"""
import json
import struct

entries = []


def emit(name, data, st, model, word):
    with open(name, "wb") as f:
        f.write(data)
    entries.append((name, st, model, word))


def st(header, data=b"", hlen=None):
    h = header.encode() if isinstance(header, str) else header
    n = len(h) if hlen is None else hlen
    return struct.pack("<Q", n) + h + data


def one(entry, data=b"", name="x"):
    return st(json.dumps({name: entry}), data)


F = "FORMAT"
T2 = {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}

# --- the file and its length field
emit("empty.st", b"", F, F, "short")
emit("short-7.st", b"\x02\0\0\0\0\0\0", F, F, "short")
emit("hlen-zero.st", st("", hlen=0) + b"{}", F, F, "length is 0")
emit("hlen-huge.st", st("{}", hlen=1 << 62), F, F, "exceeds")
emit("hlen-max.st", st("{}", hlen=(1 << 64) - 1), F, F, "exceeds")
# 8 + hlen wraps to 0 (mod 2^64)
emit("hlen-wrap.st", st("{}", hlen=(1 << 64) - 8), F, F, "exceeds")
emit("hlen-past-end.st", st("{}", hlen=64), F, F, "exceeds")
emit("hlen-limit.st", st("{}", hlen=(100 << 20) + 1), F, F, "exceeds")

# --- the header text
emit("header-not-utf8.st", st(b'{"\xff\xfe":{}}'), F, F, "JSON")
emit("header-overlong-utf8.st", st(b'{"\xc0\xaf":{}}'), F, F, "JSON")
emit("header-nul.st", st(b'{"a\0":1}'), F, F, "NUL")
emit("header-not-json.st", st("hello"), F, F, "JSON")
emit("header-array.st", st("[]"), F, F, "object")
emit("header-string.st", st('"x"'), F, F, "JSON")
emit("header-number.st", st("1"), F, F, "JSON")
emit("header-truncated.st", st('{"x":{"dtype":"BF16","sha'), F, F, "JSON")
emit("header-trailing-garbage.st", st("{}x"), F, F, "JSON")
emit("header-deep-arrays.st", st("[" * 100000), F, F, "nests")
emit("header-deep-objects.st", st('{"a":' * 5000 + "1" + "}" * 5000),
     F, F, "nests")
emit("header-duplicate-key.st",
     st('{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
        '"x":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"ab"),
     F, F, "JSON")
emit("header-nan-number.st", st('{"x":{"dtype":"U8","shape":[NaN],'
                                '"data_offsets":[0,0]}}'), F, F, "JSON")

# --- entries
emit("entry-not-object.st", one(5), F, F, "not a JSON object")
emit("entry-unknown-key.st",
     one({"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "z": 1}, b"a"),
     F, F, "unexpected key")
emit("name-empty.st", one(T2, b"abcd", name=""), F, F, "empty tensor name")
emit("name-too-long.st", one(T2, b"abcd", name="n" * 300), F, F, "long")
emit("metadata-not-object.st", st('{"__metadata__":[1]}'), F, F, "__metadata__")
emit("metadata-value-number.st", st('{"__metadata__":{"k":1}}'), F, F,
     "not a string")

# --- dtype
emit("dtype-unknown.st", one({"dtype": "Q7", "shape": [1],
                              "data_offsets": [0, 1]}, b"a"), F, F,
     "unknown dtype")
emit("dtype-lowercase.st", one({"dtype": "bf16", "shape": [2],
                                "data_offsets": [0, 4]}, b"abcd"), F, F,
     "unknown dtype")
emit("dtype-not-string.st", one({"dtype": 16, "shape": [2],
                                 "data_offsets": [0, 4]}, b"abcd"), F, F,
     "dtype is not a string")
emit("dtype-missing.st", one({"shape": [2], "data_offsets": [0, 4]}, b"abcd"),
     F, F, "missing dtype")

# --- data_offsets
def offs(o, data=b"abcd"):
    return one({"dtype": "BF16", "shape": [2], "data_offsets": o}, data)


emit("offsets-missing.st", one({"dtype": "BF16", "shape": [2]}, b"abcd"),
     F, F, "missing data_offsets")
emit("offsets-length-1.st", offs([0]), F, F, "data_offsets")
emit("offsets-length-3.st", offs([0, 4, 4]), F, F, "data_offsets")
emit("offsets-not-array.st", offs("0-4"), F, F, "data_offsets")
emit("offsets-negative.st", offs([-4, 0]), F, F, "non-negative")
emit("offsets-fractional.st", offs([0, 4.0]), F, F, "non-negative")
emit("offsets-string.st", offs(["0", "4"]), F, F, "non-negative")
emit("offsets-reversed.st", offs([4, 0]), F, F, "reversed")
emit("offsets-past-end.st", offs([0, 4], b"ab"), F, F, "past the end")
emit("offsets-huge.st", offs([0, (1 << 63) - 1]), F, F, "past the end")
emit("offsets-int-overflow.st", st('{"x":{"dtype":"BF16","shape":[2],'
                                   '"data_offsets":[0,18446744073709551620]}}',
                                   b"abcd"), F, F, "JSON")
emit("offsets-size-mismatch.st", offs([0, 3], b"abc"), F, F, "need 4 bytes")
two = {"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
       "b": {"dtype": "BF16", "shape": [2], "data_offsets": [2, 6]}}
emit("offsets-overlap.st", st(json.dumps(two), b"abcdef"), F, F, "overlap")
two["b"]["data_offsets"] = [6, 10]
emit("offsets-gap.st", st(json.dumps(two), b"abcdefghij"), F, F, "gap")
two["b"]["data_offsets"] = [0, 4]
emit("offsets-alias.st", st(json.dumps(two), b"abcd"), F, F, "overlap")

# --- shapes
def shape(s, o=(0, 4), dtype="BF16", data=b"abcd"):
    return one({"dtype": dtype, "shape": s, "data_offsets": list(o)}, data)


emit("shape-negative.st", shape([-2]), F, F, "non-negative")
emit("shape-fractional.st", shape([2.0]), F, F, "non-negative")
emit("shape-not-array.st", shape(2), F, F, "shape is not an array")
emit("shape-missing.st", one({"dtype": "BF16", "data_offsets": [0, 4]},
                             b"abcd"), F, F, "missing shape")
emit("shape-too-many-dims.st", shape([1] * 9), F, F, "dimensions")
# 2^32 * 2^32 = 2^64: the product wraps to zero
emit("shape-wraps-to-zero.st", shape([1 << 32, 1 << 32], (0, 0), data=b""),
     F, F, "overflows")
emit("shape-overflow.st", shape([1 << 40, 1 << 40, 3], (0, 0), data=b""),
     F, F, "overflows")
# elements fit, bytes (x2) wrap to zero
emit("shape-bytes-wrap.st", shape([1 << 62, 2], (0, 0), data=b""), F, F,
     "overflows")
emit("shape-mismatch.st", shape([3]), F, F, "need 6 bytes")
emit("shape-sub-byte.st", shape([3], (0, 2), dtype="F4", data=b"ab"), F, F,
     "whole number of bytes")

# --- data
emit("data-truncated.st", offs([0, 4], b"abc"), F, F, "past the end")
emit("data-trailing.st", offs([0, 4], b"abcdef"), F, F, "trailing")
emit("data-trailing-no-tensors.st", st("{}", b"zz"), F, F, "trailing")

# --- valid safetensors, not a model of the motif
emit("model-no-tensors.st", st("{}"), "OK", "MODEL", "blocks.0.attn_norm")
emit("model-unrelated-tensor.st", offs([0, 4]), "OK", "MODEL",
     "blocks.0.attn_norm")
emit("model-neither-kind.st",
     one({"dtype": "BF16", "shape": [2304], "data_offsets": [0, 4608]},
         bytes(4608), name="blocks.0.attn_norm"), "OK", "MODEL", "neither")
emit("model-router-missing.st",
     st(json.dumps({
         "blocks.0.attn_norm": {"dtype": "BF16", "shape": [2304],
                                "data_offsets": [0, 4608]},
         "blocks.0.attn.kv_a.w_q": {"dtype": "U8", "shape": [1],
                                    "data_offsets": [4608, 4609]}}),
        bytes(4609)), "OK", "MODEL", "router")
emit("model-router-7-experts.st",
     st(json.dumps({
         "blocks.0.attn_norm": {"dtype": "BF16", "shape": [2304],
                                "data_offsets": [0, 4608]},
         "blocks.0.attn.kv_a.w_q": {"dtype": "U8", "shape": [1],
                                    "data_offsets": [4608, 4609]},
         "blocks.0.moe.router.weight": {"dtype": "BF16", "shape": [7, 2304],
                                        "data_offsets": [4609, 4609 + 7 * 4608]}}),
        bytes(4609 + 7 * 4608)), "OK", "MODEL", "experts")
emit("model-router-f32.st",
     st(json.dumps({
         "blocks.0.attn_norm": {"dtype": "BF16", "shape": [2304],
                                "data_offsets": [0, 4608]},
         "blocks.0.attn.kv_a.w_q": {"dtype": "U8", "shape": [1],
                                    "data_offsets": [4608, 4609]},
         "blocks.0.moe.router.weight": {"dtype": "F32", "shape": [8, 1],
                                        "data_offsets": [4609, 4609 + 32]}}),
        bytes(4609 + 32)), "OK", "MODEL", "F32")

with open("MANIFEST", "w") as f:
    f.write("# file  hd_st_open  hd_model_load  word-in-message\n")
    f.write("# Generated by make-corpus.py; test_corpus.c replays every line\n")
    f.write("# and fails on a file not listed here.\n")
    for e in entries:
        f.write("%s %s %s %s\n" % e)
