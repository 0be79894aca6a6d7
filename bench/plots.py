#!/usr/bin/env python3
"""Plots beside the benchmark tables (PNG, matplotlib: python3-matplotlib,
installed by `bash scripts/deps.sh --bench`).

  plots.py aging OUT ROUNDS PREFIX TARGET...   bench/aging.sh's raw files ->
      PREFIX-iops.png     write IOPS per second over the run (thin) and per
                          minute (thick), one colour per target, round 1
      PREFIX-latency.png  write completion latency CDF per target (fio JSON
                          clat percentiles), log x
  plots.py run MANIFEST PREFIX                 bench/run.sh's manifest ->
      PREFIX-ratios.png   tarn IOPS / each peer's, per workload (log y, 1x line)
      PREFIX-latency.png  completion latency CDFs per workload and target

Prints the path of each file written.
"""
import os
import sys

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # files only: no display on a benchmark machine
import matplotlib.pyplot as plt  # noqa: E402

from fio_json import load_job  # noqa: E402

NAMES = {"tarn": "tarn", "qemu": "qemu-nbd", "nbdkit": "nbdkit-file", "raw": "raw-file",
         "tarn_nosum": "tarn-no-checksums", "tarn_b": "tarn-b"}
# One colour per target in every plot (tarn's the same as in `tarn map`'s first volume).
COLOURS = {"tarn": "#1f77b4", "qemu": "#ff7f0e", "nbdkit": "#2ca02c", "raw": "#7f7f7f",
           "tarn_nosum": "#9467bd", "tarn_b": "#17becf"}


def colour(t):
    return COLOURS.get(t, None)


def clat_cdf(side):
    """[(latency us, fraction)] from a fio JSON direction's clat percentiles."""
    pct = side.get("clat_ns", {}).get("percentile", {})
    return sorted((v / 1e3, float(p) / 100.0) for p, v in pct.items() if v > 0)


def save(fig, path):
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(path)


def cdf_axes(ax, title):
    """Log x; a logit y, which spreads both ends: the median region and
    the 99th-99.99th percentiles, where servers differ."""
    ax.set_xscale("log")
    ax.set_yscale("logit")
    ticks = [0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999, 0.99999]
    ax.set_yticks(ticks)
    ax.set_yticklabels(["1%", "10%", "50%", "90%", "99%", "99.9%", "99.99%", "99.999%"])
    ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_ylim(0.005, 0.999995)
    ax.set_xlabel("completion latency (us)")
    ax.set_ylabel("requests done within")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)


def plot_cdf(ax, points, label, col):
    xs = [x for x, _ in points]
    ys = [min(max(f, 1e-5), 1 - 1e-5) for _, f in points]
    ax.plot(xs, ys, marker=".", label=label, color=col)


def aging(out, rounds, prefix, targets):
    import aging_report as ar

    runs = {t: ar.load_round(out, f"{t}.r1") for t in targets}
    runs = {t: r for t, r in runs.items() if r}
    if not runs:
        print(f"plots: no aging results in {out}", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(10, 5))
    for t, r in runs.items():
        secs = [ms / 1000 for ms, _ in r["sec_iops"]]
        ax.plot(secs, [v / 1000 for _, v in r["sec_iops"]], lw=0.8, alpha=0.6, color=colour(t))
        # Each minute's mean as a bar across that minute (a step plot
        # would draw nothing for a run of one minute).
        end = secs[-1] if secs else 0
        xs, ys = [], []
        for m, (v, _) in sorted(r["min_iops"].items()):
            xs += [m * 60, min((m + 1) * 60, end), float("nan")]
            ys += [v / 1000, v / 1000, float("nan")]
        ax.plot(xs, ys, lw=2.5, color=colour(t), label=f"{NAMES.get(t, t)} (per-minute mean; thin: per second)")
    ax.set_xlabel("seconds into the run")
    ax.set_ylabel("write IOPS (thousands)")
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    ax.set_title(f"aging: 4K random writes, QD32, flush every 256 ({os.path.basename(out)})", fontsize=10)
    ax.legend(loc="lower left", fontsize=9)
    fig.tight_layout()
    save(fig, prefix + "-iops.png")

    fig, ax = plt.subplots(figsize=(7, 5))
    for t in runs:
        job = load_job(os.path.join(out, f"{t}.r1.json"))
        pts = clat_cdf(job["write"]) if job else []
        if pts:
            plot_cdf(ax, pts, NAMES.get(t, t), colour(t))
    cdf_axes(ax, "aging: write latency (whole run)")
    ax.legend(fontsize=9)
    fig.tight_layout()
    save(fig, prefix + "-latency.png")


def manifest_jobs(path):
    """{(workload, target): fio job} from bench/run.sh's manifest, in order."""
    jobs, order = {}, []
    for line in open(path):
        f = line.rstrip("\n").split("\t")
        if len(f) < 3:
            continue
        wl, tgt, js = f[0], f[1], f[2]
        if wl not in order:
            order.append(wl)
        job = None if js == "-" else load_job(js)
        if job is not None:
            jobs[(wl, tgt)] = job
    return jobs, order


def iops(job):
    return sum(job[d]["iops"] for d in ("read", "write"))


def run(manifest, prefix):
    from report import DESC

    jobs, order = manifest_jobs(manifest)
    targets = []
    for _, t in jobs:
        if t not in targets:
            targets.append(t)
    peers = [t for t in targets if t != "tarn"]
    if "tarn" in targets and peers:
        ratios(jobs, order, peers, DESC, prefix)
    n = len(order)
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), squeeze=False)
    for i, wl in enumerate(order):
        ax = axes[i // cols][i % cols]
        for t in targets:
            job = jobs.get((wl, t))
            if job is None:
                continue
            side = job["write"] if job["write"]["io_bytes"] else job["read"]
            pts = clat_cdf(side)
            if pts:
                plot_cdf(ax, pts, NAMES.get(t, t), colour(t))
        cdf_axes(ax, DESC.get(wl, wl))
        ax.legend(fontsize=8)
    for j in range(n, rows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.suptitle(f"completion latency per workload ({os.path.basename(os.path.dirname(manifest))})", fontsize=11)
    fig.tight_layout()
    save(fig, prefix + "-latency.png")


def ratios(jobs, order, peers, desc, prefix):
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(order)), 4.5))
    width = 0.8 / len(peers)
    for k, p in enumerate(peers):
        xs, ys = [], []
        for i, wl in enumerate(order):
            a, b = jobs.get((wl, "tarn")), jobs.get((wl, p))
            if a and b and iops(b) > 0:
                xs.append(i + (k - (len(peers) - 1) / 2) * width)
                ys.append(iops(a) / iops(b))
        bars = ax.bar(xs, ys, width, label=f"tarn / {NAMES.get(p, p)}", color=colour(p))
        ax.bar_label(bars, fmt="%.2fx", fontsize=7, padding=2)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_yscale("log")
    # Ratios read as "2x" and "0.5x", not as powers of ten.
    ax.yaxis.set_major_locator(matplotlib.ticker.FixedLocator([0.125, 0.25, 0.5, 1, 2, 4, 8, 16]))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}x"))
    ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xticks(range(len(order)))
    ax.set_xticklabels([desc.get(w, w) for w in order], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("tarn IOPS / peer IOPS (above 1: tarn faster)")
    ax.set_title("tarn against its peers, per workload", fontsize=10)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, prefix + "-ratios.png")


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if len(sys.argv) >= 5 and sys.argv[1] == "aging":
        aging(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5:])
    elif len(sys.argv) == 4 and sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
