#!/usr/bin/env python3
"""Tables for bench/snapshots.sh: snap_report.py WRITE.tsv READ.tsv CLI.tsv SIZE_BYTES"""
import json
import statistics
import sys

from fio_json import load_job, summarize

NAMES = {"tarn": "tarn", "qemu": "qemu-nbd/qcow2"}


def parse(path):
    job = load_job(path)
    return summarize(job) if job else None


def rows(path):
    try:
        return [l.rstrip("\n").split("\t") for l in open(path) if l.strip()]
    except FileNotFoundError:
        return []


def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"


def cli_stats(cli):
    """(key, setup) -> (samples ms, loads, note), in order of first appearance."""
    out = {}
    for r in cli:
        key, setup, us, load = r[0], r[1], int(r[2]), r[3]
        note = r[4] if len(r) > 4 else ""
        e = out.setdefault((key, setup), ([], [], note))
        e[0].append(us / 1000.0)
        e[1].append(float(load or 0))
    return out


def q(v, f):
    v = sorted(v)
    return v[min(len(v) - 1, round((len(v) - 1) * f))]


def merge(runs):
    """Median of several rounds of one row (None if every round failed)."""
    ok = [r for r in runs if r]
    if not ok:
        return None
    med = {k: statistics.median(r[k] for r in ok) for k in ("iops", "mbs", "p99", "bytes")}
    med["lo"], med["hi"], med["n"] = min(r["iops"] for r in ok), max(r["iops"] for r in ok), len(ok)
    return med


def spread(r):
    if not r or r["n"] < 2:
        return ""
    return f"{r['lo'] / 1000:.0f}-{r['hi'] / 1000:.0f}k"


def write_table(write, cli, size):
    if not write:
        return
    runs = {}
    loads = {}
    for row in write:
        tgt, k, phase, path, l0, l1 = row[:6]
        runs.setdefault((tgt, k, phase), []).append(parse(path))
        loads.setdefault((tgt, k), []).append(float(l0 or 0))
    res = {key: merge(v) for key, v in runs.items()}
    rounds = max(len(v) for v in runs.values())
    targets = [t for t in NAMES if any(r[0] == t for r in write)]
    ks = sorted({r[1] for r in write}, key=lambda k: (int(k.rstrip("f")), k))
    cs = cli_stats(cli)
    print("== 4K random write QD32 on a fully written volume after k snapshots (fio nbd engine)")
    print("pass 1: every block written once in random order (capped at the runtime; 'covered' = share of the")
    print("        volume written); with k >= 1 every pass-1 write hits a block the snapshots share")
    print("steady: time-based after pass 1, random with repeats")
    if rounds > 1:
        print(f"IOPS: median of {rounds} rounds (range in brackets); load: 1-minute load average at the start of each run")
    hdr = (f"{'target':15} {'k':>3} {'pass1 IOPS':>11} {'':>9} {'covered':>8} {'vs k=0':>7} {'p99 us':>8}   "
           f"{'steady IOPS':>11} {'':>9} {'vs k=0':>7} {'p99 us':>8}   {'snap ms':>8}  {'load':>9}")
    print(hdr)
    print("-" * len(hdr))
    for t in targets:
        for k in ks:
            if (t, k, "pass1") not in res and (t, k, "steady") not in res:
                continue
            p1, st = res.get((t, k, "pass1")), res.get((t, k, "steady"))
            b1, bs = res.get((t, "0", "pass1")), res.get((t, "0", "steady"))
            c = next((e for (key, setup), e in cs.items()
                      if key == "snapshot create" and setup.startswith(f"{t}: ") and setup.endswith(f", {k} snapshots")), None)
            snap = f"{statistics.median(c[0]):.1f}" if c else "-"
            line = f"{NAMES[t]:15} {k:>3} "
            if p1:
                line += (f"{p1['iops']:>11.0f} {spread(p1):>9} {100 * p1['bytes'] / size:>7.0f}% "
                         f"{ratio(p1['iops'], b1 and b1['iops']):>7} {p1['p99']:>8.0f}   ")
            else:
                line += f"{'failed':>11} {'':>9} {'':>8} {'':>7} {'':>8}   "
            if st:
                line += f"{st['iops']:>11.0f} {spread(st):>9} {ratio(st['iops'], bs and bs['iops']):>7} {st['p99']:>8.0f}   "
            else:
                line += f"{'failed':>11} {'':>9} {'':>7} {'':>8}   "
            ld = loads.get((t, k), [])
            ld = f"{min(ld):.1f}-{max(ld):.1f}" if ld else "-"
            line += f"{snap:>8}  {ld:>9}"
            print(line)
    if "tarn" in targets and "qemu" in targets:
        print()
        for k in ks:
            if k.endswith("f"):
                continue
            cells = []
            for ph in ("pass1", "steady"):
                a, b = res.get(("tarn", k, ph)), res.get(("qemu", k, ph))
                cells.append(f"{ph} {ratio(a and a['iops'], b and b['iops'])}")
            print(f"tarn / qcow2 after {k:>2} snapshots: " + ", ".join(cells))
    if "0f" in ks:
        print("k=0f: tarn without snapshots, volume filled by 4K random writes (one extent per block, as after a")
        print("      redirected pass 1): separates the cost of a fragmented map from the cost of the snapshots")
    if "tarn" in targets and "0" in ks and "10" in ks:
        print()
        for ph in ("pass1", "steady"):
            a, b = res.get(("tarn", "10", ph)), res.get(("tarn", "0", ph))
            if a and b:
                r = a["iops"] / b["iops"]
                print(f"target: tarn 4K randwrite after 10 snapshots >= 0.95x of before: {ph} {r:.2f}x -> "
                      f"{'met' if r >= 0.95 else 'MISSED'}")
    print()


def read_table(read):
    if not read:
        return
    res = {(t, v, wl): parse(p) for t, v, wl, p, _, _ in read}
    loads = {(t, v, wl): f"{l0}/{l1}" for t, v, wl, p, l0, l1 in read}
    targets = [t for t in NAMES if any(r[0] == t for r in read)]
    views = []
    for r in read:
        if r[1] not in views:
            views.append(r[1])
    desc = {"head": "head (10 snapshots exist)", "snap1of10": "oldest of 10 snapshots"}
    print("== reads: head vs the oldest of 10 snapshots (1% rewritten after each), clones / qcow2 overlay chains")
    print("   (clone depth d: tarn clone of a clone's snapshot, d generations; qemu: d qcow2 overlays; 1% rewritten per level)")
    hdr = (f"{'target':15} {'view':28} {'4K randread IOPS':>16} {'vs head':>8} {'p99 us':>8}   "
           f"{'1M seq read MB/s':>16} {'vs head':>8}  {'load (rr/sr)':>22}")
    print(hdr)
    print("-" * len(hdr))
    for t in targets:
        h4, h1 = res.get((t, "head", "rr4k")), res.get((t, "head", "sr1m"))
        for v in views:
            a, b = res.get((t, v, "rr4k")), res.get((t, v, "sr1m"))
            if (t, v, "rr4k") not in res:
                continue
            name = desc.get(v, v.replace("clone", "clone depth "))
            line = f"{NAMES[t]:15} {name:28} "
            line += (f"{a['iops']:>16.0f} {ratio(a['iops'], h4 and h4['iops']):>8} {a['p99']:>8.0f}   " if a
                     else f"{'failed':>16} {'':>8} {'':>8}   ")
            line += f"{b['mbs']:>16.0f} {ratio(b['mbs'], h1 and h1['mbs']):>8}" if b else f"{'failed':>16} {'':>8}"
            line += f"  {loads.get((t, v, 'rr4k'), '-') + ' ' + loads.get((t, v, 'sr1m'), '-'):>22}"
            print(line)
    print()


def cli_table(cli):
    cs = cli_stats(cli)
    if not cs:
        return
    print("== wall time of admin commands: tarn CLI (process start + control socket, or pool open offline), qemu-img")
    hdr = f"{'command':50} {'setup':38} {'n':>4} {'median ms':>10} {'p90 ms':>8} {'max ms':>8} {'load':>10}  note"
    print(hdr)
    print("-" * len(hdr))
    for (key, setup), (v, loads, note) in cs.items():
        lo = f"{min(loads):.2f}-{max(loads):.2f}" if min(loads) != max(loads) else f"{loads[0]:.2f}"
        print(f"{key:50} {setup:38} {len(v):>4} {statistics.median(v):>10.2f} {q(v, 0.9):>8.2f} {max(v):>8.2f} {lo:>10}  {note}")
    print()


def human(n):
    for unit, s in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n % s == 0:
            return f"{n // s}{unit}"
    return str(n)


def main():
    write, read, cli, size = rows(sys.argv[1]), rows(sys.argv[2]), rows(sys.argv[3]), int(sys.argv[4])
    write_table(write, cli, size)
    read_table(read)
    cli_table(cli)


if __name__ == "__main__":
    main()
