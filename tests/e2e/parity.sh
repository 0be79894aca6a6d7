#!/usr/bin/env bash
# Parity per volume (issue "pool elasticity" item 7, RAID-5): a pool of
# four 256 MiB members, the last a file served by nbdfuse from nbdkit's
# error filter (reads fail while a trigger file exists). Bad layouts are
# refused by name with nothing created; a 3+1 parity volume shows its
# layout; qemu-img convert + compare and fio 1M sequential and 4K random
# writes with crc32c verify over NBD; then every read of member 3 fails
# and the volume still compares equal and verifies (fio verify-only),
# with the rebuilt blocks counted in `pool status` and logged; scrub
# verifies every row and rebuilds a rotted block; `pool check` clean.
# Then member 3's device goes away: the pool opens DEGRADED (member 3
# UNAVAIL, an alert), p still compares and verifies, a plain volume kept
# on member 3 fails its reads; `pool replace` refuses while that volume
# holds blocks there (by name), then rebuilds member 3 onto a new file
# from parity rows (throttled) while fio writes; the server is killed
# mid-rebuild and the restarted one resumes it past the recorded cursor
# and finishes; everything verifies with nothing reconstructed, scrub
# finds nothing, `pool check` clean.
. "$(dirname "$0")/lib.sh"
need fio qemu-img qemu-io jq nbdkit nbdfuse fusermount3 mountpoint python3
need_root "nbdfuse, drop_caches"
need_fuse
nbdkit --filter=error null --dump-plugin >/dev/null 2>&1 || cannot_run "nbdkit error filter missing (run scripts/deps.sh)"
e2e_init parity

M=$((1 << 20))
POOL=$T/pool.img
RTRIG=$T/rtrigger
FUSE=$T/fuse
DEV=$FUSE/dev
KIT_SOCK=$T/kit.sock
KIT_PID=
FUSE_PID=

attach_device() { # member 3: nbdfuse <- nbdkit (error filter) <- m3.raw
  attach_error_device "$T/m3.raw"
}

parity_exit() {
  local rc=$?
  set +e
  rm -f "$RTRIG"
  if [ -n "$SERVE_PID" ]; then
    kill -TERM "$SERVE_PID" 2>/dev/null
    for _ in $(seq 1 100); do kill -0 "$SERVE_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SERVE_PID" 2>/dev/null; wait "$SERVE_PID" 2>/dev/null; SERVE_PID=
  fi
  mountpoint -q "$FUSE" && { fusermount3 -u "$FUSE" 2>/dev/null || fusermount3 -uz "$FUSE"; }
  [ -n "$KIT_PID" ] && kill -TERM "$KIT_PID" 2>/dev/null
  (exit $rc); e2e_cleanup
}
trap parity_exit EXIT

json_of() { # VOL SIZE: a qemu-img target for the first SIZE bytes of export VOL
  echo "json:{\"driver\":\"raw\",\"size\":$2,\"file\":{\"driver\":\"nbd\",\"server\":{\"type\":\"inet\",\"host\":\"127.0.0.1\",\"port\":\"$SERVE_PORT\"},\"export\":\"$1\"}}"
}
fio_job() { # NAME VOL RW SIZE [fio options...]: 1M (or --bs) writes with crc32c verify
  local name=$1 vol=$2 rw=$3 size=$4; shift 4
  (cd "$T" && timeout 300 fio --name="$name" --ioengine=nbd --uri="$(uri "$vol")" --rw="$rw" --bs=1M --iodepth=8 \
    --size="$size" --verify=crc32c --output-format=json --output="$T/$name.json" "$@") >"$T/$name.out" 2>&1
}
status() { tarn pool status -p "$POOL" --json; }
# member 3's pages must come from nbdkit, not the page cache
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

attach_device
for i in 1 2; do truncate -s 256M "$T/m$i.img"; done
check "tarn pool create on 4 members (member 3 behind nbdkit's error filter)" \
  tarn pool create "$POOL" --size 256M --device "$T/m1.img" --device "$T/m2.img" --device "$DEV"

step "bad layouts are refused by name, nothing created"
for args in "4:usable" "3:12K:power of two" "3:128K:64 KiB" "1:mirror" "x:data member count"; do
  IFS=: read -r n u why <<<"$args"
  [ "$why" ] || { why=$u; u=; }
  check_fails "vol create --parity $n${u:+:$u}" "$TARN" vol create bad --size 64M --parity "$n${u:+:$u}" -p "$POOL"
  case $LAST_OUT in *"$why"*) ok "the error names the cause ($why)" ;; *) bad "error for --parity $n${u:+:$u}: $LAST_OUT" ;; esac
done
check_fails "--parity 2 --devices 0,1 (3 members needed of 2)" "$TARN" vol create bad --size 64M --parity 2 --devices 0,1 -p "$POOL"
check_fails "--parity 2 --stripe 2" "$TARN" vol create bad --size 64M --parity 2 --stripe 2 -p "$POOL"
expect_eq "no volume was created" "$(tarn vol list -p "$POOL" --json | jq length)" 0

step "a 3+1 parity volume: the layout is recorded and shown"
check "vol create p --parity 3" tarn vol create p --size 192M --parity 3 -p "$POOL"
expect_eq "vol list --json: p's parity" "$(tarn vol list -p "$POOL" --json | jq -c '.[] | select(.name=="p") | .parity')" \
  '{"data":3,"members":[0,1,2,3],"unit":16384}'
check "vol list (text) shows 3+1x16.00 KiB on 0,1,2,3" bash -c "\"$TARN\" vol list -p \"$POOL\" | grep -q '^p .*3+1x16.00 KiB on 0,1,2,3'"
check_fails "vol resize of a parity volume" "$TARN" vol resize p --size 256M -p "$POOL"
case $LAST_OUT in *parity*) ok "the error names the cause (parity)" ;; *) bad "resize error: $LAST_OUT" ;; esac

ALERTS=$T/alerts.jsonl; : >"$ALERTS"
start_serve "$POOL" --alert-exec "cat >>$ALERTS"
step "qemu-img convert + compare, fio sequential and random writes with verify"
head -c $((48 * M)) /dev/urandom >"$T/src.raw"
check "qemu-img convert 48 MiB into p at offset 0" qemu-img convert -n -f raw -O raw "$T/src.raw" "$(uri p)"
check "p's first 48 MiB compare equal to the source" qemu-img compare -f raw -F raw "$T/src.raw" "$(json_of p $((48 * M)))"
rc=0; fio_job seq p write 64M --offset=64M || rc=$?
expect_eq "fio 1M write + verify on p (exit, errors)" "$rc $(jq '[.jobs[].error] | add' "$T/seq.json")" "0 0"
rc=0; fio_job rand p randwrite 32M --bs=4k --iodepth=32 --offset=128M || rc=$?
expect_eq "fio 4K randwrite + verify on p (exit, errors)" "$rc $(jq '[.jobs[].error] | add' "$T/rand.json")" "0 0"
check "qemu-io write -P 0x5a 4K at 176M (a block to rot later) + flush" qemu-io -f raw -c "write -P 0x5a 176M 4k" -c flush "$(uri p)"
expect_eq "nothing rebuilt while every member is healthy" "$(status | jq .reconstructed_blocks)" 0
check_fails "no parity_reconstruction alert while every member is healthy" grep -q parity_reconstruction "$ALERTS"

step "member 3 fails every read: p still reads right, rebuilt from its rows"
touch "$RTRIG"
drop_caches
check "p's first 48 MiB still compare equal to the source" qemu-img compare -f raw -F raw "$T/src.raw" "$(json_of p $((48 * M)))"
rc=0; fio_job seqv p write 64M --offset=64M --verify_only=1 || rc=$?
expect_eq "fio verify-only of the sequential writes" "$rc" 0
rc=0; fio_job randv p randwrite 32M --bs=4k --iodepth=32 --offset=128M --verify_only=1 || rc=$?
expect_eq "fio verify-only of the random writes" "$rc" 0
n=$(status | jq .reconstructed_blocks)
expect_between "pool status: blocks rebuilt from their row (of ~36 MiB on member 3)" "$n" 4000 100000
check "pool status (text) says reconstructed" bash -c "\"$TARN\" pool status -p \"$POOL\" | grep -q '[1-9][0-9]* reconstructed'"
n=$(grep -c "reading through member 3 by reconstruction" "$SERVE_LOG" || true)
expect_eq "server log: reconstruction through member 3 logged once" "$n" 1
wait_until 10 grep -q '"reason":"parity_reconstruction"' "$ALERTS" && ok "a degraded alert (parity_reconstruction) reached --alert-exec" ||
  bad "no parity_reconstruction alert in $ALERTS: $(head -c 300 "$ALERTS" 2>/dev/null)"
grep -q "injecting EIO error into pread" "$T/nbdkit.log" && ok "nbdkit injected the read errors" ||
  bad "nbdkit did not inject read errors"
rm -f "$RTRIG"
stop_serve

step "scrub verifies every row and rebuilds a rotted block"
at=$(python3 - "$T/m1.img" "$T/m2.img" "$T/pool.img" "$T/m3.raw" <<'EOF'
import sys
want = b"\x5a" * 4096
for i, path in enumerate(sys.argv[1:]):
    with open(path, "rb") as f:
        off = 0
        while True:
            b = f.read(4096)
            if len(b) < 4096:
                break
            if b == want:
                print(path, off)
                sys.exit(0)
            off += 4096
EOF
)
read -r rot_file rot_off <<<"$at"
[ -n "$rot_off" ] && ok "the 0x5a block lies at $rot_off of $(basename "$rot_file")" || bad "the 0x5a block was not found on any member"
printf 'X' | dd of="$rot_file" bs=1 seek=$((rot_off + 100)) conv=notrunc status=none
rc=0; out=$(tarn pool scrub -p "$POOL" 2>&1) || rc=$?
expect_eq "tarn pool scrub exit (0: clean or repaired)" "$rc" 0
say "$out" | sed 's/^/       /'
case $out in *"parity: "*" rows verified, 0 mismatched, 1 rebuilt from their row, 1 rewritten"*) ok "scrub: 1 row rebuilt and rewritten" ;;
  *) bad "scrub output: $out" ;; esac
check "tarn pool scrub again: nothing left" bash -c "\"$TARN\" pool scrub -p \"$POOL\" | grep -q ' 0 mismatched, 0 rebuilt'"
pool_check "$POOL" "after scrub"
start_serve "$POOL"
check "the rotted block reads 0x5a" qemu-io -f raw -c "read -P 0x5a 176M 4k" "$(uri p)"
check "p's first 48 MiB compare equal after the restart" qemu-img compare -f raw -F raw "$T/src.raw" "$(json_of p $((48 * M)))"
expect_eq "nothing rebuilt after the heal and restart" "$(status | jq .reconstructed_blocks)" 0
stop_serve
pool_check "$POOL" "after the restart"

step "member 3 missing: the pool opens DEGRADED, p is served from its rows, a plain volume on member 3 fails"
start_serve "$POOL"
check "vol create q --devices 3 (a plain volume on member 3 alone)" tarn vol create q --size 16M --devices 3 -p "$POOL"
check "qemu-io write -P 0x33 1M into q + flush" qemu-io -f raw -c "write -P 0x33 0 1M" -c flush "$(uri q)"
stop_serve
fusermount3 -u "$FUSE" || fusermount3 -uz "$FUSE"
kill -TERM "$KIT_PID" 2>/dev/null; wait "$KIT_PID" 2>/dev/null; KIT_PID=
check_fails "member 3's device ($DEV) is gone" test -e "$DEV"
ALERTS2=$T/alerts2.jsonl; : >"$ALERTS2"
start_serve "$POOL" --alert-exec "cat >>$ALERTS2"
expect_eq "pool status --json: pool state, member 3 state" "$(status | jq -r '.state + " " + .devices[3].state')" "DEGRADED UNAVAIL"
check "pool status (text) says DEGRADED and UNAVAIL" bash -c "\"$TARN\" pool status -p \"$POOL\" | grep -q DEGRADED && \"$TARN\" pool status -p \"$POOL\" | grep -q 'device 3  UNAVAIL'"
check "server log: member 3 is missing, opening DEGRADED" grep -q "member 3 .* is missing; opening DEGRADED" "$SERVE_LOG"
check "p's first 48 MiB compare equal with member 3 missing" qemu-img compare -f raw -F raw "$T/src.raw" "$(json_of p $((48 * M)))"
rc=0; fio_job seqm p write 64M --offset=64M --verify_only=1 || rc=$?
expect_eq "fio verify-only of the sequential writes, member 3 missing" "$rc" 0
rc=0; fio_job randm p randwrite 32M --bs=4k --iodepth=32 --offset=128M --verify_only=1 || rc=$?
expect_eq "fio verify-only of the random writes, member 3 missing" "$rc" 0
expect_between "pool status: blocks rebuilt from their row" "$(status | jq .reconstructed_blocks)" 4000 100000
check_fails "qemu-io read of q (its blocks are on member 3 only): an error, not data" qemu-io -f raw -c "read -P 0x33 0 4k" "$(uri q)"
wait_until 10 grep -q '"state":"UNAVAIL"' "$ALERTS2" && ok "a degraded alert naming member 3 UNAVAIL reached --alert-exec" ||
  bad "no degraded alert in $ALERTS2: $(head -c 300 "$ALERTS2" 2>/dev/null)"

step "pool replace rebuilds member 3 onto a new file from parity rows, online while fio writes"
check_fails "pool replace 3 while q holds blocks there" "$TARN" pool replace 3 "$T/m3new.img" --size 256M -p "$POOL"
case $LAST_OUT in *"without parity"*"q ("*) ok "the refusal names q" ;; *) bad "replace refusal: $LAST_OUT" ;; esac
expect_eq "nothing changed: member 3 still UNAVAIL" "$(status | jq -r '.devices[3].state')" UNAVAIL
check "vol delete q" tarn vol delete q -p "$POOL"
rm -f "$T/m3new.img"
# Throttled to 2 MiB/s (48 MiB: at least 24 s), so fio's 16 MiB of 4K
# writes run during the rebuild and the server can be killed mid-way.
"$TARN" pool replace 3 "$T/m3new.img" --size 256M --rate 2M -p "$POOL" >"$T/replace.out" 2>&1 & REPLACE_PID=$!
wait_until 60 grep -q "replace: *[1-9]" "$T/replace.out" && ok "the rebuild started (progress shown)" ||
  bad "no rebuild progress: $(tail -c 300 "$T/replace.out")"
expect_eq "pool status --json: member 3 REBUILDING, the pool DEGRADED" "$(status | jq -r '.state + " " + .devices[3].state')" "DEGRADED REBUILDING"
rc=0; fio_job live p randwrite 16M --bs=4k --iodepth=16 --offset=160M --end_fsync=1 || rc=$?
expect_eq "fio 4K randwrite + verify during the rebuild (exit, errors)" "$rc $(jq '[.jobs[].error] | add' "$T/live.json")" "0 0"
expect_eq "member 3 still REBUILDING when fio is done" "$(status | jq -r '.devices[3].state')" REBUILDING
kill -KILL "$SERVE_PID"; wait "$SERVE_PID" 2>/dev/null || true; SERVE_PID=
rc=0; wait "$REPLACE_PID" || rc=$?
[ "$rc" -ne 0 ] && ok "pool replace ends with an error when the server is killed ($rc)" || bad "pool replace exit $rc after the kill"
start_serve "$POOL"
at=$(sed -n 's/.*being rebuilt from parity rows: done below block \([0-9]*\).*/\1/p' "$SERVE_LOG" | head -1)
expect_between "the restart resumes past the recorded cursor (block)" "${at:-0}" 33 100000000
wait_until 120 bash -c "\"$TARN\" pool status -p \"$POOL\" --json | jq -e '.state == \"ONLINE\"' >/dev/null" &&
  ok "the service finished the rebuild in the background" || bad "not ONLINE: $(status | jq -c '[.state, .devices[3]]')"
check "server log: the rebuild resumed and ended" bash -c "grep -q 'rebuild resumes in the background' \"$SERVE_LOG\" && grep -q 'rebuilt from parity rows; the pool is whole' \"$SERVE_LOG\""
expect_eq "pool status --json: pool state, member 3 state and path" \
  "$(status | jq -r '.state + " " + .devices[3].state + " " + .devices[3].path')" "ONLINE ONLINE $T/m3new.img"
# Member 3 is whole now: a second replace copies it (a present member's
# replace, tests/e2e/replace.sh), nothing rebuilt from rows.
check "pool replace 3 again: a copy of the present member, not a rebuild" bash -c \
  "\"$TARN\" pool replace 3 \"$T/m3new2.img\" --size 256M -p \"$POOL\" --json | jq -e '.copied_bytes > 0 and .reconstructed_blocks == 0 and .lost_blocks == 0'"
expect_eq "member 3 is m3new2.img, ONLINE" "$(status | jq -r '.state + " " + .devices[3].state + " " + .devices[3].path')" "ONLINE ONLINE $T/m3new2.img"
stop_serve
start_serve "$POOL"
check "p's first 48 MiB compare equal after the rebuild and a restart" qemu-img compare -f raw -F raw "$T/src.raw" "$(json_of p $((48 * M)))"
rc=0; fio_job seqr p write 64M --offset=64M --verify_only=1 || rc=$?
expect_eq "fio verify-only of the sequential writes after the rebuild" "$rc" 0
rc=0; fio_job liver p randwrite 16M --bs=4k --iodepth=16 --offset=160M --verify_only=1 || rc=$?
expect_eq "fio verify-only of the writes made during the rebuild" "$rc" 0
expect_eq "nothing read by reconstruction after the rebuild" "$(status | jq .reconstructed_blocks)" 0
stop_serve
check "tarn pool scrub after the rebuild: nothing to rebuild" bash -c "\"$TARN\" pool scrub -p \"$POOL\" | grep -q ' 0 mismatched, 0 rebuilt from their row'"
pool_check "$POOL" "at the end"
e2e_finish
