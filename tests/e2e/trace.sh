#!/usr/bin/env bash
# Request traces: `tarn serve --trace` records what real clients ask,
# `tarn trace print` reads it, a replay against the same placement and pool
# size lays the data out exactly as the live run did (`tarn vol map` of
# both), a kernel block trace converts, placements compare on a replay,
# and damaged traces are refused with the byte they break at.
. "$(dirname "$0")/lib.sh"
need qemu-io fio jq
e2e_init trace

POOL=$T/pool.img
make_pool "$POOL" 1G
make_vol "$POOL" disk0 64M
start_serve "$POOL" --trace "$T/live.trc"

step "a serial client's requests, recorded"
# qemu-io sends one request at a time: the order the pool saw is the
# order recorded, so a replay must allocate the same blocks.
check "qemu-io writes, a flush, a trim" qemu-io -f raw "$(uri disk0)" \
  -c 'write -P 1 8M 64k' -c 'write -P 2 1M 4k' -c 'write -P 3 0 12k' -c 'flush' \
  -c 'write -P 4 8M 4k' -c 'write -P 5 32M 1M' -c 'discard 1M 4k' -c 'write -P 6 60M 128k' \
  -c 'read -P 5 32M 1M'
stop_serve
grep -q "trace $T/live.trc: .* records, 0 dropped" "$SERVE_LOG" && ok "the server reports the trace, nothing dropped" \
  || bad "no trace summary in the server log: $(tail -n 3 "$SERVE_LOG" | tr '\n' ' ')"
tarn trace print "$T/live.trc" >"$T/live.txt" || bad "trace print failed"
expect_eq "first request printed" "$(head -1 "$T/live.txt" | cut -d' ' -f2-5)" "disk0 write 8388608 65536"
expect_eq "trims recorded" "$(grep -c ' trim 1048576 4096' "$T/live.txt")" 1
expect_eq "the read recorded" "$(grep -c ' read 33554432 1048576' "$T/live.txt")" 1

step "replay with the live run's placement and pool size: the same layout"
tarn vol map disk0 -p "$POOL" >"$T/live.map" || bad "vol map failed"
tarn trace replay "$T/live.trc" --placement linear --pool-size 1G --dir "$T" --keep --json >"$T/replay.json" \
  || bad "replay failed"
scratch=$(jq -r .pool "$T/replay.json")
tarn vol map disk0 -p "$scratch" >"$T/replay.map" || bad "vol map of the replay failed"
expect_eq "live runs mapped" "$(wc -l <"$T/live.map")" 4
if cmp -s "$T/live.map" "$T/replay.map"; then ok "replayed allocation = live allocation"
else bad "replayed allocation differs: $(diff "$T/live.map" "$T/replay.map" | head -5 | tr '\n' ' ')"; fi
rm -f "$scratch"

step "placements compared on a replay of 4 KiB random first writes"
start_serve "$POOL" --trace "$T/rand.trc"
fio --name=r --ioengine=nbd --uri="$(uri disk0)" --rw=randwrite --bs=4k --iodepth=16 --size=64M \
  --io_size=16M --randseed=7 --output="$T/fio.out" >/dev/null 2>&1 || bad "fio random writes failed"
stop_serve
# A reader that stops early (the listing is far longer than a pipe holds).
set +o pipefail
"$TARN" trace print "$T/rand.trc" 2>"$T/pipe.err" | head -1 >/dev/null
rc=${PIPESTATUS[0]}
set -o pipefail
if [ "$rc" = 0 ] && ! grep -q panicked "$T/pipe.err"; then ok "trace print | head ends quietly"
else bad "trace print | head: exit $rc, $(head -2 "$T/pipe.err" | tr '\n' ' ')"; fi
for p in linear contiguous; do
  tarn trace replay "$T/rand.trc" --placement "$p" --dir "$T" --json >"$T/$p.json" || bad "replay --placement $p failed"
done
lin=$(jq '.volumes[0].est_read_s' "$T/linear.json")
con=$(jq '.volumes[0].est_read_s' "$T/contiguous.json")
say "  modelled read of the volume: linear $lin s, contiguous $con s"
if jq -n --argjson l "$lin" --argjson c "$con" '$c * 4 < $l' | grep -q true; then
  ok "contiguous reads far faster than linear on the modelled disk ($con s vs $lin s)"
else bad "contiguous read $con s not well below linear's $lin s"; fi

step "a kernel block trace converted"
cat >"$T/blk.txt" <<'BLK'
  8,0    3        1     0.000000000   697  Q  WS 2048 + 8 [kworker]
  8,0    3        2     0.000100000   697  G  WS 2048 + 8 [kworker]
  8,0    1        3     0.500000000   100  Q FWFS 4096 + 16 [jbd2/sda1-8]
  8,0    1        4     0.700000000   100  Q  DS 8192 + 64 [fstrim]
CPU0 (8,0):
BLK
check "trace convert" tarn trace convert "$T/blk.txt" -o "$T/blk.trc" --export vm1
tarn trace print "$T/blk.trc" >"$T/blk.print" || bad "print of the converted trace failed"
expect_eq "converted requests (write, flush, FUA write, trim)" "$(wc -l <"$T/blk.print")" 4
check "the converted trace replays" tarn trace replay "$T/blk.trc" --placement append --dir "$T"

step "bad input: damaged traces and arguments"
head -c $(($(stat -c %s "$T/live.trc") - 5)) "$T/live.trc" >"$T/cut.trc"
out=$(tarn trace print "$T/cut.trc" 2>&1) && bad "a truncated trace was accepted"
case $out in *truncated*) ok "a truncated trace is refused, naming where" ;; *) bad "truncated trace: $out" ;; esac
printf 'not a trace at all, not at all....' >"$T/junk.trc"
out=$(tarn trace print "$T/junk.trc" 2>&1) && bad "junk accepted as a trace"
case $out in *magic*) ok "a file that is no trace is refused" ;; *) bad "junk: $out" ;; esac
out=$(tarn trace replay "$T/live.trc" --placement sideways 2>&1) && bad "unknown placement accepted"
case $out in *"unknown placement"*) ok "replay refuses an unknown placement" ;; *) bad "placement: $out" ;; esac
out=$(tarn trace replay "$T/live.trc" --region 3000 --dir "$T" 2>&1) && bad "a region of 3000 bytes accepted"
case $out in *"power of two"*) ok "replay refuses a region that is no power of two" ;; *) bad "region: $out" ;; esac
out=$(tarn trace convert "$T/junk.trc" -o "$T/x.trc" 2>&1) && bad "convert accepted junk"
case $out in *"no queue"*) ok "convert refuses text without queue events" ;; *) bad "convert junk: $out" ;; esac
e2e_finish
