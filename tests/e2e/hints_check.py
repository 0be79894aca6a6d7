#!/usr/bin/env python3
"""Checks for tests/e2e/hints.sh.

truth DEV CLASSIFY_JSON E2IMAGE: the classifier's runs against e2image's
metadata (its nonzero blocks), read from the unmounted device DEV; prints
precision per kind and recall, exits 1 below 99% (static) or 95% (the rest).

placement CLASSIFY_JSON MAP_JSON DEVICE: share of the mapped 4 KiB blocks
of the moved kinds that lie on pool device DEVICE, in percent.

datablock CLASSIFY_JSON MAP_JSON: byte offset of a mapped 4 KiB block that
holds no metadata of any kind (file data).
"""
import json
import sys

MOVED = {"static", "directory", "tree", "xattr", "symlink"}
BS = 4096


def nonzero_blocks(path, ranges, bs):
    out = set()
    with open(path, "rb") as f:
        for off, length in ranges:
            f.seek(off)
            data = f.read(length)
            for i in range(0, len(data), bs):
                if any(data[i:i + bs]):
                    out.add((off + i) // bs)
    return out


def truth(dev, classify_json, e2image):
    c = json.load(open(classify_json))
    bs = c["block_size"]
    import os
    size = os.path.getsize(e2image)
    theirs = nonzero_blocks(e2image, [(0, size)], bs)
    ours_by_kind = {}
    for off, length, kind in c["runs"]:
        if kind == "backup":
            continue
        ours_by_kind.setdefault(kind, []).append((off, length))
    ours = set()
    ok = True
    for kind, ranges in sorted(ours_by_kind.items()):
        mine = nonzero_blocks(dev, ranges, bs)
        ours |= mine
        if not mine:
            continue
        precision = len(mine & theirs) / len(mine)
        need = 0.99 if kind == "static" else 0.95
        ok &= precision >= need
        print(f"  {kind:10} {len(mine):7} nonzero blocks, precision {precision:.4f} (need {need})")
    recall = len(ours & theirs) / max(1, len(theirs))
    print(f"  recall {recall:.4f} of e2image's {len(theirs)} nonzero metadata blocks (need 0.95)")
    ok &= recall >= 0.95
    missed = sorted(theirs - ours)[:10]
    if missed:
        print(f"  first missed blocks: {missed}")
    return 0 if ok else 1


def placement(classify_json, map_json, device):
    c = json.load(open(classify_json))
    runs = json.load(open(map_json))
    meta = set()
    for off, length, kind in c["runs"]:
        if kind in MOVED:
            meta.update(range(off // BS, (off + length + BS - 1) // BS))
    on, total = 0, 0
    for lba, length, dev, _block in runs:
        for b in range(lba, lba + length):
            if b in meta:
                total += 1
                on += dev == device
    print(f"{100.0 * on / max(1, total):.2f} {total}")
    return 0


def datablock(classify_json, map_json):
    c = json.load(open(classify_json))
    meta = set()
    for off, length, _kind in c["runs"]:
        meta.update(range(off // BS, (off + length + BS - 1) // BS))
    for lba, length, _dev, _block in json.load(open(map_json)):
        for b in range(lba, lba + length):
            if b not in meta:
                print(b * BS)
                return 0
    return 1


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "datablock":
        sys.exit(datablock(sys.argv[2], sys.argv[3]))
    if cmd == "truth":
        sys.exit(truth(*sys.argv[2:5]))
    sys.exit(placement(sys.argv[2], sys.argv[3], int(sys.argv[4])))
