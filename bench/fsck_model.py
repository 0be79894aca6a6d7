#!/usr/bin/env python3
"""Modeled e2fsck time from a tarn request trace (bench/hints.sh).

usage: fsck_model.py TRACE_TXT MAP_JSON CLASSIFY_JSON DEVICE_BLOCKS... [--json]

TRACE_TXT: `tarn trace print` of the fsck run (only reads are used, in the
order they were answered). MAP_JSON: `tarn vol map VOL --json` after it
([lba, len, device, block] in 4 KiB blocks). CLASSIFY_JSON: `tarn vol
classify VOL --runs --json` (which byte ranges are which kind of
metadata). DEVICE_BLOCKS: each pool device's size in 4 KiB blocks.

The disk model is the placement replay's (crates/cli/src/trace/replay.rs,
VC equation 1): a 7,200 rpm disk, seek 0.5 ms + 7.5 ms x sqrt(distance /
device), plus half a rotation, 150 MB/s transfer; a forward gap shorter
than a 256 KiB region is read through instead of seeking. Every pool device
is its own spindle with its own head. With "ssd" as a device's size prefix
(ssd:BLOCKS), that device is modeled as flash instead: 0.1 ms per request
run, 500 MB/s. Prints per kind of metadata read (directory reads are
e2fsck's pass 2) the modeled time and seeks, and the total.
"""
import bisect
import json
import math
import sys

SEEK_MIN_MS, SEEK_FULL_MS, ROTATION_MS, RATE = 0.5, 8.0, 4.17, 150e6
SSD_MS, SSD_RATE = 0.1, 500e6
REGION = 64  # blocks: 256 KiB
BS = 4096


def seek_ms(distance, blocks):
    if distance == 0:
        return 0.0
    return SEEK_MIN_MS + (SEEK_FULL_MS - SEEK_MIN_MS) * math.sqrt(distance / max(1, blocks)) + ROTATION_MS


def load_reads(path, export=None):
    reads = []
    for line in open(path):
        parts = line.split()
        if len(parts) >= 5 and parts[2] == "read" and (export is None or parts[1] == export):
            reads.append((int(parts[3]), int(parts[4])))
    return reads


def kind_lookup(classify):
    runs = sorted((off // BS, (off + length + BS - 1) // BS, kind) for off, length, kind in classify["runs"])
    starts = [r[0] for r in runs]

    def kind_of(block):
        i = bisect.bisect_right(starts, block) - 1
        if i >= 0 and runs[i][0] <= block < runs[i][1]:
            return runs[i][2]
        return "data"
    return kind_of


def physical(map_runs):
    runs = sorted(map_runs)
    starts = [r[0] for r in runs]

    def pieces(lba, n):
        """(lba, len, device, block) pieces of [lba, lba+n); holes skipped."""
        out = []
        i = max(0, bisect.bisect_right(starts, lba) - 1)
        end = lba + n
        while i < len(runs) and runs[i][0] < end:
            r_lba, r_len, dev, blk = runs[i]
            lo, hi = max(lba, r_lba), min(end, r_lba + r_len)
            if lo < hi:
                out.append((lo, hi - lo, dev, blk + (lo - r_lba)))
            i += 1
        return out
    return pieces


def model(reads, pieces, kind_of, devices):
    heads = {}
    per_kind = {}
    for off, length in reads:
        first, n = off // BS, (off + length + BS - 1) // BS - off // BS
        for lba, ln, dev, blk in pieces(first, n):
            kind = kind_of(lba)
            k = per_kind.setdefault(kind, {"ms": 0.0, "seeks": 0, "blocks": 0})
            ssd, blocks = devices[dev]
            ms, seeks = access(heads.get(dev), blk, ln, ssd, blocks)
            heads[dev] = blk + ln
            k["ms"] += ms
            k["seeks"] += seeks
            k["blocks"] += ln
    return per_kind


def access(head, blk, ln, ssd, blocks):
    """(ms, seeks) of reading ln blocks at blk with the head at `head`."""
    if ssd:
        return SSD_MS + ln * BS / SSD_RATE * 1e3, 0 if head == blk else 1
    if head is not None and 0 <= blk - head < REGION:
        return (blk - head + ln) * BS / RATE * 1e3, 0
    distance = blocks // 3 if head is None else abs(blk - head)
    return seek_ms(distance, blocks) + ln * BS / RATE * 1e3, 1


def main(argv):
    as_json = "--json" in argv
    args = [a for a in argv if a != "--json"]
    trace, map_json, classify_json = args[:3]
    devices = []
    for spec in args[3:]:
        ssd = spec.startswith("ssd:")
        devices.append((ssd, int(spec[4:] if ssd else spec)))
    classify = json.load(open(classify_json))
    per_kind = model(load_reads(trace), physical(json.load(open(map_json))), kind_lookup(classify), devices)
    total = {"ms": sum(k["ms"] for k in per_kind.values()), "seeks": sum(k["seeks"] for k in per_kind.values()),
             "blocks": sum(k["blocks"] for k in per_kind.values())}
    if as_json:
        print(json.dumps({"kinds": per_kind, "total": total}))
        return 0
    for kind, k in sorted(per_kind.items()):
        print(f"{kind:10} {k['ms'] / 1e3:9.2f} s {k['seeks']:8} seeks {k['blocks'] * BS / 2**20:9.1f} MiB")
    print(f"{'total':10} {total['ms'] / 1e3:9.2f} s {total['seeks']:8} seeks {total['blocks'] * BS / 2**20:9.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
