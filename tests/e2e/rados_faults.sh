#!/usr/bin/env bash
# Faults and elasticity on a RADOS pool, against a real single-node cluster
# (scripts/ceph.sh): `dev add` and `dev grow` of rados:// devices and the
# threshold expansion growing one under a streaming writer; the OSD paused
# (SIGSTOP, so its memstore keeps its data) for less than --ceph-timeout
# while fio writes (I/O stalls and resumes, no error, verify clean) and for
# longer (a partition: the write and the flush fail with EIO, never hang,
# the pool fences itself and a restart recovers every flushed byte with the
# checker clean), and kill -9 of the server during a partition. The cluster
# not starting is a failure; TARN_SKIP=rados_faults skips the whole script.
. "$(dirname "$0")/lib.sh"
need ceph-mon ceph-osd ceph rados monmaptool uuidgen qemu-io fio jq od
need_pynbd
e2e_init rados_faults

ceph_cluster_start 'kill -CONT "${OSD:-0}" 2>/dev/null'
OSD=$(cat "$CEPHDIR/run/osd.0.pid")
ok "cluster up, OSD pid $OSD"
# Every tarn here gives up on an unanswered Ceph operation after 8 s.
TIMEOUT=8
export TARN_CEPH_TIMEOUT=$TIMEOUT
M=$((1 << 20))
G=$((1 << 30))

# header_size PREFIX: the device size its RADOS header object records
header_size() {
  rados -p tarn get "$1.header" "$T/hdr" >/dev/null 2>&1 || { echo none; return; }
  od -An -tu8 -j16 -N8 "$T/hdr" | tr -d ' '
}

step "dev add and dev grow of rados:// devices, online"
POOL=rados://tarn/main
check "pool create $POOL --size 1G" "$TARN" pool create "$POOL" --size 1G
make_vol "$POOL" v 1G
start_serve "$POOL"
check "dev add rados://tarn/m1 --size 1G (created)" "$TARN" dev add -p "$POOL" rados://tarn/m1 --size 1G
expect_eq "m1's header records 1 GiB" "$(header_size m1)" "$G"
check_fails "dev add of a RADOS device that does not exist, without --size" "$TARN" dev add -p "$POOL" rados://tarn/none
printf '%s' "$LAST_OUT" | grep -q "does not exist; pass --size" && ok "the message says to pass --size" ||
  bad "message: $(printf '%s' "$LAST_OUT" | tr '\n' ' ' | cut -c1-200)"
check_fails "dev add of a RADOS device too small for a member" "$TARN" dev add -p "$POOL" rados://tarn/tiny --size 64K
printf '%s' "$LAST_OUT" | grep -q "too small" && ok "the message says too small" ||
  bad "message: $(printf '%s' "$LAST_OUT" | tr '\n' ' ' | cut -c1-200)"
expect_eq "the refused device was removed again (objects named tiny.*)" "$(rados -p tarn ls | grep -c '^tiny\.')" 0
check_fails "dev add of a device already a member" "$TARN" dev add -p "$POOL" rados://tarn/m1
check "dev grow 1 --size 2G" "$TARN" dev grow -p "$POOL" 1 --size 2G
expect_eq "m1's header records 2 GiB" "$(header_size m1)" "$((2 * G))"
check "writes spread onto the new member" qemu-io -f raw -c "write -P 0x3c 0 1G" -c flush "$(uri v)"
stop_serve
check "after a restart the grown member is listed with its size" \
  bash -c "'$TARN' pool status -p '$POOL' | grep -q 'device 1  rados://tarn/m1  2.00 GiB'"
start_serve "$POOL"
check "the data reads back after the restart" qemu-io -f raw -c "read -P 0x3c 0 1G" "$(uri v)"
stop_serve
pool_check "$POOL" "after dev add and dev grow"

step "expansion at a threshold grows a RADOS device under a streaming writer"
EXP=rados://tarn/exp
check "pool create $EXP --size 256M" "$TARN" pool create "$EXP" --size 256M
make_vol "$EXP" e 900M
start_serve "$EXP" --expand-at 70 --expand-step 256M --expand-max 1280M
cat >"$T/seq.fio" <<JOB
[seq]
ioengine=nbd
uri=$(uri e)
rw=write
bs=1M
iodepth=8
size=900M
verify=crc32c
verify_fatal=1
do_verify=1
JOB
rc=0; (cd "$T" && timeout 600 fio --output-format=json --output="$T/seq.json" "$T/seq.fio") >"$T/seq.out" 2>&1 || rc=$?
expect_eq "fio 900 MiB sequential write + verify onto a 256 MiB RADOS pool: exit status" "$rc" 0
expect_eq "fio job errors" "$(jq '.jobs[0].error' "$T/seq.json" 2>/dev/null)" 0
GREW=$(header_size exp)
[ "$GREW" != none ] && [ "$GREW" -gt $((900 * M)) ] && ok "exp's header grew to $(mib "$GREW")" || bad "exp's header records $GREW bytes"
stop_serve
pool_check "$EXP" "after expansion"

step "the OSD paused 4 s (under the ${TIMEOUT} s timeout) while fio writes: stall, resume, no error"
start_serve "$POOL"
cat >"$T/stall.fio" <<JOB
[stall]
ioengine=nbd
uri=$(uri v)
rw=randwrite
bs=64k
iodepth=8
size=256M
time_based=1
runtime=12
verify=crc32c
verify_fatal=1
verify_backlog=256
randseed=77
JOB
(cd "$T" && timeout 120 fio --output-format=json --output="$T/stall.json" "$T/stall.fio" >"$T/stall.out" 2>&1; echo $? >"$T/stall.rc") &
FIO=$!
sleep 3
kill -STOP "$OSD"
sleep 4
kill -CONT "$OSD"
wait "$FIO" || true
expect_eq "fio exit status" "$(cat "$T/stall.rc")" 0
expect_eq "fio job errors" "$(jq '.jobs[0].error' "$T/stall.json" 2>/dev/null)" 0
# The pause may fall on a write or on a verify read (verify_backlog).
MAXLAT=$(jq '[.jobs[0].write.clat_ns.max, .jobs[0].read.clat_ns.max] | max' "$T/stall.json" 2>/dev/null | cut -d. -f1)
expect_between "the longest request waited through the pause (ms)" "$((${MAXLAT:-0} / 1000000))" 3000 $((TIMEOUT * 1000 - 1))
say "  fio: $(jq -r '.jobs[0].write.iops | floor' "$T/stall.json") write IOPS, $(jq -r '.jobs[0].read.io_bytes' "$T/stall.json") bytes verified"

step "a partition longer than the timeout: EIO (never a hang), nothing flushed lost"
check "write 0xa1 and flush before the partition" qemu-io -f raw -c "write -P 0xa1 0 8M" -c flush "$(uri v)"
kill -STOP "$OSD"
START=$SECONDS
rc=0; timeout 60 qemu-io -f raw -c "write -P 0xb2 16M 1M" -c "flush" "$(uri v)" >"$T/part.out" 2>&1 || rc=$?
kill -CONT "$OSD"
ELAPSED=$((SECONDS - START))
[ "$rc" != 0 ] && [ "$rc" != 124 ] && ok "the write during the partition failed (exit $rc) after ${ELAPSED} s" ||
  bad "the write during the partition: exit $rc after ${ELAPSED} s"
grep -q "Input/output error" "$T/part.out" && ok "the client saw EIO" || bad "not EIO: $(tr '\n' ' ' <"$T/part.out" | cut -c1-200)"
expect_between "it failed after the timeout, not before nor long after (s)" "$ELAPSED" $((TIMEOUT - 1)) $((TIMEOUT * 3))
# A flush whose commit cannot be written: written data first, then the
# partition, then the flush (the commit's journal write times out).
cat >"$T/flush.py" <<'PY'
import nbd, os, sys, time
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pwrite(b"\xb3" * (1 << 20), 24 << 20)
os.kill(int(sys.argv[2]), 19)  # SIGSTOP
t = time.monotonic()
try:
    h.flush()
    print("flush ok %.1f" % (time.monotonic() - t))
except nbd.Error as e:
    print("flush failed %.1f %s" % (time.monotonic() - t, e))
finally:
    os.kill(int(sys.argv[2]), 18)  # SIGCONT
PY
timeout 90 "$SYSPY" "$T/flush.py" "$(uri v)" "$OSD" >"$T/flush.out" 2>&1
kill -CONT "$OSD"
read -r WORD RESULT SECS _ <"$T/flush.out" || true
expect_eq "the flush during the partition" "$WORD $RESULT" "flush failed"
grep -q "EIO" "$T/flush.out" && ok "with EIO: $(cut -c1-120 "$T/flush.out")" || bad "flush: $(cut -c1-200 "$T/flush.out")"
expect_between "after the timeout, not long after (s)" "${SECS%.*}" $((TIMEOUT - 1)) $((TIMEOUT * 3))
grep -q "commit failed, fencing the pool" "$SERVE_LOG" && ok "the commit that could not be written fenced the pool (logged)" ||
  bad "no 'commit failed, fencing the pool' in the server log"
check_fails "writes after the partition are refused until a restart (fenced)" qemu-io -f raw -c "write -P 0xc3 32M 1M" -c flush "$(uri v)"
kill -TERM "$SERVE_PID" 2>/dev/null
for _ in $(seq 1 300); do kill -0 "$SERVE_PID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$SERVE_PID" 2>/dev/null && bad "the server still runs 30 s after SIGTERM" || ok "the server stopped on SIGTERM"
wait "$SERVE_PID" 2>/dev/null || true
SERVE_PID=
start_serve "$POOL"
check "every flushed byte after the restart" qemu-io -f raw -c "read -P 0xa1 0 8M" -c "read -P 0x3c 600M 100M" "$(uri v)"
check "writes work again" qemu-io -f raw -c "write -P 0xd4 40M 2M" -c flush -c "read -P 0xd4 40M 2M" "$(uri v)"
stop_serve
pool_check "$POOL" "after the partition"

step "kill -9 of the server during a partition, restart with --takeover"
start_serve "$POOL"
check "write 0xe5 and flush" qemu-io -f raw -c "write -P 0xe5 48M 4M" -c flush "$(uri v)"
kill -STOP "$OSD"
# A write never acknowledged may still land (the OSD applies what it had
# queued when it resumes), so it goes beside the flushed data, not over it.
timeout 60 qemu-io -f raw -c "write -P 0xf6 56M 4M" -c flush "$(uri v)" >/dev/null 2>&1 &
HUNG=$!
sleep 2
kill9_serve
kill -CONT "$OSD"
wait "$HUNG" 2>/dev/null || true
start_serve "$POOL" --takeover
check "flushed bytes after kill -9 in a partition" qemu-io -f raw -c "read -P 0xe5 48M 4M" -c "read -P 0xa1 0 8M" -c "read -P 0xd4 40M 2M" "$(uri v)"
stop_serve
pool_check "$POOL" "after kill -9 in a partition"
check "scrub clean" "$TARN" pool scrub -p "$POOL"
e2e_finish
