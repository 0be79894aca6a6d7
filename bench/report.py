#!/usr/bin/env python3
"""Table for bench/run.sh: report.py MANIFEST.tsv META.tsv"""
import json
import sys

from fio_json import load_job, summarize

NAMES = {"tarn": "tarn", "qemu": "qemu-nbd", "nbdkit": "nbdkit-file", "raw": "raw-file",
         "tarn_nosum": "tarn-no-checksums", "tarn_b": "tarn-b"}
DESC = {
    "rw4k_fresh": "4K randwrite QD32, fresh",
    "rw4k_alloc": "4K randwrite QD32, allocated",
    "rr4k": "4K randread QD32",
    "sw1m": "1M seq write QD8, fresh",
    "sr1m": "1M seq read QD8",
    "rw4k_fsync": "4K randwrite QD32, flush/32",
}


def parse(path):
    job = None if path == "-" else load_job(path)
    if job is None:
        return None
    r = summarize(job)
    syncs = job.get("sync", {}).get("total_ios", 0)
    writes = job["write"].get("total_ios", 0)
    r["flush"] = (syncs / writes) if syncs and writes else None
    return r


def main():
    rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
    res = {}
    order = []
    hwm = {}
    for wl, tgt, path, kb in rows:
        if wl not in order:
            order.append(wl)
        try:
            res[(wl, tgt)] = parse(path)
        except Exception as e:
            res[(wl, tgt)] = None
            print(f"(could not parse {path}: {e})")
        hwm.setdefault(tgt, []).append(int(kb or 0))
    targets = []
    for _, tgt, _, _ in rows:
        if tgt not in targets:
            targets.append(tgt)
    targets.sort(key=lambda t: list(NAMES).index(t) if t in NAMES else 99)
    peers = [t for t in targets if t != "tarn"]
    hdr = f"{'workload':30} {'target':12} {'IOPS':>9} {'MB/s':>8} {'p99 us':>9}   " + \
        ("tarn IOPS / target" if "tarn" in targets else "")
    print(hdr)
    print("-" * len(hdr))
    for wl in order:
        tr = res.get((wl, "tarn"))
        for i, t in enumerate(targets):
            r = res.get((wl, t))
            label = DESC.get(wl, wl) if i == 0 else ""
            if r is None:
                print(f"{label:30} {NAMES.get(t, t):12} {'failed':>9}")
                continue
            ratio = ""
            if tr and t != "tarn" and r["iops"] > 0:
                ratio = f"{tr['iops'] / r['iops']:.2f}x"
            err = "  (fio error %s)" % r["err"] if r["err"] else ""
            if r["flush"] is not None:
                err += f"  [{r['flush']:.2f} flushes/write]"
            print(f"{label:30} {NAMES.get(t, t):12} {r['iops']:9.0f} {r['mbs']:8.1f} {r['p99']:9.0f}   {ratio}{err}")
        print()
    if hwm:
        print("peak RSS of the server process (VmHWM, max over runs): " + ", ".join(
            f"{NAMES.get(t, t)} {max(v) / 1024:.1f} MiB" for t, v in hwm.items() if max(v) > 0))
    try:
        meta = [l.rstrip("\n").split("\t") for l in open(sys.argv[2]) if l.strip()]
    except Exception:
        meta = []
    for kind, written, du_b, kb, st in meta:
        written, du_b = int(written), int(du_b)
        try:
            s = json.loads(st)
            m = int(s["metadata"])
            used = s.get("used")
            j = s.get("journal_size")
            # Issue 10's targets: <= 0.05 % of bytes written sequentially,
            # <= 0.5 % for 4 KiB random writes.
            goal = {"seq": 0.05, "rand": 0.5}.get(kind)
            pct = m / max(written, 1) * 100
            verdict = "" if goal is None else f" [target <= {goal}%: {'met' if pct <= goal else 'MISSED'}]"
            print(f"tarn metadata after {kind} fill: {m} bytes for {written} bytes written = "
                  f"{pct:.4f}% ({m / max(written, 1):.6f} B/B){verdict}"
                  + (f" (+ fixed journal {j})" if j is not None else "")
                  + f"; pool used {used}, pool file on disk {du_b}; server VmHWM {int(kb) / 1024:.1f} MiB")
        except Exception:
            print(f"tarn metadata after {kind} fill: pool status unavailable: {st[:200]}; "
                  f"pool file on disk {du_b} bytes for {written} written; server VmHWM {int(kb) / 1024:.1f} MiB")


if __name__ == "__main__":
    main()
