#!/usr/bin/env python3
"""Tables for bench/slow_disk.sh: per metric and target, the median of the
rounds with their range; then append / inplace per round (median, range)
on the modeled disk and on the file.

    python3 bench/slow_disk_report.py results.tsv
results.tsv: ROUND TARGET METRIC VALUE per line."""
import statistics
import sys
from collections import defaultdict

METRICS = [
    ("first_write_iops", "4K random first writes, IOPS"),
    ("seq_write_mibs", "1M sequential write, MiB/s"),
    ("overwrite_iops", "4K random overwrites (aged), IOPS"),
    ("read_mibs", "after snapshots: 1M sequential read, cold, MiB/s"),
    ("extents_per_gib", "after snapshots: extents per GiB"),
    ("compact_mibs", "pool compact, MiB of volume/s"),
    ("compacted_read_mibs", "after compact: 1M sequential read, cold, MiB/s"),
    ("compacted_extents_per_gib", "after compact: extents per GiB"),
]


def spread(xs):
    if not xs:
        return "-"
    return f"{statistics.median(xs):,.1f} [{min(xs):,.1f}-{max(xs):,.1f}]"


def main(path):
    vals = defaultdict(dict)  # (metric, target) -> {round: value}
    targets = []
    for line in open(path):
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 4:
            continue
        rnd, tgt, metric, value = parts
        vals[(metric, tgt)][rnd] = float(value)
        if tgt not in targets:
            targets.append(tgt)
    width = max([len(t) for t in targets] + [12])
    for metric, title in METRICS:
        print(title)
        for t in targets:
            print(f"  {t:<{width}} {spread(list(vals[(metric, t)].values()))}")
        print()
    print("append / inplace, per round (median [range])")
    for suffix, where in (("_hdd", "modeled disk"), ("", "file")):
        a, i = "append" + suffix, "inplace" + suffix
        for metric, title in METRICS:
            ra, ri = vals[(metric, a)], vals[(metric, i)]
            ratios = [ra[k] / ri[k] for k in ra if k in ri and ri[k] > 0]
            if ratios:
                print(f"  {where:<12} {title}: {spread(ratios)}x")
    print()
    print("cold 1M read against the freshly written twin (fresh target), per round (median [range])")
    for t in targets:
        suffix = "_hdd" if t.endswith("_hdd") else ""
        fresh = vals[("read_mibs", "fresh" + suffix)]
        if t.startswith("fresh") or not fresh:
            continue
        for metric in ("read_mibs", "compacted_read_mibs"):
            mine = vals[(metric, t)]
            ratios = [mine[k] / fresh[k] for k in mine if k in fresh and fresh[k] > 0]
            if ratios:
                print(f"  {t:<{width}} {metric}: {spread(ratios)}x")


if __name__ == "__main__":
    main(sys.argv[1])
