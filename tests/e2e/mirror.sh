#!/usr/bin/env bash
# Mirrors with file devices and real NBD clients: a mirrored pool written
# with qemu-img and fio; one leg destroyed; restart -> DEGRADED, data still
# identical, writes still work; `tarn pool replace` resilvers online (with
# writes running) -> ONLINE, check clean; then the first leg removed and the
# new leg alone holds everything. Also: a stale leg is not trusted, a missing
# plain member is a clear error that writes nothing, a damaged superblock
# copy is reported.
. "$(dirname "$0")/lib.sh"
need qemu-img qemu-io fio jq sha256sum nbdcopy
e2e_init mirror

M=$((1 << 20))
A=$T/legA.img
B=$T/legB.img
C=$T/legC.img
REF=$T/ref.img

# status_field POOL JQ: sets VAL from `tarn pool status --json`
status_field() {
  VAL=$(timeout 30 "$TARN" pool status -p "$1" --json 2>>"$T/status.log" | jq -r "$2" 2>/dev/null) || VAL=
}
compare_ref() { # DESC
  check "$1" timeout 120 qemu-img compare -q -f raw -F raw "$REF" "$(uri v)"
}

step "create a mirrored pool (A + B) and fill a volume"
check "tarn pool create A --mirror B" tarn pool create "$A" --mirror "$B" --size 256M
status_field "$A" '.devices[0].legs | length'
expect_eq "primary has two legs" "$VAL" 2
status_field "$A" '.state'
expect_eq "pool state" "$VAL" ONLINE
make_vol "$A" v 64M
head -c $((24 * M)) /dev/urandom >"$REF"
truncate -s 64M "$REF"
start_serve "$A"
check "qemu-img convert 64M reference into v" timeout 120 qemu-img convert -n -f raw -O raw "$REF" "$(uri v)"
check "fio verified random writes 40M..56M" timeout 300 fio --name=mirror --verify_state_save=0 --ioengine=nbd --uri="$(uri v)" \
  --rw=randwrite --bs=16k --offset=40M --size=16M --verify=crc32c --do_verify=1 --randrepeat=0 --output="$T/fio.log"
# fio verified its own range; the volume as it is now becomes the reference
# once its first 24M are checked against what qemu-img wrote
cp "$REF" "$T/src.img"
check "nbdcopy the volume into the reference" timeout 120 nbdcopy "$(uri v)" "$REF"
cmp -s -n $((24 * M)) "$T/src.img" "$REF" && ok "first 24M as written by qemu-img" || bad "first 24M differ from what qemu-img wrote"
rm -f "$T/src.img"
compare_ref "volume identical to the reference"
stop_serve
cmp -s <(head -c $((32 * M)) "$A" | tail -c $((31 * M))) <(head -c $((32 * M)) "$B" | tail -c $((31 * M))) &&
  ok "legs A and B byte-identical over blocks 256..8191 (journal and data)" || bad "legs A and B differ"

step "leg B destroyed (truncated to 0): restart DEGRADED"
truncate -s 0 "$B"
start_serve "$A"
status_field "$A" '.state'
expect_eq "pool state after losing B (live status)" "$VAL" DEGRADED
status_field "$A" '.devices[0].legs[1].state'
expect_eq "leg B state" "$VAL" MISSING
grep -q "DEGRADED" "$SERVE_LOG" && ok "server log says DEGRADED" || bad "server log does not mention DEGRADED"
compare_ref "degraded: volume still identical to the reference"
check "degraded: write 4M of 0x77 at 8M" timeout 60 qemu-io -f raw "$(uri v)" -c "write -P 0x77 8M 4M" -c flush
printf '\x77%.0s' $(seq 1 4096) >"$T/p77"
for i in $(seq 0 1023); do cat "$T/p77"; done >"$T/p77-4M"
dd if="$T/p77-4M" of="$REF" bs=1M seek=8 conv=notrunc status=none
compare_ref "degraded: new write visible, rest intact"

step "tarn pool replace B C (online, with writes running)"
( for i in $(seq 1 20); do
    timeout 60 qemu-io -f raw "$(uri v)" -c "write -P 0x42 $((60 * M)) 1M" -c flush >/dev/null 2>&1 || exit 1
  done ) &
writer=$!
t0=$(date +%s.%N)
out=$(timeout 300 "$TARN" pool replace "$B" "$C" --size 256M -p "$A" 2>&1) && rc=0 || rc=$?
t1=$(date +%s.%N)
expect_eq "tarn pool replace exit status" "$rc" 0
printf '%s\n' "$out" | sed 's/^/       | /'
printf '%s' "$out" | grep -q "resilver: 100%" && ok "progress lines reach 100%" || bad "no 'resilver: 100%' progress line"
wait "$writer" && ok "writes during the resilver succeeded" || bad "a write during the resilver failed"
printf '\x42%.0s' $(seq 1 4096) >"$T/p42"
for i in $(seq 0 255); do cat "$T/p42"; done >"$T/p42-1M"
dd if="$T/p42-1M" of="$REF" bs=1M seek=60 conv=notrunc status=none
say "  resilver: $(printf '%s' "$out" | grep -o 'resilvered.*')"
status_field "$A" '.state'
expect_eq "pool state after the replace" "$VAL" ONLINE
compare_ref "volume identical after the resilver"
stop_serve
pool_check "$A" "after the resilver"
start_serve "$A"
status_field "$A" '[.state, .devices[0].legs[0].state, .devices[0].legs[1].state] | join(" ")'
expect_eq "after restart: pool and both legs" "$VAL" "ONLINE ONLINE ONLINE"
stop_serve

step "kill -9 while writing: restart resyncs the legs"
start_serve "$A"
check "write 2M of 0x5d at 30M" timeout 60 qemu-io -f raw "$(uri v)" -c "write -P 0x5d 30M 2M" -c flush
kill9_serve
printf '\x5d%.0s' $(seq 1 4096) >"$T/p5d"
for i in $(seq 0 511); do cat "$T/p5d"; done >"$T/p5d-2M"
dd if="$T/p5d-2M" of="$REF" bs=1M seek=30 conv=notrunc status=none
start_serve "$A"
wait_until 60 grep -q "mirror resync done" "$SERVE_LOG" && ok "resync after the unclean stop finished" ||
  bad "no 'mirror resync done' in the server log"
status_field "$A" '[.state, .devices[0].legs[1].state] | join(" ")'
expect_eq "after the resync" "$VAL" "ONLINE ONLINE"
compare_ref "after kill -9 and resync: identical to the reference"
stop_serve

step "leg A removed: C alone holds all data"
mv "$A" "$T/legA.away"
start_serve "$C"
status_field "$C" '.devices[0].legs[0].state'
expect_eq "leg A state when opening from C" "$VAL" MISSING
compare_ref "served from leg C alone: identical to the reference"
check "leg C alone: write 1M of 0x99 at 20M (leg A misses it)" timeout 60 qemu-io -f raw "$(uri v)" -c "write -P 0x99 20M 1M" -c flush
printf '\x99%.0s' $(seq 1 4096) >"$T/p99"
for i in $(seq 0 255); do cat "$T/p99"; done >"$T/p99-1M"
dd if="$T/p99-1M" of="$REF" bs=1M seek=20 conv=notrunc status=none
stop_serve
pool_check "$C" "leg C alone"

step "leg A back: stale, not trusted"
mv "$T/legA.away" "$A"
status_field "$A" '[.state, .devices[0].legs[0].state] | join(" ")'
expect_eq "opened via the stale leg A: newest table (from C) marks A stale" "$VAL" "DEGRADED FAULTED"
start_serve "$A"
compare_ref "stale A back: reads come from C (the write A missed is there)"
stop_serve

step "a leg of another pool in place of a leg: refused by name, nothing written"
check "pool M (m1 + m2)" tarn pool create "$T/m1.img" --mirror "$T/m2.img" --size 64M
check "pool X (x1 + x2)" tarn pool create "$T/x1.img" --mirror "$T/x2.img" --size 64M
make_vol "$T/x1.img" xv 8M
cp "$T/x2.img" "$T/m2.img"
sum=$(sha256sum <"$T/m1.img")
check_fails "pool status of M with X's leg as m2" timeout 30 "$TARN" pool status -p "$T/m1.img"
printf '%s' "$LAST_OUT" | grep -q "m2.img.*does not belong to this pool" && ok "error names m2.img as foreign" ||
  bad "error does not name m2.img as foreign: $LAST_OUT"
expect_eq "m1 unchanged by the refused open" "$(sha256sum <"$T/m1.img")" "$sum"
rm -f "$T"/m1.img "$T"/m2.img "$T"/x1.img "$T"/x2.img

step "a plain member missing: the pool opens DEGRADED, says which, nothing written by a read-only command"
P=$T/plain.img
check "pool create with a plain member" tarn pool create "$P" --device "$T/member.img" --size 64M
mv "$T/member.img" "$T/member.away"
sum=$(sha256sum <"$P")
rc=0; out=$(timeout 30 "$TARN" vol list -p "$P" 2>&1) || rc=$?
expect_eq "vol list with the member missing (exit)" "$rc" 0
printf '%s' "$out" | grep -q "member.img.*DEGRADED" && ok "the warning names the missing member" || bad "no warning naming member.img: $out"
expect_eq "pool status --json: pool and member 1 state" \
  "$(timeout 30 "$TARN" pool status -p "$P" --json 2>/dev/null | jq -r '.state + " " + .devices[1].state')" "DEGRADED UNAVAIL"
expect_eq "primary unchanged by the read-only opens" "$(sha256sum <"$P")" "$sum"
mv "$T/member.away" "$T/member.img"

step "damaged superblock copy: opens from the other and says so"
dd if=/dev/urandom of="$P" bs=4096 count=1 conv=notrunc status=none
out=$(timeout 30 "$TARN" pool status -p "$P" 2>&1) || true
printf '%s' "$out" | grep -q "note: superblock copy 0 .* is invalid" && ok "pool status reports the invalid copy" ||
  bad "pool status does not report the invalid superblock copy: $(printf '%s' "$out" | tail -3 | tr '\n' ' ')"

e2e_finish
