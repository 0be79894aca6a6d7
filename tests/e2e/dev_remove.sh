#!/usr/bin/env bash
# Removing a member device (issue 12 item 2, `tarn dev remove`): only live
# data moves (bytes moved = live bytes on the member, within 1%), snapshot
# sharing is kept (pool used bytes unchanged), the snapshot and the head
# read back; fio verify=crc32c over NBD while a member is evacuated under
# load (throttled); ext4 on nbdfuse + loop survives an evacuation with
# e2fsck -fn clean; the emptied member leaves the pool (slot REMOVED,
# label wiped, the pool reopens without the file, the device can be added
# again); kill -9 mid-evacuation, restart, the server resumes and finishes
# the removal; `--cancel` makes the member a normal one; an add at a 100%
# full pool; bad inputs refused naming the cause, the pool unchanged;
# `tarn pool check` clean throughout.
. "$(dirname "$0")/lib.sh"
need fio jq losetup qemu-io nbdfuse mkfs.ext4 e2fsck
need_root "ext4 on a loop device"
need_fuse
need_loop
e2e_init dev_remove

M=$((1 << 20))
qio() { timeout 300 qemu-io -f raw "$@"; }
status() { tarn pool status -p "$1" --json; }
dev_field() { status "$1" | jq -r ".devices[$2].$3"; }
dev_used() { status "$1" | jq ".devices[$2].data - .devices[$2].free"; }
clean() { tarn pool check -p "$1" --json | jq -e '.clean' >/dev/null; }
# within_pct A B PCT: |A - B| <= PCT% of B
within_pct() { awk -v a="$1" -v b="$2" -v p="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= b * p / 100) }'; }

step "live data only, sharing kept: a member with head blocks and a snapshot's dead list"
POOL=$T/pool.img
make_pool "$POOL" 384M
make_vol "$POOL" v 1G
check "tarn dev add d1.img --size 512M" tarn dev add "$T/d1.img" --size 512M -p "$POOL"
start_serve "$POOL"
check "write 200M of 0xab into v" qio "$(uri v)" -c "write -P 0xab 0 200M" -c flush
check "snapshot v@s1" tarn snap create v@s1 -p "$POOL"
check "overwrite 40M of the head with 0xcd (the old blocks go to s1's dead list)" \
  qio "$(uri v)" -c "write -P 0xcd 0 40M" -c flush
live1=$(dev_used "$POOL" 1)
used_before=$(status "$POOL" | jq .used)
say "  device 1 holds $(mib "$live1"), pool used $(mib "$used_before")"
[ "$live1" -gt $((50 * M)) ] && ok "device 1 holds data to move ($(mib "$live1"))" || bad "device 1 holds only $(mib "$live1")"
if out=$(tarn dev remove 1 -p "$POOL" --json 2>"$T/remove1.err"); then ok "tarn dev remove 1 (served)"; else bad "tarn dev remove 1: $(cat "$T/remove1.err")"; out='{}'; fi
say "  $out"
moved=$(jq .moved_bytes <<<"$out")
within_pct "$moved" "$live1" 1 && ok "bytes moved $(mib "$moved") = live bytes on device 1 $(mib "$live1") within 1%" ||
  bad "bytes moved $moved vs live bytes on device 1 $live1"
expect_eq "nothing live left on device 1" "$(jq .remaining_bytes <<<"$out")" 0
expect_eq "the removal took device 1 out of the pool" "$(jq .removed <<<"$out")" true
expect_eq "its label was wiped" "$(jq .label_wiped <<<"$out")" true
nodes=$(jq .nodes_moved <<<"$out")
# (The evacuation's own commits rewrite most map nodes; the crash
# simulation counts the ones left for this step.)
say "  store nodes still on device 1 after the evacuation, rewritten elsewhere: $nodes"
expect_eq "device 1 is REMOVED" "$(dev_field "$POOL" 1 state)" REMOVED
expect_eq "device 1 has no data area" "$(dev_field "$POOL" 1 data)" 0
tarn pool status -p "$POOL" | grep -q "device 1  REMOVED" && ok "pool status text says REMOVED" ||
  bad "pool status text lacks 'device 1  REMOVED'"
expect_eq "pool size is device 0's alone" "$(status "$POOL" | jq '.size == .devices[0].data')" true
expect_eq "pool free counts device 0 only" "$(status "$POOL" | jq '.free + .reserved == .devices[0].free')" true
check_fails "the removed device alone holds no pool" tarn pool status -p "$T/d1.img"
grep -q "holds no valid tarn pool" <<<"$LAST_OUT" && ok "  it says so: no valid tarn pool" || bad "  unexpected: $LAST_OUT"
used_after=$(status "$POOL" | jq .used)
within_pct "$used_after" "$used_before" 1 && ok "pool used unchanged by the move: $(mib "$used_before") -> $(mib "$used_after")" ||
  bad "pool used went from $used_before to $used_after (sharing lost?)"
check "the head reads back" qio "$(uri v)" -c "read -P 0xcd 0 40M" -c "read -P 0xab 40M 160M"
check "the snapshot reads back" qio -r "$(uri v@s1)" -c "read -P 0xab 0 200M"
check "new writes work: 32M" qio "$(uri v)" -c "write -P 0xef 300M 32M" -c flush
again=$(tarn dev remove 1 -p "$POOL" 2>&1) && grep -q "removed already" <<<"$again" &&
  ok "dev remove 1 again says it is removed already" || bad "dev remove 1 again: $again"
stop_serve
mv "$T/d1.img" "$T/away.img"
check "the pool opens without the removed file (offline status)" tarn pool status -p "$POOL"
check "pool check clean without the file" clean "$POOL"
start_serve "$POOL"
check "after a restart without the file, head and snapshot read back" \
  bash -c "timeout 300 qemu-io -f raw '$(uri v)' -c 'read -P 0xcd 0 40M' -c 'read -P 0xab 40M 160M' -c 'read -P 0xef 300M 32M' && timeout 300 qemu-io -r -f raw '$(uri v@s1)' -c 'read -P 0xab 0 200M'"

step "a 100% full pool: the wiped device is added again; a removal refused, then cancelled"
filled=0
for chunk in $((8 * M)) $((256 * 1024)) 4096; do
  at=$((400 * M + filled))
  while [ $filled -lt $((600 * M)) ]; do
    if o=$(qio "$(uri v)" -c "write -P 0x11 $at $chunk" -c flush 2>&1) && ! grep -qi 'error\|failed' <<<"$o"; then
      at=$((at + chunk)); filled=$((filled + chunk))
    else break; fi
  done
done
say "  wrote $(mib $filled) more before ENOSPC"
check_fails "the pool is full: a hole write fails" qio "$(uri v)" -c "write -P 1 $((1000 * M)) 4k"
grep -qi 'no space left' <<<"$LAST_OUT" && ok "  with ENOSPC" || bad "  not ENOSPC: $LAST_OUT"
check "dev add of the removed (wiped) device at 100%" tarn dev add "$T/away.img" -p "$POOL"
expect_eq "it is device 2 (slot 1 stays empty)" "$(dev_field "$POOL" 2 state)" ONLINE
expect_eq "slot 1 is still REMOVED" "$(dev_field "$POOL" 1 state)" REMOVED
check "a write into a hole works again (device 2 takes it)" qio "$(uri v)" -c "write -P 0x22 $((1000 * M)) 4M" \
  -c "write -P 0x22 $((1004 * M)) 4M" -c "write -P 0x22 $((1008 * M)) 4M" -c "write -P 0x22 $((1012 * M)) 4M" -c flush
[ "$(dev_used "$POOL" 2)" -gt 0 ] && ok "device 2 took new data" || bad "device 2 took nothing"
step "bad input: a clear error naming the cause, the pool unchanged"
before=$(status "$POOL" | jq -c '[.used, .free, [.devices[] | [.state, .free]]]')
refuse() { # refuse DESC PATTERN ARGS...
  local desc=$1 pat=$2; shift 2
  check_fails "dev remove refuses $desc" tarn dev remove "$@"
  if grep -q -- "$pat" <<<"$LAST_OUT"; then ok "  the error names it: $pat"; else bad "  error for $desc lacks '$pat': $LAST_OUT"; fi
}
refuse "an unknown index" "no member 7" 7 -p "$POOL"
refuse "the primary" "primary" 0 -p "$POOL"
refuse "live data the rest cannot hold" "the other members have room for" 2 -p "$POOL"
refuse "a cancel of a member not being removed" "not being removed" --cancel 2 -p "$POOL"
refuse "a cancel of a removed slot" "not being removed" --cancel 1 -p "$POOL"
expect_eq "the pool is unchanged" "$(status "$POOL" | jq -c '[.used, .free, [.devices[] | [.state, .free]]]')" "$before"

step "--cancel: a throttled removal cancelled makes the member a normal one"
check "discard 300M of v (room on device 0)" qio "$(uri v)" -c "discard 400M 300M" -c flush
tarn dev remove 2 --rate 2M -p "$POOL" --json >"$T/cancelled.json" 2>"$T/cancelled.err" &
RM=$!; E2E_PIDS+=("$RM")
draining() { [ "$(dev_field "$POOL" 2 state)" = DRAINING ]; }
wait_until 60 draining && ok "device 2 is DRAINING" || bad "device 2 never showed DRAINING"
check "cancel: dev remove --cancel 2" tarn dev remove --cancel 2 -p "$POOL"
rc=0; wait "$RM" || rc=$?
expect_eq "the cancelled removal exits 0" "$rc" 0
expect_eq "it reports cancelled" "$(jq .cancelled "$T/cancelled.json")" true
expect_eq "device 2 is ONLINE again" "$(dev_field "$POOL" 2 state)" ONLINE
check "the head reads back" qio "$(uri v)" -c "read -P 0xcd 0 40M" -c "read -P 0x22 $((1000 * M)) 16M"
stop_serve
make_pool "$T/one.img" 64M
refuse "the last device" "last device" 0 -p "$T/one.img"
check "pool check clean (first pool)" clean "$POOL"

step "fio verify=crc32c over NBD while a member is evacuated under load; ext4 on nbdfuse + loop"
P2=$T/p2.img
make_pool "$P2" 448M
make_vol "$P2" w 512M
make_vol "$P2" e 256M
check "tarn dev add e1.img --size 256M" tarn dev add "$T/e1.img" --size 256M -p "$P2"
start_serve "$P2"
FUSE=$T/fuse; MNT=$T/mnt; mkdir -p "$FUSE" "$MNT"
fuse_attach e $((256 * M))
check "mkfs.ext4" mkfs.ext4 -q -F "$LOOP"
check "mount ext4" mount "$LOOP" "$MNT"
for i in 1 2 3 4; do head -c $((24 * M)) /dev/urandom >"$MNT/f$i"; done
mkdir -p "$MNT/dir"; for i in $(seq 1 200); do echo "file $i" >"$MNT/dir/s$i"; done
sync
(cd "$MNT" && find . -type f -print0 | sort -z | xargs -0 md5sum) >"$T/ext4.md5"
cat >"$T/load.fio" <<JOB
[global]
ioengine=nbd
uri=$(uri w)
bs=4k
size=160M
iodepth=8
verify=crc32c
verify_fatal=1
randseed=7
[fill]
rw=write
bs=1M
JOB
(cd "$T" && timeout 600 fio --output-format=json --output="$T/fill.json" "$T/load.fio") >"$T/fill.out" 2>&1 &&
  ok "fio fills w with 160M (verified)" || bad "fio fill: $(tail -3 "$T/fill.out")"
live2=$(dev_used "$P2" 1)
say "  device 1 holds $(mib "$live2")"
[ "$live2" -gt $((16 * M)) ] && ok "device 1 holds data ($(mib "$live2"))" || bad "device 1 holds only $(mib "$live2")"
sed -e 's/^rw=write/rw=randwrite/' -e 's/^bs=1M/bs=4k\nloops=3\ntime_based=0/' -e 's/^\[fill\]/[during]/' "$T/load.fio" >"$T/during.fio"
(cd "$T" && timeout 900 fio --output-format=json --output="$T/during.json" "$T/during.fio") >"$T/during.out" 2>&1 &
FIO=$!; E2E_PIDS+=("$FIO")
(for i in $(seq 1 400); do cp "$MNT/f1" "$MNT/copy$((i % 3))" 2>/dev/null; sync; kill -0 "$FIO" 2>/dev/null || break; done) &
CP=$!; E2E_PIDS+=("$CP")
if out=$(tarn dev remove 1 --rate 40M -p "$P2" --json 2>"$T/remove2.err"); then ok "tarn dev remove 1 --rate 40M under load"; else bad "dev remove under load: $(cat "$T/remove2.err")"; out='{}'; fi
say "  $out"
kill -0 "$FIO" 2>/dev/null && say "  (fio was still writing when the removal returned)" || say "  (fio ended before the removal returned)"
rc=0; wait "$FIO" || rc=$?
expect_eq "fio randwrite verify during the removal exited 0" "$rc" 0
expect_eq "fio during the removal: no job errors" "$(jq '[.jobs[].error] | add' "$T/during.json" 2>/dev/null)" 0
wait "$CP" 2>/dev/null || true
rate=$(jq .rate_mib_s <<<"$out")
awk -v r="$rate" 'BEGIN { exit !(r <= 44) }' && ok "throttled: $rate MiB/s at --rate 40M" || bad "rate $rate MiB/s above --rate 40M"
expect_eq "nothing live left on device 1" "$(jq .remaining_bytes <<<"$out")" 0
expect_eq "device 1 is all free" "$(dev_used "$P2" 1)" 0
rm -f "$MNT"/copy*
sync
check "ext4 files intact after the evacuation" bash -c "cd '$MNT' && md5sum --quiet -c '$T/ext4.md5'"
check "umount ext4" umount "$MNT"
check "e2fsck -fn clean" e2fsck -fn "$LOOP"
fuse_detach

step "kill -9 mid-evacuation, restart: the server resumes and takes the member out"
expect_eq "device 1 was removed by the removal under load" "$(dev_field "$P2" 1 state)" REMOVED
check "tarn dev add e2.img --size 256M (device 2)" tarn dev add "$T/e2.img" --size 256M -p "$P2"
check "delete volume e (room for what follows)" tarn vol delete e -p "$P2"
check "fio writes 120M more (lands partly on device 2)" bash -c "sed -e 's/^size=160M/size=120M\noffset=200M/' '$T/load.fio' >'$T/more.fio' && cd '$T' && timeout 600 fio '$T/more.fio' >'$T/more.out' 2>&1"
live3=$(dev_used "$P2" 2)
say "  device 2 holds $(mib "$live3")"
tarn dev remove 2 --rate 2M -p "$P2" --json >"$T/killed.json" 2>&1 &
RM=$!; E2E_PIDS+=("$RM")
sleep_until_moved() { [ "$(dev_used "$P2" 2)" -lt $((live3 - 8 * M)) ]; }
wait_until 60 sleep_until_moved && ok "the evacuation moved 8M+" || bad "the evacuation did not start moving"
kill9_serve
wait "$RM" 2>/dev/null || true
check "pool check clean after kill -9" clean "$P2"
grep -q remaining_bytes "$T/killed.json" && bad "the removal had finished before the kill" || ok "the kill came mid-evacuation (no answer)"
expect_eq "device 2 is still DRAINING after kill -9 (offline status, persisted)" "$(dev_field "$P2" 2 state)" DRAINING
start_serve "$P2"
grep -q "member 2 is being removed: evacuation resumes in the background" "$SERVE_LOG" &&
  ok "the restarted server resumes the evacuation" || bad "no background resume in the server log"
removed() { [ "$(dev_field "$P2" 2 state)" = REMOVED ]; }
wait_until 120 removed && ok "the background evacuation emptied device 2 and removed it" || bad "device 2 is $(dev_field "$P2" 2 state)"
grep -q "member 2: evacuation done in the background.*removed from the pool" "$SERVE_LOG" && ok "  and logged it" || bad "no 'evacuation done ... removed' in the server log"
check_fails "e2.img alone holds no pool (label wiped)" tarn pool status -p "$T/e2.img"
again=$(tarn dev remove 2 -p "$P2" 2>&1) && grep -q "removed already" <<<"$again" &&
  ok "dev remove 2 again after the restart says it is removed already" || bad "dev remove 2 again: $again"
stop_serve
rm -f "$T/e1.img" "$T/e2.img"
check "pool check clean with both removed files deleted" clean "$P2"
start_serve "$P2"
sed -i -e 's/^\[global\]/[global]\nverify_only=1/' -e "s|^uri=.*|uri=$(uri w)|" "$T/during.fio"
(cd "$T" && timeout 600 fio --output-format=json --output="$T/vo.json" "$T/during.fio") >"$T/vo.out" 2>&1 &&
  ok "fio verify-only of the load's data, the removed files gone" || bad "fio verify-only: $(tail -3 "$T/vo.out")"
sed -i -e 's/^\[global\]/[global]\nverify_only=1/' -e "s|^uri=.*|uri=$(uri w)|" "$T/more.fio"
check "fio verify-only of the data written before the kill" bash -c "cd '$T' && timeout 600 fio '$T/more.fio'"
stop_serve
check "pool check clean at the end" clean "$P2"
e2e_finish
