#!/usr/bin/python3
"""ckpt_h5py.py LLMC_FILE CKPT_FILE — read a pipelm checkpoint with h5py (Debian's
python3-h5py, an HDF5 reader independent of pipelm) and check it against the llm.c fp32 model
file it was converted from: the root attributes, /config, every dataset's name, shape, dtype,
contiguous layout and uint32 crc32c attribute (docs/formats.md section 2), that
attribute recomputed here with a pure-Python CRC-32C on a few small datasets, the parameter
values slice by slice, and zero AdamW moments. Exit 0 if all hold, 1 otherwise, 77 without h5py or numpy (the test fails on it).
"""
import re
import sys

try:
    import h5py
    import numpy as np
except ImportError as e:  # 77: the reader is missing (test_ckpt_ranks fails on it)
    print(f"ckpt_h5py: skipped ({e})")
    sys.exit(77)

BLOCK = ["ln1_w", "ln1_b", "qkv_w", "qkv_b", "attproj_w", "attproj_b",
         "ln2_w", "ln2_b", "fc_w", "fc_b", "fcproj_w", "fcproj_b"]


def shapes(V, Vp, maxT, L, C):
    """Checkpoint dataset name -> shape, and the llm.c file order of the 16 kinds."""
    per = {"ln1_w": (C,), "ln1_b": (C,), "qkv_w": (3 * C, C), "qkv_b": (3 * C,),
           "attproj_w": (C, C), "attproj_b": (C,), "ln2_w": (C,), "ln2_b": (C,),
           "fc_w": (4 * C, C), "fc_b": (4 * C,), "fcproj_w": (C, 4 * C), "fcproj_b": (C,)}
    out = {"wte": (Vp, C), "wpe": (maxT, C), "lnf_w": (C,), "lnf_b": (C,)}
    for i in range(L):
        for k in BLOCK:
            out[f"h.{i}/{k}"] = per[k]
    order = [("wte", (Vp, C), False), ("wpe", (maxT, C), False)]
    order += [(k, per[k], True) for k in BLOCK]
    order += [("lnf_w", (C,), False), ("lnf_b", (C,), False)]
    return out, order


def _crc32c_table():
    """The byte table of the reflected CRC-32C polynomial 0x82F63B78."""
    table = []
    for b in range(256):
        c = b
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


CRC_TABLE = _crc32c_table()


def crc32c(data):
    """CRC-32C (Castagnoli: init and final xor 0xFFFFFFFF), one byte at a time (slow; small data)."""
    c = 0xFFFFFFFF
    for b in data:
        c = (c >> 8) ^ CRC_TABLE[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    llmc, ckpt = sys.argv[1], sys.argv[2]
    fails = []

    def check(ok, what):
        if not ok:
            fails.append(what)

    head = np.fromfile(llmc, dtype="<i4", count=256)
    if head[0] != 20240326 or head[1] != 3:
        print(f"ckpt_h5py: {llmc} is not an llm.c fp32 model file")
        return 1
    maxT, V, L, NH, C, Vp = (int(x) for x in head[2:8])
    data = np.fromfile(llmc, dtype="<f4", offset=1024)
    names, order = shapes(V, Vp, maxT, L, C)

    with h5py.File(ckpt, "r") as f:
        a = f.attrs
        check(text(a.get("format", "")) == "pipelm-checkpoint", "root attr format")
        check(int(a.get("format_version", -1)) == 1, "root attr format_version")
        check(len(text(a.get("pipelm_version", ""))) > 0, "root attr pipelm_version")
        check(int(a.get("step", -1)) == 0, "root attr step (a converted file is at step 0)")
        check(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", text(a.get("created", ""))) is not None,
              "root attr created (ISO 8601 UTC)")
        cfg = f["config"].attrs
        want = {"vocab_size": V, "padded_vocab_size": Vp, "max_seq_len": maxT, "n_layer": L,
                "n_head": NH, "n_embd": C}
        for k, v in want.items():
            check(int(cfg.get(k, -1)) == v, f"/config {k}")
        check(text(f["optim"].attrs.get("name", "")) == "adamw", "/optim name")
        for k in ("beta1", "beta2", "eps", "weight_decay", "lr", "step"):
            check(k in f["optim"].attrs, f"/optim attr {k}")
        for k in ("step", "tokens_seen", "data_pos", "seed", "data_seed", "lr_schedule", "split", "nstages"):
            check(k in f["train"].attrs, f"/train attr {k}")

        # every dataset: present, fp32, the schema's shape, contiguous, unfiltered, a uint32 crc32c
        check(crc32c(b"123456789") == 0xE3069283, "the Python CRC-32C's check value")
        count = 0
        for sec in ("model", "optim/m", "optim/v"):
            for name, shape in names.items():
                path = f"/{sec}/{name}"
                if path not in f:
                    fails.append(f"{path} missing")
                    continue
                d = f[path]
                count += 1
                check(d.shape == shape, f"{path} shape {d.shape} != {shape}")
                check(d.dtype == np.float32, f"{path} dtype {d.dtype}")
                check(d.chunks is None and not d.fletcher32 and d.compression is None,
                      f"{path} is not contiguous and unfiltered")
                crc = d.attrs.get("crc32c")
                check(crc is not None and np.asarray(crc).dtype == np.uint32 and np.asarray(crc).shape == (),
                      f"{path} has no scalar uint32 crc32c attribute")
                if sec != "model":
                    check(not np.any(d[...]), f"{path} moments not zero")

        # values against the llm.c file, kind by kind (block kinds hold all layers in a row)
        off = 0
        for kind, shape, block in order:
            n = int(np.prod(shape))
            for i in range(L if block else 1):
                ref = data[off:off + n].reshape(shape)
                off += n
                path = f"/model/h.{i}/{kind}" if block else f"/model/{kind}"
                if path in f:
                    check(np.array_equal(f[path][...], ref), f"{path} values differ from the llm.c file")
        check(off == data.size, "llm.c file size")

        # the crc32c attribute of a few small datasets, recomputed from their little-endian bytes
        ncrc = 0
        for path in ("/model/lnf_w", "/model/h.0/qkv_b", "/model/wpe", f"/model/h.{L - 1}/ln2_b", "/optim/v/lnf_b"):
            if path in f and "crc32c" in f[path].attrs:
                raw = np.ascontiguousarray(f[path][...], dtype="<f4").tobytes()
                want = int(f[path].attrs["crc32c"])
                got = crc32c(raw)
                check(got == want, f"{path}: crc32c attribute 0x{want:08x} but the bytes give 0x{got:08x}")
                ncrc += 1
        check(ncrc == 5, "crc32c recomputed on 5 datasets")

    if fails:
        print(f"ckpt_h5py: {len(fails)} problem(s): " + "; ".join(fails[:10]))
        return 1
    print(f"ckpt_h5py: h5py {h5py.version.version} read {count} contiguous datasets; names, shapes, "
          f"attributes and values match {llmc}; crc32c recomputed on {ncrc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
