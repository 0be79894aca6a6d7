#!/usr/bin/env python3
"""Tables for bench/aging.sh: aging_report.py OUT ROUNDS TARGET...

Reads, per target and round (TAG = TARGET.rROUND), from OUT:
  TAG.json            fio JSON (whole-run latency percentiles, flush latency)
  TAG_iops.1.log      fio iops log, one sample per second
  TAG_clat.1.log      fio clat log, the slowest write of each second (ns)
  TAG.rss.tsv         t_s, VmRSS kB, VmHWM kB, load1 during the run
  TAG.facts.tsv       key, value, load1: times (ms) and sizes after the run
"""
import os
import statistics
import sys

from fio_json import load_job

NAMES = {"tarn": "tarn", "qemu": "qemu-nbd/qcow2"}
MIB = 1 << 20


def read_log(path):
    """[(msec, value)] of the write direction of a fio log."""
    out = []
    try:
        for line in open(path):
            f = [x.strip() for x in line.split(",")]
            if len(f) >= 3 and f[2] == "1":
                out.append((int(f[0]), int(f[1])))
    except OSError:
        pass
    return out


def read_tsv(path):
    try:
        lines = [l.rstrip("\n").split("\t") for l in open(path) if l.strip()]
    except OSError:
        return []
    return lines


def per_second(samples, secs):
    """One value per second. fio writes no iops sample for a second in which
    nothing completed (a stall): a gap of k seconds between two samples adds
    k - 1 seconds of 0 (the samples add up to the job's total)."""
    out = []
    prev = 0
    for ms, v in samples:
        gap = round((ms - prev) / 1000.0)
        out.extend([0] * max(gap - 1, 0))
        out.append(v)
        prev = ms
    return [((i + 1) * 1000, v) for i, v in enumerate(out)]


def per_minute(samples, agg):
    """{minute index: agg(values)} of per-second samples; minute 0 = first."""
    by = {}
    for ms, v in samples:
        by.setdefault(max(ms - 1, 0) // 60000, []).append(v)
    return {m: (agg(v), len(v)) for m, v in sorted(by.items())}


def load_round(out, tag):
    r = {"tag": tag}
    job = load_job(os.path.join(out, tag + ".json"))
    if job is None:
        return None
    w = job["write"]
    r["ios"] = w["total_ios"]
    r["iops"] = w["iops"]
    r["secs"] = job.get("job_runtime", 0) / 1000.0
    clat = w.get("clat_ns", {})
    pct = clat.get("percentile", {})
    r["p50"] = pct.get("50.000000", 0) / 1e3
    r["p99"] = pct.get("99.000000", 0) / 1e3
    r["p999"] = pct.get("99.900000", 0) / 1e3
    r["p9999"] = pct.get("99.990000", 0) / 1e3
    r["max_ms"] = clat.get("max", 0) / 1e6
    s = job.get("sync", {})
    r["flushes"] = s.get("total_ios", 0)
    sl = s.get("lat_ns", {})
    r["flush_mean_ms"] = sl.get("mean", 0) / 1e6
    r["flush_max_ms"] = sl.get("max", 0) / 1e6
    r["err"] = job.get("error", 0)
    iops = per_second(read_log(os.path.join(out, tag + "_iops.1.log")), r["secs"])
    clats = read_log(os.path.join(out, tag + "_clat.1.log"))
    r["sec_iops"] = iops
    r["min_iops"] = per_minute(iops, lambda v: sum(v) / len(v))
    r["min_worst_iops"] = per_minute(iops, min)
    r["min_worst_ms"] = per_minute([(t, v / 1e6) for t, v in clats], max)
    vals = [v for _, v in iops]
    r["median_sec"] = statistics.median(vals) if vals else 0
    r["stall_secs"] = sum(1 for v in vals if v < 0.5 * r["median_sec"])
    r["worst_sec"] = min(vals) if vals else 0
    rss = read_tsv(os.path.join(out, tag + ".rss.tsv"))[1:]
    r["rss"] = [(int(t), int(a), int(b), l) for t, a, b, l in rss if a and b]
    r["loads"] = [float(x[3]) for x in r["rss"]]
    r["facts"] = {k: (v, l) for k, v, l in read_tsv(os.path.join(out, tag + ".facts.tsv"))}
    stop = read_tsv(os.path.join(out, tag + ".rss-stop.tsv"))[1:]
    r["rss_stop_max"] = max((int(a) for _, a, _, _ in stop if a), default=0)
    return r


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def spread(xs, fmt):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    m = fmt(statistics.median(xs))
    if len(xs) > 1:
        m += f" [{fmt(min(xs))}-{fmt(max(xs))}]"
    return m


def fnum(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def main():
    out, rounds, targets = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    res = {}
    for t in targets:
        rs = [load_round(out, f"{t}.r{i}") for i in range(1, rounds + 1)]
        res[t] = [r for r in rs if r is not None]
        if not res[t]:
            print(f"{NAMES.get(t, t)}: no fio results (see {out})")
    targets = [t for t in targets if res[t]]
    if not targets:
        return
    both = "tarn" in targets and len(targets) > 1
    peer = next((t for t in targets if t != "tarn"), None)
    note = " (median of the rounds, range in brackets)" if rounds > 1 else ""

    print(f"== per minute{note}: write IOPS (mean of the 1-second samples; a second without any completion "
          "counts as 0), the slowest second's IOPS, the slowest write (ms), server VmRSS at the minute's end (MiB)")
    minutes = sorted(set(m for t in targets for r in res[t] for m in r["min_iops"]))
    hdr = f"{'min':>4}"
    for t in targets:
        n = NAMES.get(t, t)
        hdr += f" | {n + ' IOPS':>22} {'worst 1s':>9} {'max ms':>8} {'RSS':>6}"
    if both:
        hdr += f" | {'tarn/' + NAMES.get(peer, peer):>20}"
    print(hdr)
    print("-" * len(hdr))
    for m in minutes:
        line = f"{m + 1:>4}"
        partial = False
        iops_of = {}
        for t in targets:
            vals = [r["min_iops"][m][0] for r in res[t] if m in r["min_iops"]]
            partial |= any(r["min_iops"][m][1] < 50 for r in res[t] if m in r["min_iops"])
            iops_of[t] = med(vals)
            worst = med([r["min_worst_iops"][m][0] for r in res[t] if m in r["min_worst_iops"]])
            mx = med([r["min_worst_ms"][m][0] for r in res[t] if m in r["min_worst_ms"]])
            rss = med([rss_at(r["rss"], (m + 1) * 60) for r in res[t]])
            line += f" | {spread(vals, lambda x: f'{x:.0f}'):>22} {fmt_opt(worst, '.0f'):>9} {fmt_opt(mx, '.1f'):>8} " \
                    f"{fmt_opt(rss and rss / 1024, '.0f'):>6}"
        if both and iops_of.get("tarn") and iops_of.get(peer):
            line += f" | {iops_of['tarn'] / iops_of[peer]:>19.2f}x"
        print(line + ("   (partial minute)" if partial else ""))
    print()

    print(f"== whole run{note}")
    hdr = (f"{'target':16} {'writes':>10} {'IOPS':>16} {'last/first min':>15} {'p50 us':>8} {'p99 us':>8} "
           f"{'p99.9 us':>9} {'p99.99 us':>10} {'max ms':>8} {'flushes':>8} {'flush mean/max ms':>18} "
           f"{'1s < half median':>17} {'RSS max MiB':>12} {'load1':>10}")
    print(hdr)
    print("-" * len(hdr))
    summary = {}
    for t in targets:
        rs = res[t]
        lf = [last_first(r) for r in rs]
        summary[t] = {"iops": med([r["iops"] for r in rs]), "lf": med(lf),
                      "max_ms": max(r["max_ms"] for r in rs),
                      "rss_max": max((max((x[1] for x in r["rss"]), default=0) for r in rs), default=0),
                      "hwm": max((max((x[2] for x in r["rss"]), default=0) for r in rs), default=0)}
        loads = [x for r in rs for x in r["loads"]]
        print(f"{NAMES.get(t, t):16} {med([r['ios'] for r in rs]):>10.0f} {spread([r['iops'] for r in rs], lambda x: f'{x:.0f}'):>16} "
              f"{spread(lf, lambda x: f'{x:.2f}x'):>15} {med([r['p50'] for r in rs]):>8.0f} {med([r['p99'] for r in rs]):>8.0f} "
              f"{med([r['p999'] for r in rs]):>9.0f} {med([r['p9999'] for r in rs]):>10.0f} "
              f"{spread([r['max_ms'] for r in rs], lambda x: f'{x:.1f}'):>8} {med([r['flushes'] for r in rs]):>8.0f} "
              f"{med([r['flush_mean_ms'] for r in rs]):>8.1f}/{max(r['flush_max_ms'] for r in rs):<9.1f} "
              f"{med([r['stall_secs'] for r in rs]):>17.0f} {summary[t]['rss_max'] / 1024:>12.0f} "
              f"{(f'{min(loads):.1f}-{max(loads):.1f}' if loads else '-'):>10}")
        for r in rs:
            if r["err"]:
                print(f"  ({r['tag']}: fio error {r['err']})")
    if both and summary[peer]["iops"]:
        print(f"\ntarn / {NAMES.get(peer, peer)} IOPS over the run: {summary['tarn']['iops'] / summary[peer]['iops']:.2f}x")
    print("'1s < half median': seconds whose IOPS fell below half the run's median second (stalls)")
    print()

    print("== memory: server VmRSS (MiB) during the run, sampled every few seconds")
    for t in targets:
        r = res[t][0]
        pts = [rss_at(r["rss"], s) for s in (10, 60, 120, 300, 600, r["secs"])]
        labels = ["10 s", "1 min", "2 min", "5 min", "10 min", "end"]
        desc = ", ".join(f"{lab} {p / 1024:.0f}" for lab, p in zip(labels, pts) if p is not None)
        print(f"{NAMES.get(t, t):16} {desc}; VmHWM {summary[t]['hwm'] / 1024:.0f}; while stopping "
              f"{r['rss_stop_max'] / 1024:.0f}")
    print()

    print("== after the run (round 1; ms = wall time of the command, process start included; load1 at the end)")
    for t in targets:
        r = res[t][0]
        print(f"{NAMES.get(t, t)}:")
        for k, (v, l) in r["facts"].items():
            if k.startswith("load1 at fio") or k == "fio exit" and v == "0":
                continue
            vv = v
            if k.endswith("bytes") and fnum(v) is not None:
                vv = f"{int(v)} ({int(v) / MIB:.1f} MiB)"
            elif k.endswith("kB") and fnum(v) is not None:
                vv = f"{int(v) / 1024:.0f} MiB"
            print(f"  {k:52} {vv:>28}   {l if l != '-' else ''}")
        f = r["facts"]
        ext, meta = fnum(f.get("extents", ("",))[0]), fnum(f.get("metadata bytes", ("",))[0])
        if ext and meta:
            print(f"  {'metadata bytes per extent':52} {meta / ext:>28.1f}")
        if ext and summary[t]["hwm"]:
            print(f"  {'VmHWM bytes per extent':52} {summary[t]['hwm'] * 1024 / ext:>28.1f}")
    print()

    if "tarn" in targets:
        r = res["tarn"][0]
        f = r["facts"]
        ext = fnum(f.get("extents", ("",))[0]) or 0
        print(f"== targets (tarn, round 1; at {ext / 1e6:.1f} M extents; the targets are set at >= 10 M)")
        check("last-minute IOPS >= 0.9x first minute", last_first(r), lambda x: x >= 0.9, "{:.2f}x")
        check("worst write latency <= 100 ms", r["max_ms"], lambda x: x <= 100, "{:.1f} ms")
        cache_mib = (fnum(f.get("metadata cache bytes", ("",))[0]) or 0) / 2**20
        check(f"resident memory <= cache + 100 MiB (metadata cache {cache_mib:.0f} MiB)",
              summary["tarn"]["hwm"] / 1024, lambda x: x <= cache_mib + 100, "VmHWM {:.0f} MiB")
        for key, label in (("open (start to first NBD answer, cold cache) ms", "open <= 1 s"),
                           ("vol list (server) ms", "vol list <= 1 s (through the server)"),
                           ("vol list (offline, cold cache) ms", "vol list <= 1 s (offline: pool open included)")):
            v = fnum(f.get(key, ("",))[0])
            check(label, v, lambda x: x <= 1000, "{:.0f} ms")


def rss_at(rss, secs):
    """VmRSS (kB) of the last sample at or before secs, None past the end."""
    if not rss or secs is None or secs > rss[-1][0] + 10:
        return None
    best = None
    for t, a, _, _ in rss:
        if t <= secs:
            best = a
    return best


def last_first(r):
    mi = r["min_iops"]
    full = [m for m in sorted(mi) if mi[m][1] >= 50]
    if len(full) < 2:
        return None
    return mi[full[-1]][0] / mi[full[0]][0] if mi[full[0]][0] else None


def fmt_opt(x, f):
    return "-" if x is None else format(x, f)


def check(label, v, ok, fmt):
    if v is None:
        print(f"target: {label}: not measured")
    else:
        print(f"target: {label}: {fmt.format(v)} -> {'met' if ok(v) else 'MISSED'}")


if __name__ == "__main__":
    main()
