#!/usr/bin/env python3
# Writes the seed corpora of the fuzz targets into fuzz/corpus/<target>/: a few small valid and invalid inputs per
# target, built here from the formats' definitions (docs/reliability.md, "Fuzzing the parsers"). Deterministic: run it
# again and the files come out the same (gzip with mtime 0). Keep the total under 100 KiB.
import gzip
import json
import os
import struct
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def gz(data):
    return gzip.compress(data, compresslevel=9, mtime=0)


# --- safetensors: u64 LE header length, JSON header, byte buffer -------------------------------------------------
def safetensors(tensors, metadata=None, pad=True):
    header, buf = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(buf), len(buf) + len(data)]}
        buf += data
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + buf


f32 = lambda *v: struct.pack("<%df" % len(v), *v)
valid = safetensors([("w", "F32", [2, 2], f32(1, 2, 3, 4)), ("b", "I64", [2], struct.pack("<2q", -1, 7)),
                     ("mask", "BOOL", [3], b"\x01\x00\x01")], {"format": "pt", "step": "3"})
put("safetensors", "valid_three", valid)
put("safetensors", "valid_all_dtypes", safetensors([
    ("a", "F64", [1], struct.pack("<d", 0.5)), ("b", "F16", [2], b"\x00\x3c\x00\xc0"), ("c", "BF16", [1], b"\x80\x3f"),
    ("d", "I32", [1, 1], struct.pack("<i", -3)), ("e", "U8", [4], b"\x00\x7f\x80\xff"), ("f", "F32", [0, 3], b""),
    ("g", "F32", [], f32(9))]))
put("safetensors", "valid_empty", safetensors([]))
put("safetensors", "bad_overlap", valid[:8] + valid[8:].replace(b'"data_offsets":[16,32]', b'"data_offsets":[8,24]'))
put("safetensors", "bad_truncated", valid[:-3])
put("safetensors", "bad_header_len", struct.pack("<Q", 1 << 40) + valid[8:])
put("safetensors", "bad_dtype", safetensors([("x", "F8_E4M3", [1], b"\x00")]))
put("safetensors", "bad_bool", safetensors([("m", "BOOL", [2], b"\x00\x02")]))
deep = b'{"t":{"dtype":"F32","shape":' + b"[" * 20 + b"]" * 20 + b',"data_offsets":[0,0]}}'
put("safetensors", "bad_deep_nesting", struct.pack("<Q", len(deep)) + deep)
dup = b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
put("safetensors", "bad_duplicate_key", struct.pack("<Q", len(dup)) + dup + b"\x07")

# --- IDX (first byte: bit 0 labels, bit 1 gzip) --------------------------------------------------------------------
def idx_images(n, rows, cols, pixels):
    return struct.pack(">IIII", 0x803, n, rows, cols) + bytes(pixels)


def idx_labels(labels):
    return struct.pack(">II", 0x801, len(labels)) + bytes(labels)


images = idx_images(2, 3, 4, range(24))
labels = idx_labels([7, 3])
put("idx", "images_raw", b"\x00" + images)
put("idx", "labels_raw", b"\x01" + labels)
put("idx", "images_gz", b"\x02" + gz(images))
put("idx", "labels_gz", b"\x03" + gz(labels))
put("idx", "images_gz_two_members", b"\x02" + gz(images[:10]) + gz(images[10:]))
put("idx", "images_empty_set", b"\x00" + idx_images(0, 28, 28, []))
put("idx", "bad_trailing", b"\x00" + images + b"xy")
put("idx", "bad_truncated_gz", b"\x02" + gz(images)[:-6])
put("idx", "bad_huge_dims", b"\x00" + struct.pack(">IIII", 0x803, 0xFFFFFFFF, 0xFFFFFFFF, 9))
put("idx", "bad_gz_bomb_header", b"\x03" + gz(struct.pack(">II", 0x801, 0x7FFFFFFF)))
put("idx", "bad_magic", b"\x01" + images)

# --- CIFAR-10: records of 1 label byte + 3072 pixel bytes -----------------------------------------------------------
rec = lambda label, seed: bytes([label]) + bytes((seed * 7 + i) % 256 for i in range(3072))
put("cifar", "two_records", rec(3, 1) + rec(9, 2))
put("cifar", "bad_label", rec(10, 1))
put("cifar", "bad_partial", rec(1, 1)[:100])

# --- trace (first byte: bit 0 parse_trace_text, else read_trace_jsonl) ----------------------------------------------
ev = lambda **kw: json.dumps(kw, separators=(",", ":"))
lines = "\n".join([
    ev(action="alloc", id=1, size=1024, stream=0, block_size=1024, addr=4096, time_ns=10, allocated=1024,
       reserved=2097152, tag="model.fc1/forward"),
    ev(action="annotate", id=0, size=0, stream=0, note="step 1"),
    ev(action="free", id=1, size=1024, stream=0),
    ev(action="segment_alloc", id=0, size=2097152, stream=0, addr=4096),
    ev(action="oom", id=0, size=1 << 40, stream=1, allocated=0, reserved=2097152),
    ev(action="empty_cache", id=0, size=0, stream=0)]) + "\n"
put("trace", "jsonl_lines", b"\x00" + lines.encode())
put("trace", "jsonl_as_file", b"\x01" + lines.encode())
chrome = {"traceEvents": [{"name": "memory", "ph": "C", "ts": 0, "pid": 1, "tid": 1, "args": {"allocated": 0}}],
          "displayTimeUnit": "ns",
          "emberEvents": [json.loads(l) for l in lines.splitlines()],
          "otherData": {"alloc_conf": "expandable_segments:True,max_split_size_mb:128", "allocator": "cpu"}}
put("trace", "chrome", b"\x01" + json.dumps(chrome).encode())
put("trace", "bad_missing_key", b"\x00" + ev(action="alloc", id=1, size=3).encode() + b"\n")
put("trace", "bad_action", b"\x01" + ev(action="explode", id=1, size=3, stream=0).encode())
put("trace", "bad_negative", b"\x00" + ev(action="alloc", id=1, size=-3, stream=0).encode())
put("trace", "bad_chrome_conf", b"\x01" + json.dumps({"emberEvents": [], "otherData": {"alloc_conf": "bogus:1"}}).encode())
put("trace", "bad_nesting", b"\x01" + b"[" * 200 + b"]" * 200)

# --- EMBER_ALLOC_CONF strings ----------------------------------------------------------------------------------------
for i, s in enumerate(["max_split_size_mb:128,garbage_collection_threshold:0.8",
                       "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
                       "expandable_segments:False,capacity:6GiB,per_process_memory_fraction:0.5",
                       "pinned_use_cuda_host_register:True,pinned_num_register_threads:8,backend:native",
                       "roundup_power2_divisions:4,", "max_split_size_mb:10", "backend:cudaMallocAsync",
                       "capacity:1.5 GB", "roundup_power2_divisions:[>:2,8:1]", "garbage_collection_threshold:1e-3"]):
    put("alloc_conf", "conf_%02d" % i, s)

# --- byte sizes ----------------------------------------------------------------------------------------------------
for i, s in enumerate(["4096", "512MiB", "1.5 GB", "6gib", " 2 TB ", "0.0001KB", "9223372036854775807",
                       "9223372036854775808", "-1", "12 parsecs", "1.2.3", "7B"]):
    put("bytes", "size_%02d" % i, s)

total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(ROOT) for f in fs)
print("fuzz corpora: %d bytes" % total, file=sys.stderr)
