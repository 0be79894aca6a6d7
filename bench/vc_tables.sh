#!/usr/bin/env bash
# The Virtual Contiguity paper's Tables 1-3 (seed 001) from tarn's
# placements: three generated workloads (bench/vc_workload.py:
# instructional, research, web server; the UC HP-UX traces the paper used
# are not available) replayed with `tarn trace replay` against each
# placement, a snapshot per simulated day, and the figures per file beside
# the paper's. Small-block next-fit (the paper's FFS) is `linear`; large
# blocks are the region size (256 KiB), whose seeks are by definition
# virtual contiguity's, so only their internal fragmentation is shown.
#
#   bash bench/vc_tables.sh        env: DAYS=10 SCALE=1 CHUNK=8192 STREAMS=4 SEED=1
#   POLICIES="linear inplace append contiguous"
# Output: bench/results/<date>-vc.txt (raw JSON in bench/results/raw/<date>-vc/).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
TARN=${TARN:-$REPO/target/release/tarn}
STAMP=$(date +%Y-%m-%d-%H%M%S)  # seconds: two runs started in one minute kept apart
RAW=$REPO/bench/results/raw/$STAMP-vc
OUT=$REPO/bench/results/$STAMP-vc.txt
POLICIES=${POLICIES:-linear inplace append contiguous}
mkdir -p "$RAW"
[ -x "$TARN" ] || { echo "build first: cargo build --release ($TARN missing)" >&2; exit 1; }
for w in instructional research webserver; do
  python3 "$REPO/bench/vc_workload.py" "$w" "$RAW/$w.trc" "$RAW/$w.files.json" --days "${DAYS:-10}" \
    --scale "${SCALE:-1}" --chunk "${CHUNK:-8192}" --streams "${STREAMS:-4}" --seed "${SEED:-1}" | tee "$RAW/$w.gen.txt"
  for p in $POLICIES; do
    "$TARN" trace replay "$RAW/$w.trc" --placement "$p" --snapshot-every 86400 --files "$RAW/$w.files.json" \
      --dir "$RAW" --json >"$RAW/$w.$p.json"
  done
  # The paper's own rule for a region's first home: a search from a
  # uniformly random start (not tarn's default, the data cursor).
  if [[ " $POLICIES " == *" contiguous "* ]]; then
    "$TARN" trace replay "$RAW/$w.trc" --placement contiguous --region-start random --snapshot-every 86400 \
      --files "$RAW/$w.files.json" --dir "$RAW" --json >"$RAW/$w.contiguous-random.json"
  fi
done
python3 - "$RAW" "$POLICIES" "$STAMP" <<'PY' | tee "$OUT"
import json, sys
raw, policies, stamp = sys.argv[1], sys.argv[2].split(), sys.argv[3]
W = ["instructional", "research", "webserver"]
# The paper's figures (seed 001, Tables 1-3); research = its "Research" trace.
paper_frag = {"instructional": (66.84, 98.45), "research": (71.47, 97.61), "webserver": (16.97, 82.88)}
paper_density = {"instructional": (97.00, 91.10, 88.42), "research": (99.59, 91.82, 90.96), "webserver": (99.70, 96.73, 86.35)}
paper_seeks = {"instructional": (1.51, 7.85, 1.07, 1.21), "research": (1.11, 4.63, 1.07, 1.27), "webserver": (1.94, 68.26, 1.88, 1.86)}
def load(w, p):
    return json.load(open(f"{raw}/{w}.{p}.json"))
print(f"tarn VC tables {stamp}: generated workloads, a snapshot per simulated day, per-file figures")
print(open(f"{raw}/instructional.gen.txt").read().strip())
print(open(f"{raw}/research.gen.txt").read().strip())
print(open(f"{raw}/webserver.gen.txt").read().strip())
print("\n== Table 1: internal fragmentation (% of allocated space unused)")
print(f"{'workload':<14} {'SB (4 KiB)':>12} {'LB (256 KiB)':>13} {'VC':>8}   paper: SB / LB")
for w in W:
    f = load(w, "linear")["files"]
    print(f"{w:<14} {100*f['internal_fragmentation']:>11.2f}% {100*f['internal_fragmentation_large_blocks']:>12.2f}% "
          f"{100*f['internal_fragmentation']:>7.2f}%   {paper_frag[w][0]:.2f}% / {paper_frag[w][1]:.2f}%")
print("\n== Table 2: density of files under `contiguous` (VC), all / rewritten after a snapshot")
print("read: the paper's density, the file's share of the blocks its reads fetch (a logical region read")
print("      in physical order, gaps under a region read through); windows: how full (with any view's data)")
print("      the 256 KiB physical windows the read visits")
print("COWed segs: the logical regions of rewritten files holding a block a snapshot maps elsewhere")
print(f"{'workload':<14} {'read all':>9} {'read COWed':>11} {'COWed segs':>11} {'windows all':>12} {'windows COWed':>14}"
      "   paper: all / COWed files / COWed segs")
for w in W:
    f = load(w, "contiguous")["files"]
    a, c, s = f["all"], f["rewritten_after_snapshot"], f["copied_regions"]
    pd = paper_density[w]
    print(f"{w:<14} {100*a['read_density']:>8.2f}% {100*c['read_density']:>10.2f}% {100*s['read_density']:>10.2f}% "
          f"{100*a['density']:>11.2f}% {100*c['density']:>13.2f}%   {pd[0]:.2f}% / {pd[1]:.2f}% / {pd[2]:.2f}%")
if "linear" in policies:
    print("the same read densities under `linear` (small-block next-fit), all / COWed files / COWed segs:")
    for w in W:
        f = load(w, "linear")["files"]
        print(f"{w:<14} {100*f['all']['read_density']:>8.2f}% {100*f['rewritten_after_snapshot']['read_density']:>10.2f}% "
              f"{100*f['copied_regions']['read_density']:>10.2f}%")
def table3(key, title):
    print(f"\n== Table 3{title}")
    head = "".join(f" {p + ' all':>16} {p + ' COW':>16}" for p in policies)
    print(f"{'workload':<14}{head}   paper: FFS, FFS(COW), VC, VC(COW)")
    for w in W:
        row = ""
        for p in policies:
            f = load(w, p)["files"]
            row += f" {f['all'][key]:>16.2f} {f['rewritten_after_snapshot'][key]:>16.2f}"
        ps = paper_seeks[w]
        print(f"{w:<14}{row}   {ps[0]}, {ps[1]}, {ps[2]}, {ps[3]}")
table3("seeks_per_file", ": average seeks to read a file, every physical discontiguity a seek (all / rewritten after a snapshot)")
table3("read_seeks", "b: the same, a logical region read whole with gaps under a region read through (the paper's VC reads)")
def ratio(lkey, ckey, title):
    print(f"\n== seeks per COWed file, linear / contiguous, {title} (paper, web server: FFS 68.26 / VC 1.86 = 36.7x; target >= 10x)")
    for w in W:
        l = load(w, "linear")["files"]["rewritten_after_snapshot"][lkey]
        c = load(w, "contiguous")["files"]["rewritten_after_snapshot"][ckey]
        print(f"{w:<14} {l:.2f} / {c:.2f} = {l / c:.1f}x")
def segments(w):
    """Logical 256 KiB segments per file, all / rewritten: the paper's
    VC seeks by its definition ("LB and VC have the same number of
    seeks": one read per segment, wherever its copies went)."""
    files = json.load(open(f"{raw}/{w}.files.json"))
    def n(f):
        return len({r for o, l in f["extents"] for r in range(o // 262144, (o + l - 1) // 262144 + 1)})
    a = [n(f) for f in files]
    c = [n(f) for f in files if f["rewritten"]]
    return sum(a) / max(len(a), 1), sum(c) / max(len(c), 1)
if "linear" in policies and "contiguous" in policies:
    ratio("seeks_per_file", "seeks_per_file", "both counting every discontiguity")
    ratio("read_seeks", "read_seeks", "both reading regions whole")
    ratio("seeks_per_file", "read_seeks", "as the paper counts: linear every discontiguity, contiguous regions whole")
    print("\n== the same with the paper's random start for a region's first home (`--region-start random`):")
    print("   reads per COWed file, density all / COWed files / COWed segs, and linear / contiguous as the paper counts")
    for w in W:
        l = load(w, "linear")["files"]["rewritten_after_snapshot"]["seeks_per_file"]
        f = load(w, "contiguous-random")["files"]
        c = f["rewritten_after_snapshot"]["read_seeks"]
        d = (f["all"]["read_density"], f["rewritten_after_snapshot"]["read_density"], f["copied_regions"]["read_density"])
        print(f"{w:<14} {c:.2f}   {100*d[0]:.2f}% / {100*d[1]:.2f}% / {100*d[2]:.2f}%   {l:.2f} / {c:.2f} = {l / c:.1f}x")
    print("\n== the paper's VC count by its definition (one read per 256 KiB segment, = large blocks): segments per file,")
    print("   all / rewritten, and linear / that (what the paper's 36.7x is; tarn's counts above are physical)")
    for w in W:
        l = load(w, "linear")["files"]["rewritten_after_snapshot"]["seeks_per_file"]
        a, c = segments(w)
        print(f"{w:<14} {a:.2f} / {c:.2f}   {l:.2f} / {c:.2f} = {l / c:.1f}x")
PY
rm -f "$RAW"/*.trc
echo "results: $OUT (raw in $RAW)"
