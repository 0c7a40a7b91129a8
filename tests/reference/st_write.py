"""Hugging Face checkpoints for the tests, written from the format's definition (independent of
pipelm): a safetensors file is 8 bytes of little-endian header length N, N bytes of JSON
({name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, padded
with spaces), then the raw little-endian tensors. Sharded models add
model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map": {name: file}}).

permute_rotate_half() is what Hugging Face's convert_llama_weights_to_hf.py does to q_proj and
k_proj: each head's rows (pairs 2i, 2i+1 of Meta's interleaved RoPE) regrouped into the two
halves rotate-half RoPE expects.
"""

import json
import os

import numpy as np

DTYPES = ("F32", "BF16", "F16")


def bf16_bits(a):
    """fp32 -> bf16 bit patterns, round to nearest even."""
    u = np.ascontiguousarray(a, dtype="<f4").view("<u4").astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype("<u2")


def round_to(a, dtype):
    """The float64 values an array holds after storing it as dtype."""
    if dtype == "F32":
        return np.asarray(a, dtype=np.float32).astype(np.float64)
    if dtype == "F16":
        return np.asarray(a, dtype=np.float16).astype(np.float64)
    return (bf16_bits(a).astype(np.uint32) << 16).view("<f4").astype(np.float64)


def raw_bytes(a, dtype):
    if dtype == "F32":
        return np.ascontiguousarray(a, dtype="<f4").tobytes()
    if dtype == "F16":
        return np.ascontiguousarray(a, dtype="<f2").tobytes()
    return bf16_bits(a).tobytes()


def write_safetensors(path, tensors, dtype="F32", metadata=None):
    """tensors: list of (name, array) in data order."""
    header, blobs, off = {}, [], 0
    for name, a in tensors:
        b = raw_bytes(a, dtype)
        header[name] = {"dtype": dtype, "shape": list(np.shape(a)), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


def write_model_dir(d, config, tensors, dtype="F32", shard_bytes=0):
    """config.json and model.safetensors, or shards of at most shard_bytes with an index."""
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    if not shard_bytes:
        write_safetensors(os.path.join(d, "model.safetensors"), tensors, dtype, {"format": "pt"})
        return
    esz = 4 if dtype == "F32" else 2
    shards, cur, size = [], [], 0
    for name, a in tensors:
        n = int(np.prod(np.shape(a))) * esz
        if cur and size + n > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append((name, a))
        size += n
    shards.append(cur)
    wm, total = {}, 0
    for i, s in enumerate(shards):
        fn = "model-%05d-of-%05d.safetensors" % (i + 1, len(shards))
        write_safetensors(os.path.join(d, fn), s, dtype, {"format": "pt"})
        for name, a in s:
            wm[name] = fn
            total += int(np.prod(np.shape(a))) * esz
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2)


def permute_rotate_half(w, n_heads):
    """Hugging Face's permute(): (n_heads * hs, C) rows per head from interleaved pairs to halves."""
    rows, cols = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def read_safetensors(path):
    """{name: (dtype, shape, raw bytes)} and the metadata, for byte comparisons."""
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    h = json.loads(raw[8:8 + n])
    meta = h.pop("__metadata__", None)
    data = raw[8 + n:]
    return {k: (v["dtype"], tuple(v["shape"]), data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in h.items()}, meta
