#!/usr/bin/env python3
"""The placement issue's real workload: ext4 on a tarn volume aged over
simulated days, then each file's blocks mapped through the volume map.

    ext4_days.py age MNT DAYS DAY_SECS LOG -- SNAPSHOT-COMMAND...
        Day after day: unpack a source tree (bench/fs_age.py), edit some
        files of older trees, delete the oldest tree, rewrite the large
        files (some whole, some in part); sync; run SNAPSHOT-COMMAND with
        {day} replaced; pad the day to DAY_SECS seconds (so a replay's
        --snapshot-every DAY_SECS snapshots at the same points). LOG gets
        which files were written on which day (JSON).
    ext4_days.py files MNT LOG EXPORT OUT
        Every regular file's extents (filefrag, 4 KiB blocks = volume
        blocks) as the replay's --files list; `rewritten`: a file that
        existed at a snapshot and was written after it.
    ext4_days.py seeks FILES MAP
        Seeks per file read in order, measured on the live volume: the
        file's blocks mapped through MAP (`tarn vol map VOL --json`), a
        seek at every physical discontiguity; over all files and over the
        rewritten ones. Prints JSON.
Deterministic (seed 11) but for what ext4 itself decides."""
import bisect
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fs_age  # noqa: E402

LARGE = 6  # large files, 4-32 MiB, rewritten over the days
KEEP_TREES = 4


def write_large(r, path, size, whole):
    """Rewrite a large file whole, or 1-8 pieces of 64 KiB-1 MiB in place."""
    if whole or not os.path.exists(path):
        with open(path, "wb") as fh:
            fh.write(r.randbytes(size))
        return
    with open(path, "r+b") as fh:
        for _ in range(r.randint(1, 8)):
            n = r.choice([64, 256, 1024]) << 10
            fh.seek(r.randrange(0, max(1, size - n)) // 4096 * 4096)
            fh.write(r.randbytes(n))


def age(mnt, days, day_secs, log_path, snapshot):
    r = random.Random(11)
    written = {}  # path -> days written
    trees = []
    sizes = [r.choice([4, 8, 16, 32]) << 20 for _ in range(LARGE)]
    for day in range(1, days + 1):
        start = time.monotonic()
        before = {p: set(fs_age.walk_files(p)) if os.path.isdir(p) else set() for p in trees}
        name = f"tree{day}"
        fs_age.unpack(r, mnt, name)
        trees.append(os.path.join(mnt, name))
        touched = set(fs_age.walk_files(trees[-1]))
        for old in trees[:-1]:
            for p in before.get(old, ()):
                if os.path.exists(p) and r.random() < 0.1:
                    with open(p, "ab") as fh:
                        fh.write(r.randbytes(r.choice([200, 2000, 6000])))
                    touched.add(p)
        while len(trees) > KEEP_TREES:
            shutil.rmtree(trees.pop(0))
        os.makedirs(os.path.join(mnt, "large"), exist_ok=True)
        for i, size in enumerate(sizes):
            if day == 1 or r.random() < 0.6:
                p = os.path.join(mnt, "large", f"big{i}.dat")
                write_large(r, p, size, whole=day == 1 or r.random() < 0.3)
                touched.add(p)
        for p in touched:
            written.setdefault(p, []).append(day)
        os.sync()
        subprocess.run([a.replace("{day}", str(day)) for a in snapshot], check=True, stdout=subprocess.DEVNULL)
        left = day_secs - (time.monotonic() - start)
        print(f"day {day}: {len(touched)} files written, {time.monotonic() - start:.1f} s", flush=True)
        if left > 0:
            time.sleep(left)
    json.dump(written, open(log_path, "w"))


EXTENT = re.compile(r"^\s*\d+:\s+(\d+)\.\.\s*(\d+):\s+(\d+)\.\.\s*(\d+):\s+(\d+):")


def file_extents(path):
    out = subprocess.run(["filefrag", "-e", "-b4096", path], capture_output=True, text=True, check=True).stdout
    runs = []
    for line in out.splitlines():
        m = EXTENT.match(line)
        if m:
            runs.append((int(m.group(3)) * 4096, int(m.group(5)) * 4096))
    return runs


def files(mnt, log_path, export, out_path):
    written = json.load(open(log_path))
    out = []
    for dirpath, _, names in os.walk(mnt):
        if "lost+found" in dirpath:
            continue
        for n in names:
            p = os.path.join(dirpath, n)
            ext = file_extents(p)
            if not ext:
                continue  # empty or inline
            days = written.get(p, [])
            # Snapshots are taken at each day's end: a file written on a
            # day after the one it first appeared was rewritten after one.
            rewritten = len(days) > 1
            out.append({"export": export, "path": p, "extents": ext, "rewritten": rewritten})
    json.dump(out, open(out_path, "w"))
    print(f"{len(out)} files, {sum(f['rewritten'] for f in out)} rewritten after a snapshot")


def seeks(files_path, map_path):
    runs = sorted(tuple(r) for r in json.load(open(map_path)))  # [lba, len, device, block]
    starts = [r[0] for r in runs]

    def physical(lba, n):
        """Physical runs of volume blocks [lba, lba+n) in logical order."""
        i = max(0, bisect.bisect_right(starts, lba) - 1)
        end = lba + n
        while i < len(runs) and runs[i][0] < end:
            s, ln, dev, blk = runs[i]
            lo, hi = max(s, lba), min(s + ln, end)
            if lo < hi:
                yield dev, blk + (lo - s), hi - lo
            i += 1

    def file_seeks(f):
        """The first positioning counts, as in the replay and the paper."""
        count, at = 0, None
        for off, length in f["extents"]:
            for dev, blk, n in physical(off // 4096, length // 4096):
                if at != (dev, blk):
                    count += 1
                at = (dev, blk + n)
        return count

    figures = {}
    for label, pick in (("all", lambda f: True), ("rewritten", lambda f: f["rewritten"])):
        chosen = [file_seeks(f) for f in json.load(open(files_path)) if pick(f)]
        figures[label] = {"files": len(chosen), "seeks_per_file": sum(chosen) / max(1, len(chosen))}
    print(json.dumps(figures))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "age":
        sep = args.index("--")
        age(args[0], int(args[1]), float(args[2]), args[3], args[sep + 1:])
    elif cmd == "files":
        files(*args)
    elif cmd == "seeks":
        seeks(*args)
    else:
        sys.exit(f"unknown command {cmd}")
