#!/usr/bin/env bash
# Striping per volume (`tarn vol create --stripe N`) against its peers, in
# one run. One tarn pool of four files (each 2x BENCH_SIZE) serves three
# volumes of BENCH_SIZE: `plain` (on member 0 only), `s2` (--stripe 2)
# and `s4` (--stripe 4, 64 KiB units), and `p3` (--parity 3: 3 data
# members + parity, 16 KiB units, every write copy-on-write with its
# row's parity). The anchor a user would pick is
# Linux md RAID-0 (64 KiB chunks) over 2 and 4 loop devices on files of
# the same file system, served by nbdkit's file plugin; and nbdkit on one
# raw file (the plain volume's peer). Per configuration, over NBD with
# fio's nbd engine: 1M sequential write (QD8, BENCH_SIZE), 1M sequential
# read (QD8, page caches dropped first), 4 KiB random write (QD32,
# BENCH_RUNTIME seconds). Configurations run in alternating order per
# round (forward on odd rounds, backward on even). Ratios: tarn sN / md
# RAID-0 over N, plain / nbdkit raw. Target (issue 12): striped sequential
# >= 0.9x md RAID-0. When the kernel has no md driver (no /proc/mdstat,
# as in some containers) the md rows say so and no ratio is made up.
# Not part of the tests.
#
#   bash bench/stripe.sh
# Env: BENCH_SIZE=1G, BENCH_ROUNDS=2, BENCH_RUNTIME=10,
#      BENCH_DIR=/var/tmp/tarn-bench, TARN=target/release/tarn
set -euo pipefail
BENCH=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$BENCH/.." && pwd)
TARN=${TARN:-$REPO/target/release/tarn}
SIZE=${BENCH_SIZE:-1G}
ROUNDS=${BENCH_ROUNDS:-2}
RUNTIME=${BENCH_RUNTIME:-10}
DIR=${BENCH_DIR:-/var/tmp/tarn-bench}/stripe.$$
OUT=$BENCH/results/$(date +%Y-%m-%d-%H%M%S)-stripe.txt
export LC_ALL=C
mkdir -p "$DIR" "$BENCH/results"
PIDS=()
LOOPS=()
MDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for m in "${MDS[@]}"; do mdadm --stop "$m" >/dev/null 2>&1 || true; done
  for l in "${LOOPS[@]}"; do losetup -d "$l" 2>/dev/null || true; done
  rm -rf "$DIR"
}
trap cleanup EXIT
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true; }
py() { python3 -c "$1"; }
port() { py 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
wait_nbd() { for _ in $(seq 1 100); do nbdinfo --size "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done; return 1; }
size_mib=$(numfmt --from=iec "$SIZE" | awk '{ print int($1 / 1048576) }')

# tarn: one pool, three volumes
pool=$DIR/pool.img
for i in 1 2 3; do truncate -s $((size_mib * 2))M "$DIR/m$i.img"; done
"$TARN" pool create "$pool" --size $((size_mib * 2))M --device "$DIR/m1.img" --device "$DIR/m2.img" --device "$DIR/m3.img" >/dev/null
"$TARN" vol create plain --size "$SIZE" --devices 0 -p "$pool" >/dev/null
"$TARN" vol create s2 --size "$SIZE" --stripe 2 -p "$pool" >/dev/null
"$TARN" vol create s4 --size "$SIZE" --stripe 4 -p "$pool" >/dev/null
"$TARN" vol create p3 --size "$SIZE" --parity 3 -p "$pool" >/dev/null
tport=$(port)
"$TARN" serve -p "$pool" --listen "127.0.0.1:$tport" --socket "$DIR/t.sock" >"$DIR/serve.log" 2>&1 &
PIDS+=($!)
wait_nbd "nbd://127.0.0.1:$tport/plain"
declare -A URI=([tarn-plain]=nbd://127.0.0.1:$tport/plain [tarn-s2]=nbd://127.0.0.1:$tport/s2 [tarn-s4]=nbd://127.0.0.1:$tport/s4 [tarn-p3]=nbd://127.0.0.1:$tport/p3)

# nbdkit on one raw file (the plain volume's peer)
truncate -s "$SIZE" "$DIR/raw.img"
kport=$(port)
nbdkit --exit-with-parent -f -p "$kport" -i 127.0.0.1 file "$DIR/raw.img" >"$DIR/nbdkit-raw.log" 2>&1 &
PIDS+=($!)
wait_nbd "nbd://127.0.0.1:$kport"
URI[nbdkit-raw]=nbd://127.0.0.1:$kport
CONFIGS=(tarn-plain nbdkit-raw tarn-s2 tarn-s4 tarn-p3)

# md RAID-0 over loop devices, if the kernel has md
MD_NOTE=
md_setup() { # N: /dev/md device over N loop devices on files of SIZE/N
  local n=$1 devs=() i l md
  for i in $(seq 1 "$n"); do
    truncate -s $((size_mib / n + 8))M "$DIR/md$n-$i.img"
    l=$(losetup -f --show "$DIR/md$n-$i.img")
    LOOPS+=("$l"); devs+=("$l")
  done
  md=/dev/md/tarn-bench-$n-$$
  mdadm --create "$md" --level=0 --raid-devices="$n" --chunk=64 --run --metadata=1.2 "${devs[@]}" >"$DIR/mdadm-$n.log" 2>&1
  MDS+=("$md")
  local p
  p=$(port)
  nbdkit --exit-with-parent -f -p "$p" -i 127.0.0.1 file "$md" >"$DIR/nbdkit-md$n.log" 2>&1 &
  PIDS+=($!)
  wait_nbd "nbd://127.0.0.1:$p"
  URI[md-raid0-$n]=nbd://127.0.0.1:$p
  CONFIGS+=("md-raid0-$n")
}
if [ ! -e /proc/mdstat ]; then
  MD_NOTE="md RAID-0: not measured: this kernel has no md driver (no /proc/mdstat; modprobe raid0 fails)"
elif ! command -v mdadm >/dev/null; then
  MD_NOTE="md RAID-0: not measured: mdadm missing (bash scripts/deps.sh --bench)"
else
  md_setup 2
  md_setup 4
fi

# fio_one URI RW BS QD [extra]: MiB/s (bw) and IOPS of one job
fio_one() {
  local uri=$1 rw=$2 bs=$3 qd=$4; shift 4
  fio --name=b --ioengine=nbd --uri="$uri" --rw="$rw" --bs="$bs" --iodepth="$qd" --size="$SIZE" \
    --output-format=json --output="$DIR/f.json" "$@" >/dev/null
  py "import json;j=json.load(open('$DIR/f.json'))['jobs'][0];d=j['write'] if j['write']['io_bytes'] else j['read'];print(round(d['bw_bytes']/1048576), round(d['iops']))"
}
declare -A SW SR RW
measure() { # CONFIG: adds its figures to the sums
  local c=$1 u=${URI[$1]} w r x
  read -r w _ < <(fio_one "$u" write 1M 8)
  drop_caches
  read -r r _ < <(fio_one "$u" read 1M 8)
  read -r _ x < <(fio_one "$u" randwrite 4k 32 --time_based --runtime="$RUNTIME")
  SW[$c]=$((${SW[$c]:-0} + w)); SR[$c]=$((${SR[$c]:-0} + r)); RW[$c]=$((${RW[$c]:-0} + x))
  echo "  $c: 1M seq write $w MiB/s, 1M seq read $r MiB/s, 4K randwrite $x IOPS"
}
ratio() { py "print(f'{$1/max($2,1):.2f}')"; }

{
  echo "stripe benchmark $(date +%F\ %T), $(git -C "$REPO" rev-parse --short HEAD), fs $(df --output=fstype "$DIR" | tail -1), load $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
  echo "volumes of $SIZE; tarn pool of 4 files of $((size_mib * 2)) MiB; fio nbd engine; $ROUNDS rounds, alternating order"
  [ -n "$MD_NOTE" ] && echo "$MD_NOTE"
  for r in $(seq 1 "$ROUNDS"); do
    order=("${CONFIGS[@]}")
    if [ $((r % 2)) = 0 ]; then mapfile -t order < <(printf '%s\n' "${CONFIGS[@]}" | tac); fi
    echo "round $r: ${order[*]}"
    for c in "${order[@]}"; do measure "$c"; done
  done
  echo "means over $ROUNDS rounds (seq write MiB/s, seq read MiB/s, 4K randwrite IOPS):"
  for c in "${CONFIGS[@]}"; do
    echo "  $c: $((SW[$c] / ROUNDS)) $((SR[$c] / ROUNDS)) $((RW[$c] / ROUNDS))"
  done
  echo "ratios (write, read, randwrite):"
  echo "  tarn-plain / nbdkit-raw: $(ratio "${SW[tarn-plain]}" "${SW[nbdkit-raw]}") $(ratio "${SR[tarn-plain]}" "${SR[nbdkit-raw]}") $(ratio "${RW[tarn-plain]}" "${RW[nbdkit-raw]}")"
  for n in 2 4; do
    echo "  tarn-s$n / tarn-plain: $(ratio "${SW[tarn-s$n]}" "${SW[tarn-plain]}") $(ratio "${SR[tarn-s$n]}" "${SR[tarn-plain]}") $(ratio "${RW[tarn-s$n]}" "${RW[tarn-plain]}")"
    if [ -n "${SW[md-raid0-$n]:-}" ]; then
      echo "  tarn-s$n / md-raid0-$n: $(ratio "${SW[tarn-s$n]}" "${SW[md-raid0-$n]}") $(ratio "${SR[tarn-s$n]}" "${SR[md-raid0-$n]}") $(ratio "${RW[tarn-s$n]}" "${RW[md-raid0-$n]}")"
    fi
  done
  echo "  tarn-p3 / tarn-plain: $(ratio "${SW[tarn-p3]}" "${SW[tarn-plain]}") $(ratio "${SR[tarn-p3]}" "${SR[tarn-plain]}") $(ratio "${RW[tarn-p3]}" "${RW[tarn-plain]}")"
  echo "  tarn-p3 / tarn-s4: $(ratio "${SW[tarn-p3]}" "${SW[tarn-s4]}") $(ratio "${SR[tarn-p3]}" "${SR[tarn-s4]}") $(ratio "${RW[tarn-p3]}" "${RW[tarn-s4]}")"
  [ -n "$MD_NOTE" ] && echo "  tarn-p3 / md RAID-5: not measured (as md RAID-0 above)"
} | tee "$OUT"
