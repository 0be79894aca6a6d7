#!/usr/bin/env python3
"""Tables for bench/layout.sh: per metric and target, the median of the
rounds with their range, and the ratio to nbdkit (per round, then the
median and range of those ratios).

    python3 bench/layout_report.py results.tsv
results.tsv: ROUND TARGET METRIC VALUE per line."""
import statistics
import sys
from collections import defaultdict

METRICS = [
    ("rand_write_iops", "4K random first writes, IOPS"),
    ("rand_write_cpu_us", "the same: server CPU microseconds per request"),
    ("rand_write_p99_us", "the same: completion latency p99, microseconds"),
    ("seq_write_mibs", "1M sequential overwrite, MiB/s"),
    ("compact_mibs", "tarn pool compact instead, MiB of volume/s"),
    ("cold_read_mibs", "1M sequential read, cold, MiB/s"),
    ("warm_read_mibs", "1M sequential read, warm, MiB/s"),
    ("extents_per_gib", "extents per GiB after the sequence"),
    ("free_outside_regions_mib", "free space outside whole 256 KiB regions, MiB"),
    ("snap1_write_iops", "4K random overwrites of 1% after the first snapshot (copy-on-write), IOPS"),
    ("snapn_write_iops", "the same after the last snapshot, IOPS"),
    ("snap_cold_read_mibs", "after the snapshots and overwrites: 1M sequential read, cold, MiB/s"),
    ("snap_warm_read_mibs", "after the snapshots and overwrites: 1M sequential read, warm, MiB/s"),
]
# Ratios of a target to itself: (metric, its baseline with no snapshots).
SELF = [
    ("snap_cold_read_mibs", "cold_read_mibs", "cold read, 10 snapshots / none"),
    ("snap_warm_read_mibs", "warm_read_mibs", "warm read, 10 snapshots / none"),
]


def main(path):
    vals = defaultdict(dict)  # (metric, target) -> {round: value}
    targets = []
    for line in open(path):
        parts = line.split("\t")
        if len(parts) != 4:
            continue
        rnd, tgt, metric, value = parts
        vals[(metric, tgt)][rnd] = float(value)
        if tgt not in targets:
            targets.append(tgt)
    for metric, title in METRICS:
        rows = [t for t in targets if (metric, t) in vals]
        if not rows:
            continue
        print(f"== {title}")
        print(f"{'target':<14}{'median':>12}{'range':>24}{'vs nbdkit':>12}{'ratio range':>18}")
        base = vals.get((metric, "nbdkit"), {})
        for t in rows:
            v = vals[(metric, t)]
            xs = list(v.values())
            med = statistics.median(xs)
            rng = f"{min(xs):.1f} .. {max(xs):.1f}"
            ratios = [v[r] / base[r] for r in v if r in base and base[r] > 0]
            if ratios and t != "nbdkit":
                ratio = f"{statistics.median(ratios):.2f}x"
                rr = f"{min(ratios):.2f} .. {max(ratios):.2f}"
            else:
                ratio, rr = "", ""
            print(f"{t:<14}{med:>12.1f}{rng:>24}{ratio:>12}{rr:>18}")
        print()
    if "tarn_b" in targets:
        new_over_old(vals)
    for metric, base_metric, title in SELF:
        rows = [t for t in targets if (metric, t) in vals and (base_metric, t) in vals]
        if not rows:
            continue
        print(f"== {title} (same target, same round)")
        for t in rows:
            v, base = vals[(metric, t)], vals[(base_metric, t)]
            ratios = [v[r] / base[r] for r in v if r in base and base[r] > 0]
            if ratios:
                print(f"{t:<14}{statistics.median(ratios):>11.2f}x{min(ratios):>14.2f} .. {max(ratios):.2f}")
        print()


def new_over_old(vals):
    """tarn / tarn_b per round (two builds in one run): median and range."""
    print("== tarn / tarn_b (TARN over TARN_B, same round)")
    for metric, _ in METRICS:
        v, old = vals.get((metric, "tarn"), {}), vals.get((metric, "tarn_b"), {})
        ratios = [v[r] / old[r] for r in v if r in old and old[r] > 0]
        if ratios:
            print(f"{metric:<26}{statistics.median(ratios):>8.2f}x{min(ratios):>10.2f} .. {max(ratios):.2f}")
    print()


if __name__ == "__main__":
    main(sys.argv[1])
