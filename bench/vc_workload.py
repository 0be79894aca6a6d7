#!/usr/bin/env python3
"""Generate a file workload as a block trace, for `tarn trace replay`.

The Virtual Contiguity paper (seed 001) replayed a month of UC HP-UX file
system traces (instructional, research, web server); those traces are not
available, so this script makes workloads of the same shape: files of a
size distribution, created, rewritten (whole, or in part: a tenth of its
8 KiB pieces chosen at random, as a database or a mailbox is updated) and
deleted over simulated days, a snapshot at the start of each day. A small file system on the
volume gives each file logical blocks next-fit (4 KiB blocks, so free
space fragments as files die) and writes several files at once, in 8 KiB
requests taken in turn, as a busy system does: what makes small-block
next-fit placement scatter files (the paper's "files written through
multiple write commands issued separately").

usage: vc_workload.py WORKLOAD OUT.trc OUT.files.json [--days N] [--scale F] [--seed S]
                      [--chunk BYTES] [--streams N]
  WORKLOAD: instructional | research | webserver
Writes the trace (docs/FORMAT.md, Request trace; export "disk0", day d at
trace time d x 86400 s) and the files alive at the end with their logical
extents and whether they were rewritten on a later day than their creation
(after a snapshot held them). Prints the volume size the trace needs.
"""
import argparse
import json
import random
import struct

BLOCK = 4096
DAY_NS = 86400 * 10**9
# requests of one file system block (FFS's 8 KiB, as in the paper's
# small-block policy), four files written at once; both options
CHUNK = 8 * 1024
STREAMS = 4

# per workload: files on day 0, median size and spread (lognormal), the
# largest file, per later day the fractions created / rewritten / deleted,
# and the share of rewrites that change only part of the file (whole
# rewrites copy every block, so the copy is as dense as the original;
# partial ones are where placement shows)
WORKLOADS = {
    "instructional": dict(files=6000, median=8 << 10, sigma=1.6, largest=2 << 20, new=0.06, rewrite=0.05, delete=0.05,
                          partial=0.2),
    "research": dict(files=4000, median=16 << 10, sigma=1.8, largest=8 << 20, new=0.04, rewrite=0.03, delete=0.03,
                     partial=0.3),
    "webserver": dict(files=800, median=96 << 10, sigma=1.4, largest=16 << 20, new=0.02, rewrite=0.30, delete=0.02,
                      partial=0.5),
}
# a partial rewrite changes this share of the file's pieces
PARTIAL_SHARE = 0.1


class Volume:
    """A 4 KiB-block next-fit allocator over the volume's logical space."""

    def __init__(self, blocks):
        self.free = bytearray(b"\x01") * blocks
        self.cursor = 0
        self.blocks = blocks

    def allocate(self, n):
        """n blocks as a list of (first, count) runs, next-fit."""
        runs, pos, scanned = [], self.cursor, 0
        while n > 0:
            if scanned > self.blocks:
                raise SystemExit("volume full: raise --scale or lower the workload")
            if self.free[pos]:
                self.free[pos] = 0
                if runs and runs[-1][0] + runs[-1][1] == pos:
                    runs[-1] = (runs[-1][0], runs[-1][1] + 1)
                else:
                    runs.append((pos, 1))
                n -= 1
            pos = (pos + 1) % self.blocks
            scanned += 1
        self.cursor = pos
        return runs

    def release(self, runs):
        for first, count in runs:
            self.free[first:first + count] = b"\x01" * count


class Trace:
    def __init__(self):
        self.out = bytearray(b"TARNTRC1" + struct.pack("<IIQQ", 1, 0, 0, 0))
        name = b"disk0"
        rec = struct.pack("<BBHI", 2, 0, len(name), 0) + name
        self.out += rec + b"\0" * (-len(rec) % 32)
        self.t = 0

    def req(self, cmd, offset, length):
        self.t += 1000  # 1 us apart within a day
        self.out += struct.pack("<BBBBIQQQ", 1, cmd, 0, 0, 0, self.t, offset, length)


def file_chunks(runs, size, chunk):
    """The file's bytes as (offset, length) write requests of <= CHUNK."""
    left = size
    for first, count in runs:
        off, end = first * BLOCK, (first + count) * BLOCK
        while off < end and left > 0:
            n = min(chunk, end - off, left)
            yield off, n
            off += n
            left -= n


def write_files(trace, files, chunk, streams, rng):
    """Write several files at once: `streams` files in progress, one chunk each in turn.
    A file marked `partial` gets a random tenth of its chunks (at least one)."""
    queue = list(files)
    active = []
    while queue or active:
        while queue and len(active) < streams:
            f = queue.pop(0)
            pieces = list(file_chunks(f["runs"], f["size"], chunk))
            if f.pop("partial", False):
                keep = max(1, int(len(pieces) * PARTIAL_SHARE))
                pieces = sorted(rng.sample(pieces, keep))
            active.append(iter(pieces))
        for it in list(active):
            req = next(it, None)
            if req is None:
                active.remove(it)
            else:
                trace.req(1, *req)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workload", choices=sorted(WORKLOADS))
    ap.add_argument("trace")
    ap.add_argument("files")
    ap.add_argument("--days", type=int, default=10)
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies the number of files")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=CHUNK, help="bytes per write request")
    ap.add_argument("--streams", type=int, default=STREAMS, help="files written at once")
    a = ap.parse_args()
    w = WORKLOADS[a.workload]
    rng = random.Random(a.seed)

    def size():
        s = int(rng.lognormvariate(0, w["sigma"]) * w["median"])
        return max(1, min(s, w["largest"]))

    n0 = int(w["files"] * a.scale)
    expect = n0 * (1 + a.days * w["new"]) * w["median"] * 3
    vol = Volume(int(max(expect * 3, 256 << 20) // BLOCK))
    trace = Trace()
    alive, next_id = {}, 0

    def create(n, day):
        nonlocal next_id
        made = []
        for _ in range(n):
            s = size()
            f = {"id": next_id, "size": s, "runs": vol.allocate(-(-s // BLOCK)), "born": day, "rewritten": False}
            alive[next_id] = f
            made.append(f)
            next_id += 1
        return made

    for day in range(a.days):
        trace.t = day * DAY_NS
        if day == 0:
            todo = create(n0, day)
        else:
            ids = list(alive)
            for i in rng.sample(ids, int(len(ids) * w["delete"])):
                f = alive.pop(i)
                for first, count in f["runs"]:
                    trace.req(3, first * BLOCK, count * BLOCK)
                vol.release(f["runs"])
            ids = list(alive)
            todo = [alive[i] for i in rng.sample(ids, int(len(ids) * w["rewrite"]))]
            for f in todo:
                f["rewritten"] = True
                f["partial"] = rng.random() < w["partial"]
            todo += create(int(n0 * w["new"]), day)
            rng.shuffle(todo)
        write_files(trace, todo, a.chunk, a.streams, rng)
        trace.req(2, 0, 0)

    with open(a.trace, "wb") as out:
        out.write(trace.out)
    files = [{"export": "disk0", "extents": [[r[0] * BLOCK, min(r[1] * BLOCK, f["size"] - sum(
        x[1] * BLOCK for x in f["runs"][:k]))] for k, r in enumerate(f["runs"])], "rewritten": f["rewritten"]}
        for f in alive.values()]
    with open(a.files, "w") as out:
        json.dump(files, out)
    written = sum(f["size"] for f in alive.values())
    print(f"{a.workload}: {len(alive)} files alive, {written >> 20} MiB, volume {vol.blocks * BLOCK >> 20} MiB, "
          f"{sum(f['rewritten'] for f in alive.values())} rewritten after a snapshot")


if __name__ == "__main__":
    main()
