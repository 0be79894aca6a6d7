#!/usr/bin/env bash
# File-system hints benchmark (issue "File-system hints", seed 002): how
# much faster e2fsck reads an aged ext4 whose metadata tarn has moved
# together. Needs root (loop device, mount), nbdfuse, e2fsprogs.
#
# 1. A pool on a data device (DATA_SIZE, sparse file) plus a small device
#    kept for metadata (served with --metadata-device, so data avoids it);
#    an ext4 on a volume through nbdfuse + loop, aged by bench/fs_age.py
#    (source trees unpacked, patched, built, cleaned and deleted, round
#    after round, to about AGE_GIB GiB written).
# 2. Three configurations of the same volume, measured in this order
#    (each with cold workloads: e2fsck -fn; find | stat of every file on a
#    read-only mount; and the thesis's online work timed on the real
#    device: untar of a source tree, rm -rf of it, a 1 GiB sequential
#    write, each synced):
#      none     as aged;
#      cluster  `tarn vol hint VOL`: metadata in one clustered run of the
#               data device;
#      device   `tarn vol unhint` then `tarn vol hint --metadata-device`:
#               metadata on its own device.
#    Each: the server restarted with --trace (its caches cold), the pool
#    files evicted from the page cache (those files only), `e2fsck -fn -tt`
#    on the loop device (real seconds per pass on the file device), then
#    the trace's reads priced by bench/fsck_model.py on a modeled 7,200
#    rpm disk per pool device (the metadata device modeled once as a disk
#    of its own and once as flash), per kind of block read.
#
#   sudo bash bench/hints.sh
# Env: FS_TYPE=ext4 (or ext3, ext2) AGE_GIB=2 KEEP=12 (source trees kept) VOL_SIZE=8G DATA_SIZE=16G META_SIZE=1G ROUNDS=1
#      READAHEAD= (the loop device's readahead in 512-byte sectors for the
#      fsck runs; empty: the kernel's default, whose reads of neighbouring
#      data blocks show as "data" in the model; when set, the loop device
#      also reads its nbdfuse file with direct I/O, so the FUSE page
#      cache's readahead stays out too)
#      BENCH_DIR=/var/tmp/tarn-hints TARN=target/release/tarn
# Output: bench/results/<date>-hints.txt
set -euo pipefail
BENCH=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$BENCH/.." && pwd)
TARN=${TARN:-$REPO/target/release/tarn}
AGE_GIB=${AGE_GIB:-2}
KEEP=${KEEP:-12}
VOL_SIZE=${VOL_SIZE:-8G}
DATA_SIZE=${DATA_SIZE:-16G}
META_SIZE=${META_SIZE:-1G}
FS_TYPE=${FS_TYPE:-ext4}
READAHEAD=${READAHEAD:-}
DIR=${BENCH_DIR:-/var/tmp/tarn-hints}
STAMP=$(date +%Y-%m-%d-%H%M%S)  # seconds: two runs started in one minute kept apart
OUT=$BENCH/results/$STAMP-hints.txt
SYSPY=/usr/bin/python3
PORT=${PORT:-$("$SYSPY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
export LC_ALL=C
for c in nbdfuse fusermount3 losetup mkfs.ext4 e2fsck jq; do
  command -v $c >/dev/null || { echo "hints: $c missing, run: bash scripts/deps.sh" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "hints: needs root (loop device, mount)" >&2; exit 1; }
[ -x "$TARN" ] || { echo "hints: $TARN not built (cargo build --release -p tarn-cli)" >&2; exit 1; }

rm -rf "$DIR"; mkdir -p "$DIR/fuse" "$DIR/mnt" "$BENCH/results"
POOL=$DIR/pool.img META=$DIR/meta.img VOL=fs
SRV=
FUSE_PID=
LOOP=
cleanup() {
  set +e
  mountpoint -q "$DIR/mnt" && umount "$DIR/mnt"
  [ -n "$LOOP" ] && losetup -d "$LOOP"
  mountpoint -q "$DIR/fuse" && fusermount3 -u "$DIR/fuse"
  [ -n "$SRV" ] && kill -TERM "$SRV" && wait "$SRV"
  rm -f "$POOL" "$META"
}
trap cleanup EXIT
exec > >(tee "$OUT") 2>&1

serve() { # [--trace FILE]
  "$TARN" serve -p "$POOL" --listen 127.0.0.1:$PORT --compact-idle 0 --metadata-device "$META" "$@" \
    >>"$DIR/serve.log" 2>&1 &
  SRV=$!
  for _ in $(seq 100); do nbdinfo --can connect "nbd://127.0.0.1:$PORT/$VOL" 2>/dev/null && return; sleep 0.1; done
  echo "hints: tarn serve did not start"; tail "$DIR/serve.log"; exit 1
}
unserve() { kill -TERM "$SRV"; wait "$SRV" || true; SRV=; }
attach() {
  nbdfuse "$DIR/fuse/disk" "nbd://127.0.0.1:$PORT/$VOL" >>"$DIR/nbdfuse.log" 2>&1 &
  FUSE_PID=$!
  for _ in $(seq 100); do [ -s "$DIR/fuse/disk" ] && break; sleep 0.1; done
  LOOP=$(losetup -f --show ${READAHEAD:+--direct-io=on} "$DIR/fuse/disk")
}
detach() {
  sync
  mountpoint -q "$DIR/mnt" && umount "$DIR/mnt"
  blockdev --flushbufs "$LOOP"; losetup -d "$LOOP"; LOOP=
  fusermount3 -u "$DIR/fuse"; wait "$FUSE_PID" || true; FUSE_PID=
}
evict() {
  "$SYSPY" -c 'import os,sys
for p in sys.argv[1:]:
    fd=os.open(p,os.O_RDONLY); os.fdatasync(fd); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED); os.close(fd)' "$POOL" "$META"
}

echo "tarn hints benchmark $STAMP ($(uname -r), $(nproc) cpus; git $(git -C "$REPO" rev-parse --short HEAD))"
echo "aged $FS_TYPE: ~$AGE_GIB GiB written on a $VOL_SIZE volume; data device $DATA_SIZE, metadata device $META_SIZE"
truncate -s "$META_SIZE" "$META"
"$TARN" pool create "$POOL" --size "$DATA_SIZE" --device "$META" >/dev/null
"$TARN" vol create $VOL --size "$VOL_SIZE" -p "$POOL" >/dev/null
serve
attach
mkfs.ext4 -q -F -t "$FS_TYPE" "$LOOP"
mount -t "$FS_TYPE" "$LOOP" "$DIR/mnt"
t0=$(date +%s)
"$SYSPY" "$BENCH/fs_age.py" "$DIR/mnt" "$AGE_GIB" "$KEEP"
echo "aging took $(( $(date +%s) - t0 )) s; df: $(df -h --output=used,iused "$DIR/mnt" | tail -1)"
detach
"$TARN" vol classify $VOL -p "$POOL" --runs --json >"$DIR/classify.json"
echo "classifier: $("$TARN" vol classify $VOL -p "$POOL" | tr '\n' ' ')"
unserve

read -r -a BLOCKS <<<"$("$TARN" pool status -p "$POOL" --json | jq -r '[.devices[].size / 4096 | floor] | join(" ")')"

# One workload on the loop device, cold: fsck (e2fsck -fn -tt) or stat
# (mounted read-only without journal replay: find | stat of every file).
workload() { # fsck|stat
  case $1 in
    fsck) /usr/bin/time -f "e2fsck wall %e s" e2fsck -fn -tt "$LOOP" 2>&1 | grep -E "^Pass [1-5]:.*time|e2fsck wall" ;;
    stat)
      local opts=ro; [ "$FS_TYPE" = ext2 ] || opts=ro,noload
      mount -t "$FS_TYPE" -o $opts "$LOOP" "$DIR/mnt"
      /usr/bin/time -f "find | stat wall %e s" bash -c "find '$DIR/mnt' -print0 | xargs -0 stat >/dev/null" 2>&1
      umount "$DIR/mnt" ;;
    online) # the thesis's online work, timed on the real device
      mount -t "$FS_TYPE" "$LOOP" "$DIR/mnt"
      /usr/bin/time -f "untar wall %e s" bash -c "tar xf '$DIR/tree.tar' -C '$DIR/mnt' && sync" 2>&1
      /usr/bin/time -f "rm -rf wall %e s" bash -c "rm -rf '$DIR/mnt/tree' && sync" 2>&1
      /usr/bin/time -f "1 GiB sequential write wall %e s" \
        dd if=/dev/zero of="$DIR/mnt/big" bs=1M count=1024 conv=fsync status=none 2>&1
      rm -f "$DIR/mnt/big"
      umount "$DIR/mnt" ;;
  esac
}

measure() { # CONFIG WORKLOAD
  local name=$1-$2
  evict
  serve --trace "$DIR/$name.trace"
  attach
  [ -n "$READAHEAD" ] && blockdev --setra "$READAHEAD" "$LOOP"
  echo; echo "== $1, $2 (loop readahead $(blockdev --getra "$LOOP") sectors, direct I/O $(cat /sys/block/"${LOOP#/dev/}"/loop/dio))"
  workload "$2" | sed 's/^/  /'
  detach
  unserve
  "$TARN" trace print "$DIR/$name.trace" >"$DIR/$name.trace.txt"
  "$TARN" vol map $VOL -p "$POOL" --json >"$DIR/$name.map.json"
  echo "  blocks on the metadata device: $(jq '[.[] | select(.[2] == 1) | .[1]] | add // 0' "$DIR/$name.map.json")"
  local model=("$SYSPY" "$BENCH/fsck_model.py" "$DIR/$name.trace.txt" "$DIR/$name.map.json" "$DIR/classify.json")
  # A second disk the data device's size (a real disk, not a 1G one:
  # the model's seek time grows with the share of the disk crossed).
  echo "  modeled, every device a 7,200 rpm disk of the data device's size:"
  "${model[@]}" "${BLOCKS[0]}" "${BLOCKS[0]}" | sed 's/^/    /'
  "${model[@]}" "${BLOCKS[0]}" "${BLOCKS[0]}" --json >"$DIR/$name.disk.json"
  echo "  modeled, the metadata device as flash:"
  "${model[@]}" "${BLOCKS[0]}" "ssd:${BLOCKS[1]}" | sed 's/^/    /'
  "${model[@]}" "${BLOCKS[0]}" "ssd:${BLOCKS[1]}" --json >"$DIR/$name.ssd.json"
}

# A source tree as a tarball for the online workload (untar, rm -rf).
"$SYSPY" -c 'import random, sys; sys.path.insert(0, sys.argv[1]); import fs_age; fs_age.unpack(random.Random(3), sys.argv[2], "tree")' \
  "$BENCH" "$DIR/src"
tar cf "$DIR/tree.tar" -C "$DIR/src" tree && rm -rf "$DIR/src"

measure none fsck
measure none stat
measure none online
"$TARN" vol hint $VOL -p "$POOL" --json 2>/dev/null | jq -c . | sed 's/^/hint (cluster): /'
measure cluster fsck
measure cluster stat
measure cluster online
"$TARN" vol unhint $VOL -p "$POOL" --json 2>/dev/null | jq -c . | sed 's/^/unhint: /'
"$TARN" vol hint $VOL -p "$POOL" --metadata-device "$META" --json 2>/dev/null | jq -c . | sed 's/^/hint (device): /'
measure device fsck
measure device stat
measure device online

for w in fsck stat; do
echo; echo "== summary, $w: modeled time and seeks, as a ratio to no hints"
"$SYSPY" - "$DIR" "$w" <<'PY'
import json, sys
d, w = sys.argv[1], sys.argv[2]
get = lambda n, m: json.load(open(f"{d}/{n}-{w}.{m}.json"))
base = get("none", "disk")
def row(label, r):
    t, s = r["total"], base["total"]
    dt = r["kinds"].get("directory", {"ms": 0, "seeks": 0}); db = base["kinds"].get("directory", {"ms": 0, "seeks": 0})
    print(f"{label:34} {t['ms']/1e3:8.2f} s {s['ms']/max(t['ms'],1e-9):6.2f}x faster  seeks {t['seeks']:7} "
          f"({s['seeks']/max(t['seeks'],1):5.2f}x fewer)  directory reads {db['ms']/max(dt['ms'],1e-9):5.2f}x faster")
row("none (disk)", base)
row("cluster on the data device (disk)", get("cluster", "disk"))
row("metadata device (a second disk)", get("device", "disk"))
row("metadata device (flash)", get("device", "ssd"))
PY
done
echo; echo "== summary, online: wall seconds on the real device (none, cluster, device; hints change no write path)"
for k in "untar" "rm -rf" "1 GiB sequential write"; do
  printf '%-24s' "$k"; grep "^  $k wall" "$OUT" | awk '{printf " %8s", $(NF-1)}'; echo
done
echo "results: $OUT"
