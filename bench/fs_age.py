#!/usr/bin/env python3
"""Age a file system like compilebench: source trees unpacked, patched,
"built" (object files beside the sources), cleaned and deleted, round
after round, until about GIB GiB have been written. Deterministic (seed 7).

usage: fs_age.py MOUNTPOINT GIB [KEEP]
KEEP: source trees kept at most (default 12); older ones are deleted.
"""
import os
import random
import shutil
import sys

SIZES = [300, 1200, 2500, 4000, 7000, 12000, 30000, 90000]  # bytes, source-like


def unpack(r, root, name):
    """A tree of ~40 directories x ~30 files, like a small source package."""
    written = 0
    for d in range(40):
        sub = os.path.join(root, name, f"dir{d % 8}", f"sub{d}")
        os.makedirs(sub, exist_ok=True)
        for f in range(r.randint(10, 50)):
            n = r.choice(SIZES)
            with open(os.path.join(sub, f"file{f}.c"), "wb") as fh:
                fh.write(r.randbytes(n))
            written += n
    return written


def walk_files(path):
    for dirpath, _, files in os.walk(path):
        for name in files:
            yield os.path.join(dirpath, name)


def patch(r, tree):
    written = 0
    for p in list(walk_files(tree)):
        if p.endswith(".c") and r.random() < 0.15:
            with open(p, "ab") as fh:
                n = r.choice([200, 2000, 6000])
                fh.write(r.randbytes(n))
                written += n
    return written


def build(r, tree):
    written = 0
    for p in list(walk_files(tree)):
        if p.endswith(".c") and r.random() < 0.7:
            n = r.choice(SIZES) * 2
            with open(p[:-2] + ".o", "wb") as fh:
                fh.write(r.randbytes(n))
            written += n
    return written


def clean(tree):
    for p in list(walk_files(tree)):
        if p.endswith(".o"):
            os.remove(p)


def main(root, gib, keep=12):
    r = random.Random(7)
    goal = int(float(gib) * (1 << 30))
    written, n, live = 0, 0, []
    while written < goal:
        name = f"tree{n}"
        written += unpack(r, root, name)
        tree = os.path.join(root, name)
        written += patch(r, tree)
        written += build(r, tree)
        live.append(tree)
        if r.random() < 0.5:
            clean(tree)
        # Keep the file system part full: delete old trees past a few.
        while len(live) > keep:
            shutil.rmtree(live.pop(r.randrange(len(live) - 2)))
        for old in live[:-1]:
            if r.random() < 0.3:
                written += patch(r, old)
        n += 1
    print(f"aged: {n} trees unpacked, {len(live)} kept, {written / 2**30:.2f} GiB written")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 12)
