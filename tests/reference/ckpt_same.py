#!/usr/bin/python3
"""ckpt_same.py A B — are two pipelm checkpoints the same save? Read with h5py (an HDF5 reader
independent of pipelm): the same groups and datasets, every dataset's dtype, shape and bytes,
and every attribute of every object, except the root's `created` (the time of the save) and
`meta_crc32c` (the CRC of the metadata text, which holds `created`; `pipelm inspect` checks
it). Exit 0 if they agree, 1 with the differences, 77 (skip) without h5py or numpy.
"""
import sys

try:
    import h5py
    import numpy as np
except ImportError as e:  # the test treats 77 as "skipped"
    print(f"ckpt_same: skipped ({e})")
    sys.exit(77)

SKIP = {("/", "created"), ("/", "meta_crc32c")}


def objects(f):
    """Every object's path -> the object (the root included)."""
    out = {"/": f}
    f.visititems(lambda name, obj: out.__setitem__("/" + name, obj))
    return out


def attrs_differ(path, a, b, diffs):
    """Attributes of one object, except the skipped ones."""
    ka = {k for k in a.attrs if (path, k) not in SKIP}
    kb = {k for k in b.attrs if (path, k) not in SKIP}
    if ka != kb:
        diffs.append(f"{path}: attributes {sorted(ka ^ kb)} in one file only")
    for k in sorted(ka & kb):
        va, vb = np.asarray(a.attrs[k]), np.asarray(b.attrs[k])
        if va.dtype != vb.dtype or va.shape != vb.shape or va.tobytes() != vb.tobytes():
            diffs.append(f"{path}: attribute {k}: {va!r} != {vb!r}")


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    diffs = []
    with h5py.File(sys.argv[1], "r") as fa, h5py.File(sys.argv[2], "r") as fb:
        oa, ob = objects(fa), objects(fb)
        if set(oa) != set(ob):
            diffs.append(f"objects in one file only: {sorted(set(oa) ^ set(ob))[:10]}")
        for p in sorted(set(oa) & set(ob)):
            a, b = oa[p], ob[p]
            if isinstance(a, h5py.Dataset) != isinstance(b, h5py.Dataset):
                diffs.append(f"{p}: a dataset in one file, a group in the other")
                continue
            attrs_differ(p, a, b, diffs)
            if isinstance(a, h5py.Dataset):
                if a.dtype != b.dtype or a.shape != b.shape:
                    diffs.append(f"{p}: {a.dtype}{a.shape} != {b.dtype}{b.shape}")
                elif a[()].tobytes() != b[()].tobytes():
                    diffs.append(f"{p}: the data differ")
        n = len(oa)
    for d in diffs[:20]:
        print("ckpt_same: " + d)
    if diffs:
        print(f"ckpt_same: {len(diffs)} difference(s)")
        return 1
    print(f"ckpt_same: {n} objects agree (all but /created and /meta_crc32c)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
