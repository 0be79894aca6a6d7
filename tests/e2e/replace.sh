#!/usr/bin/env bash
# Replacing a present member (issue "pool elasticity"; `tarn pool replace
# 3 NEW` of a member still there, as `zpool replace` / `mdadm --replace`):
# a pool of four 256 MiB files holding a plain volume (with a snapshot and
# a clone), a 4-wide striped and a 3+1 parity volume, each with a part on
# member 3. Bad replacements are refused by name with nothing changed.
# Then member 3 is copied onto a new file (throttled, progress shown)
# while fio writes 4K random with crc32c verify to all three volumes; the
# server is killed mid-copy and the restarted one resumes past the
# recorded cursor and finishes. The new file is member 3 (ONLINE, its
# path), the old one carries no pool label, every volume compares equal
# (qemu-img compare) and verifies (fio verify-only), nothing was read by
# reconstruction. Then member 3 (the new device) is removed (`dev
# remove`, evacuation) while fio verifies the striped and the parity
# volume; they still compare and verify; scrub is clean, `pool check`
# clean.
. "$(dirname "$0")/lib.sh"
need fio qemu-img jq
e2e_init replace

M=$((1 << 20))
POOL=$T/pool.img
VOLS=(a s p)

json_of() { # VOL SIZE: a qemu-img target for the first SIZE bytes of export VOL
  echo "json:{\"driver\":\"raw\",\"size\":$2,\"file\":{\"driver\":\"nbd\",\"server\":{\"type\":\"inet\",\"host\":\"127.0.0.1\",\"port\":\"$SERVE_PORT\"},\"export\":\"$1\"}}"
}
fio_job() { # NAME VOL RW SIZE [fio options...]: 1M (or --bs) writes with crc32c verify
  local name=$1 vol=$2 rw=$3 size=$4; shift 4
  (cd "$T" && timeout 300 fio --name="$name" --ioengine=nbd --uri="$(uri "$vol")" --rw="$rw" --bs=1M --iodepth=8 \
    --size="$size" --verify=crc32c --output-format=json --output="$T/$name.json" "$@") >"$T/$name.out" 2>&1
}
status() { tarn pool status -p "$POOL" --json; }
has_label() { head -c 4096 "$1" | grep -qa TARNPOOL || dd if="$1" bs=4096 skip=16 count=1 2>/dev/null | grep -qa TARNPOOL; }

for i in 1 2 3; do truncate -s 256M "$T/m$i.img"; done
check "tarn pool create on 4 members" \
  tarn pool create "$POOL" --size 256M --device "$T/m1.img" --device "$T/m2.img" --device "$T/m3.img"
check "vol create a (plain, 64M)" tarn vol create a --size 64M -p "$POOL"
check "vol create s (--stripe 4, 64M)" tarn vol create s --size 64M --stripe 4 -p "$POOL"
check "vol create p (--parity 3, 64M)" tarn vol create p --size 64M --parity 3 -p "$POOL"

step "the volumes written over NBD; a snapshot and a clone of a"
head -c $((24 * M)) /dev/urandom >"$T/src.raw"
start_serve "$POOL"
for v in a s p; do
  check "qemu-img convert 24 MiB into $v" qemu-img convert -n -f raw -O raw "$T/src.raw" "$(json_of $v $((24 * M)))"
  rc=0; fio_job seq$v $v write 16M --offset=32M || rc=$?
  expect_eq "fio 1M sequential write + verify on $v" "$rc" 0
done
check "snap create a@s1" tarn snap create a@s1 -p "$POOL"
check "vol clone a@s1 c" tarn vol clone a@s1 c -p "$POOL"
# a is rewritten past the snapshot: the snapshot's blocks live on in its dead list.
rc=0; fio_job seqa2 a write 8M --offset=0 --verify=crc32c || rc=$?
expect_eq "fio rewrites a's first 8 MiB after the snapshot" "$rc" 0
for v in a s; do
  check "qemu-io writes $v's 24M..28M three times (0x11, 0x12, 0x13: its overwrite regions open)" \
    qemu-io -f raw -c "write -P 0x11 24M 4M" -c flush -c "write -P 0x12 24M 4M" -c flush -c "write -P 0x13 24M 4M" -c flush "$(uri $v)"
done
expect_between "member 3's used bytes (pool status)" "$(status | jq '.devices[3].data - .devices[3].free')" $((8 * M)) $((256 * M))

step "bad replacements are refused by name, nothing changed"
check_fails "pool replace 0 (the primary)" "$TARN" pool replace 0 "$T/x.img" --size 256M -p "$POOL"
case $LAST_OUT in *primary*) ok "the error names the primary" ;; *) bad "replace 0: $LAST_OUT" ;; esac
check_fails "pool replace 3 with a 64M device" "$TARN" pool replace 3 "$T/small.img" --size 64M -p "$POOL"
case $LAST_OUT in *"too small"*) ok "the error says too small" ;; *) bad "small: $LAST_OUT" ;; esac
check_fails "pool replace 3 with member 1's device" "$TARN" pool replace 3 "$T/m1.img" -p "$POOL"
case $LAST_OUT in *"tarn label"*) ok "the error names the label" ;; *) bad "labelled: $LAST_OUT" ;; esac
expect_eq "nothing changed: member 3 ONLINE on m3.img" "$(status | jq -r '.devices[3].state + " " + .devices[3].path')" "ONLINE $T/m3.img"
rm -f "$T/x.img" "$T/small.img"

step "pool replace 3 NEW copies member 3 online while fio writes; the server is killed mid-copy"
# Throttled to 1 MiB/s, so writes run during the copy and the server
# can be killed mid-way. fio's writes to new ranges land elsewhere
# (nothing is allocated on member 3 while it is replaced).
# s's and a's 24M..28M (on member 3 among others) are overwritten in a
# loop from before the copy to past 90% of it: their overwrite regions
# stay open, so the writes go in place, also below the cursor.
overwrite_loop() {
  local i=0
  while [ ! -e "$T/stop-loop" ] && [ $i -lt 100000 ]; do
    i=$((i + 1))
    for v in a s; do
      qemu-io -f raw -c "write -P $((0x20 + i % 200)) 24M 4M" -c flush "$(uri $v)" >/dev/null || return 1
    done
    echo $i >"$T/loops"
  done
}
overwrite_loop & LOOP_PID=$!
wait_until 30 test -s "$T/loops" || bad "the overwrite loop did not start"
"$TARN" pool replace 3 "$T/m3new.img" --size 256M --rate 1M -p "$POOL" >"$T/replace.out" 2>&1 & REPLACE_PID=$!
wait_until 60 grep -q "replace: *[1-9]" "$T/replace.out" && ok "the copy started (progress shown)" ||
  bad "no copy progress: $(tail -c 300 "$T/replace.out")"
expect_eq "pool status --json: the pool ONLINE, member 3 REPLACING" "$(status | jq -r '.state + " " + .devices[3].state')" "ONLINE REPLACING"
pids=()
for v in a s p; do
  fio_job live$v $v randwrite 8M --bs=4k --iodepth=16 --offset=48M --end_fsync=1 & pids+=($!)
done
for i in 0 1 2; do
  v=${VOLS[$i]}; rc=0; wait "${pids[$i]}" || rc=$?
  expect_eq "fio 4K randwrite + verify on $v during the copy (exit, errors)" "$rc $(jq '[.jobs[].error] | add' "$T/live$v.json" 2>/dev/null)" "0 0"
done
expect_eq "member 3 still REPLACING when fio is done" "$(status | jq -r '.devices[3].state')" REPLACING
# Then, once 90% of member 3 is copied (the cursor past the blocks of
# the first writes), those blocks are overwritten: in place for s and
# for a's first 8 MiB (not shared with the snapshot), copy-on-write for
# p. Such writes must reach the new device too.
copied() { tr '\r' '\n' <"$T/replace.out" | sed -n 's/.*(\([0-9]*\) of [0-9]* blocks).*/\1/p' | tail -1; }
total=$(tr '\r' '\n' <"$T/replace.out" | sed -n 's/.* of \([0-9]*\) blocks.*/\1/p' | tail -1)
wait_until 120 bash -c "[ \"\$(tr '\r' '\n' <'$T/replace.out' | sed -n 's/.*(\([0-9]*\) of [0-9]* blocks).*/\1/p' | tail -1)\" -gt $((${total:-2000} * 9 / 10)) ]" ||
  bad "the copy did not pass 90% of ${total:-?} blocks: $(copied)"
head -c $((24 * M)) /dev/urandom >"$T/src2.raw"
for v in a s p; do
  check "qemu-img convert another 24 MiB over $v's first (copied) blocks" qemu-img convert -n -f raw -O raw "$T/src2.raw" "$(json_of $v $((24 * M)))"
done
touch "$T/stop-loop"; rc=0; wait "$LOOP_PID" || rc=$?
expect_eq "the overwrite loop on s and a (exit)" "$rc" 0
expect_between "overwrites of s's and a's 24M..28M during the copy" "$(cat "$T/loops")" 2 100000
expect_eq "member 3 still REPLACING before the kill" "$(status | jq -r '.devices[3].state')" REPLACING
kill9_serve
rc=0; wait "$REPLACE_PID" || rc=$?
[ "$rc" -ne 0 ] && ok "pool replace ends with an error when the server is killed ($rc)" || bad "pool replace exit $rc after the kill"
start_serve "$POOL"
at=$(sed -n 's/.*is being replaced by .*: copied below block \([0-9]*\).*/\1/p' "$SERVE_LOG" | head -1)
expect_between "the restart resumes past the recorded cursor (block)" "${at:-0}" 33 100000000
wait_until 180 bash -c "\"$TARN\" pool status -p \"$POOL\" --json | jq -e '.devices[3].state == \"ONLINE\"' >/dev/null" &&
  ok "the service finished the copy in the background" || bad "not ONLINE: $(status | jq -c '[.state, .devices[3]]')"
check "server log: the copy resumed and ended" bash -c "grep -q 'the copy resumes in the background' \"$SERVE_LOG\" && grep -q 'member 3: replaced by' \"$SERVE_LOG\""
expect_eq "pool status --json: pool state, member 3 state and path" \
  "$(status | jq -r '.state + " " + .devices[3].state + " " + .devices[3].path')" "ONLINE ONLINE $T/m3new.img"
check_fails "the old device m3.img carries no pool label" has_label "$T/m3.img"
check "the new device m3new.img carries one" has_label "$T/m3new.img"
stop_serve

step "after a restart everything reads back, nothing reconstructed"
start_serve "$POOL"
for v in a s p; do
  check "$v's first 24 MiB compare equal (the overwrite during the copy)" qemu-img compare -f raw -F raw "$T/src2.raw" "$(json_of $v $((24 * M)))"
done
check "c (the clone of a's snapshot) compares equal" qemu-img compare -f raw -F raw "$T/src.raw" "$(json_of c $((24 * M)))"
check "a@s1 compares equal" qemu-img compare -f raw -F raw "$T/src.raw" "$(json_of a@s1 $((24 * M)))"
for v in a s; do
  check "$v's 24M..28M reads the last pattern written during the copy" \
    qemu-io -r -f raw -c "read -P $((0x20 + $(cat "$T/loops") % 200)) 24M 4M" "$(uri $v)"
done
for v in a s p; do
  rc=0; fio_job seq${v}r $v write 16M --offset=32M --verify_only=1 || rc=$?
  expect_eq "fio verify-only of $v's sequential writes" "$rc" 0
  rc=0; fio_job live${v}r $v randwrite 8M --bs=4k --iodepth=16 --offset=48M --verify_only=1 || rc=$?
  expect_eq "fio verify-only of $v's writes made during the copy" "$rc" 0
done
expect_eq "nothing read by reconstruction" "$(status | jq .reconstructed_blocks)" 0
check_fails "pool replace 3 onto the old device (it is no member now, but the new one is: a second replace is a new copy)" \
  "$TARN" pool replace 3 "$T/m1.img" -p "$POOL"

step "dev remove 3 (the new member) while fio reads and verifies: the striped and parity volumes' units move"
# Issue 12's tests ask striped and parity volumes to pass the real-client
# tests of plain ones: here an evacuation under load.
pids=()
for v in s p; do
  fio_job rm$v $v write 16M --offset=32M --verify_only=1 & pids+=($!)
done
check "dev remove 3 while fio verifies s and p" tarn dev remove 3 -p "$POOL"
for i in 0 1; do
  v=$([ $i = 0 ] && echo s || echo p); rc=0; wait "${pids[$i]}" || rc=$?
  expect_eq "fio verify-only of $v during the removal (exit)" "$rc" 0
done
expect_eq "member 3 REMOVED" "$(status | jq -r '.devices[3].state')" REMOVED
check_fails "m3new.img carries no pool label after the removal" has_label "$T/m3new.img"
for v in s p; do
  check "$v compares equal after the removal" qemu-img compare -f raw -F raw "$T/src2.raw" "$(json_of $v $((24 * M)))"
  rc=0; fio_job live${v}x $v randwrite 8M --bs=4k --iodepth=16 --offset=48M --verify_only=1 || rc=$?
  expect_eq "fio verify-only of $v's 4K writes after the removal" "$rc" 0
done
check "a@s1 compares equal after the removal" qemu-img compare -f raw -F raw "$T/src.raw" "$(json_of a@s1 $((24 * M)))"
stop_serve
check "tarn pool scrub: clean" bash -c "\"$TARN\" pool scrub -p \"$POOL\" | grep -q ' 0 mismatched, 0 rebuilt from their row'"
pool_check "$POOL" "at the end"
e2e_finish
