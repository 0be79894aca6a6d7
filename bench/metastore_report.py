#!/usr/bin/env python3
"""Tables for bench/metastore.sh: metastore_report.py RAWDIR

Reads RAWDIR/BACKEND.N.rR.txt (the binary's output: progress lines, a
RESULT {json} line, and a LOAD line the script appends)."""
import glob
import json
import os
import re
import statistics
import sys


def load(raw):
    runs = {}
    for p in sorted(glob.glob(os.path.join(raw, "*.txt"))):
        m = re.match(r"(.+)\.([^.]+)\.r(\d+)\.txt$", os.path.basename(p))
        if not m:
            continue
        b, n, r = m.group(1), m.group(2), int(m.group(3))
        txt = open(p).read()
        res = next((json.loads(l[7:]) for l in txt.splitlines() if l.startswith("RESULT ")), None)
        ld = next((l.split()[1:] for l in txt.splitlines() if l.startswith("LOAD ")), ["?", "?"])
        runs.setdefault((n, b), []).append((r, res, ld, txt))
    return runs


def spread(xs, f):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "failed"
    s = f(statistics.median(xs))
    if len(xs) > 1:
        s += f" [{f(min(xs))}-{f(max(xs))}]"
    return s


def nkey(n):
    return float(n.rstrip("MK")) * (1e6 if n.endswith("M") else 1e3 if n.endswith("K") else 1)


COLS = [
    ("inserts/s", lambda r: r["inserts_per_s"], lambda x: f"{x / 1e3:.1f}k"),
    ("commit p50 ms", lambda r: r["commit_p50_ms"], lambda x: f"{x:.2f}"),
    ("commit p99 ms", lambda r: r["commit_p99_ms"], lambda x: f"{x:.1f}"),
    ("commit max ms", lambda r: r["commit_max_ms"], lambda x: f"{x:.0f}"),
    ("lookups/s", lambda r: r["lookups_per_s"], lambda x: f"{x / 1e6:.2f}M"),
    ("RSS after fill MiB", lambda r: r["rss_fill"] / 2**20, lambda x: f"{x:.0f}"),
    ("device B/extent", lambda r: r["device_bytes"] / max(r["extents"], 1), lambda x: f"{x:.1f}"),
    ("reopen ms", lambda r: (r["open"] or {}).get("open_ms"), lambda x: f"{x:.1f}"),
    ("1st lookup ms", lambda r: (r["open"] or {}).get("first_lookup_ms"), lambda x: f"{x:.2f}"),
    ("lookup hits after reopen", lambda r: (r["open"] or {}).get("hits_after_open"), lambda x: f"{x / 1e6:.3f}M"),
    ("RSS after reopen+lookups MiB", lambda r: ((r["open"] or {}).get("rss_after_lookups") or 0) / 2**20,
     lambda x: f"{x:.0f}"),
]


def main():
    raw = sys.argv[1]
    runs = load(raw)
    ns = sorted({n for n, _ in runs}, key=nkey)
    backends = sorted({b for _, b in runs})
    print("== per backend: median of the rounds [range]; commit = a batch of 256 inserts + the durable commit;")
    print("   lookups: written blocks in random order, warm; reopen: fresh process (page cache dropped unless --no-drop-caches), open + first lookup")
    for n in ns:
        rows = []
        for b in backends:
            rs = [x for x in runs.get((n, b), []) if x[1]]
            if not rs:
                rows.append((b, None, []))
                continue
            rows.append((b, rs, [x[2] for x in rs]))
        ext = next((x[1]["extents"] for _, rs, _ in rows if rs for x in rs), 0)
        print(f"\nN = {n} inserts ({ext / 1e6:.2f} M extents at the end)")
        w = 24
        print(f"{'':30}" + "".join(f"{b:>{w}}" for b, _, _ in rows))
        for name, get, f in COLS:
            line = f"{name:30}"
            for b, rs, _ in rows:
                line += f"{(spread([get(x[1]) for x in rs], f) if rs else 'failed'):>{w}}"
            print(line)
        line = f"{'page cache dropped at reopen':30}"
        for b, rs, _ in rows:
            line += f"{('yes' if all(x[1].get('caches_dropped') for x in rs) else 'no') if rs else '':>{w}}"
        print(line)
        for b, rs, loads in rows:
            print(f"load1 at start/end of each {b} run: " + ", ".join(f"{a}/{c}" for a, c in loads))
        d = {b: rs for b, rs, _ in rows if rs}
        med = lambda b, k: statistics.median([k(x[1]) for x in d[b]])
        for b in sorted(d):
            if b == "btreemap" or "btreemap" not in d:
                continue
            print(f"{b} / btreemap: inserts/s {med(b, COLS[0][1]) / med('btreemap', COLS[0][1]):.2f}x, "
                  f"commit p99 {med(b, COLS[2][1]) / med('btreemap', COLS[2][1]):.2f}x, "
                  f"commit max {med(b, COLS[3][1]) / med('btreemap', COLS[3][1]):.2f}x, "
                  f"lookups/s {med(b, COLS[4][1]) / med('btreemap', COLS[4][1]):.2f}x, "
                  f"reopen {med(b, COLS[7][1]) / med('btreemap', COLS[7][1]):.2g}x")
        for b, rs, _ in rows:
            for r, res, ld, txt in rs or []:
                for l in txt.splitlines():
                    if l.startswith(b + ": "):  # a backend's own summary (tarn: checkpoints)
                        print(f"   r{r} {l}")
    big = ns[-1] if ns else None
    if big:
        print(f"\n== as the map grows (N = {big}, round 1): the progress lines of each backend")
        for b in backends:
            for r, res, ld, txt in runs.get((big, b), []):
                if r != 1:
                    continue
                print(f"-- {b}")
                for l in txt.splitlines():
                    if re.match(r"^\s*(inserts|\d+)\s", l):
                        print("   " + l)


if __name__ == "__main__":
    main()
