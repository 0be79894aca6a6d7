#!/usr/bin/env bash
# A device that fails I/O, with real parts: nbdkit's error filter over a raw
# file, exposed as a regular file by nbdfuse, is the pool's only device;
# errors are injected only while a trigger file exists. Read errors reach
# the NBD client as EIO (never as data), are counted and logged with the
# device, and the server stays up; a failed data write is an EIO to its
# client; a commit that cannot be written fences the pool (writes and flushes
# then fail with ESHUTDOWN, reads go on) and the server stays up; after a
# restart on the healed device every flushed byte is there, what was never
# committed is not, `pool check` is clean and writes work again.
. "$(dirname "$0")/lib.sh"
need nbdkit nbdfuse fusermount3 mountpoint qemu-io nbdcopy nbdinfo sha256sum jq
need_root "drop_caches"
need_fuse
need_pynbd
nbdkit --filter=error null --dump-plugin >/dev/null 2>&1 || cannot_run "nbdkit error filter missing (run scripts/deps.sh)"
e2e_init faults_io

M=$((1 << 20))
VOL=v
VOLSIZE=$((64 * M))
RTRIG=$T/rtrigger
WTRIG=$T/wtrigger
FUSE=$T/fuse
DEV=$FUSE/dev           # the pool's device: a file served by nbdfuse <- nbdkit <- backing.raw
KIT_SOCK=$T/kit.sock
KIT_PID=
FUSE_PID=

# expected volume contents: every acknowledged + flushed write, nothing else
truncate -s $VOLSIZE "$T/expect.raw"
expect_write() {  # OFFSET LENGTH BYTE [FILE]
  "$SYSPY" -c 'import sys
f = open(sys.argv[1], "r+b"); f.seek(int(sys.argv[2])); f.write(bytes([int(sys.argv[4], 0)]) * int(sys.argv[3]))' \
    "${4:-$T/expect.raw}" "$1" "$2" "$3"
}
EXPECT_SHA=
expect_sha() { EXPECT_SHA=$(sha256sum <"${1:-$T/expect.raw}" | cut -d' ' -f1); }

drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# vol_sha: sha256 of the whole volume read over NBD (every byte) into VOL_SHA
VOL_SHA=
vol_sha() {
  rm -f "$T/copy.raw"
  if timeout 60 nbdcopy --no-extents "$(uri $VOL)" "$T/copy.raw" >"$T/nbdcopy.log" 2>&1; then
    VOL_SHA=$(sha256sum <"$T/copy.raw" | cut -d' ' -f1)
  else
    VOL_SHA="nbdcopy failed: $(tail -2 "$T/nbdcopy.log" | tr '\n' ' ')"
  fi
  rm -f "$T/copy.raw"
}

# nbdop OP...: one libnbd connection runs the ops in order, one line each:
#   w:OFF:LEN:BYTE  r:OFF:LEN:BYTE (checks the bytes)  f (flush)
#   touch:PATH  rm:PATH  (trigger files, between two requests)
# A line is "OP ok", "OP WRONGDATA" or "OP ERRNO message". Sets NBDOP_OUT.
NBDOP_OUT=
nbdop() {
  NBDOP_OUT=$(timeout 60 "$SYSPY" - "$(uri $VOL)" "$@" 2>&1 <<'EOF'
import os, sys, nbd
h = nbd.NBD(); h.connect_uri(sys.argv[1])
for op in sys.argv[2:]:
    kind, *a = op.split(":")
    try:
        if kind == "w":
            h.pwrite(bytes([int(a[2], 0)]) * int(a[1]), int(a[0]))
        elif kind == "r":
            if h.pread(int(a[1]), int(a[0])) != bytes([int(a[2], 0)]) * int(a[1]):
                print(op, "WRONGDATA", flush=True); continue
        elif kind == "f":
            h.flush()
        elif kind == "touch":
            open(a[0], "w").close()
        elif kind == "rm":
            os.unlink(a[0])
        print(op, "ok", flush=True)
    except nbd.Error as e:
        print(op, e.errno, e.string, flush=True)  # the binding gives the errno name
EOF
  ) || NBDOP_OUT="$NBDOP_OUT
(nbdop exit $?)"
}
# op_result OP: the result of OP in NBDOP_OUT ("ok", "WRONGDATA", errno name, or "missing")
op_result() {
  local line
  line=$(printf '%s\n' "$NBDOP_OUT" | awk -v op="$1" '$1 == op { print $2; exit }')
  printf '%s' "${line:-missing}"
}
expect_op() {  # DESC OP WANT
  local got; got=$(op_result "$2")
  if [ "$got" = "$3" ]; then ok "$1 ($2 -> $got)"
  else
    bad "$1: $2 -> '$got', want '$3'"
    printf '%s\n' "$NBDOP_OUT" | tail -n 10 | sed 's/^/       | /'
  fi
}

server_up() {
  if [ -n "$SERVE_PID" ] && kill -0 "$SERVE_PID" 2>/dev/null &&
     timeout 10 nbdinfo --size "$(uri $VOL)" >"$T/nbdinfo.out" 2>&1 &&
     [ "$(cat "$T/nbdinfo.out")" = $VOLSIZE ]; then
    ok "server still up: nbdinfo --size answers $VOLSIZE ($1)"
  else
    bad "server not answering ($1): $(tail -2 "$T/nbdinfo.out" 2>/dev/null | tr '\n' ' ')"
  fi
}

# stop_serve_rc: SIGTERM, wait; the exit status in STOP_RC (lib.sh stop_serve asserts 0)
STOP_RC=
stop_serve_rc() {
  local i
  STOP_RC=
  [ -n "$SERVE_PID" ] || return 0
  kill -TERM "$SERVE_PID" 2>/dev/null || true
  for i in $(seq 1 600); do kill -0 "$SERVE_PID" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$SERVE_PID" 2>/dev/null; then
    bad "tarn serve still running 60s after SIGTERM; killing it"
    kill -KILL "$SERVE_PID"; wait "$SERVE_PID" 2>/dev/null || true
    STOP_RC=killed
  else
    STOP_RC=0; wait "$SERVE_PID" || STOP_RC=$?
  fi
  SERVE_PID=
}

attach_device() {
  rm -f "$WTRIG"
  attach_error_device "$T/backing.raw" error-pwrite-rate=100% error-pwrite-file="$WTRIG"
  expect_eq "nbdfuse file (nbdkit error filter over 256 MiB) size" "$(stat -c %s "$DEV")" $((256 * M))
  say "  device: $DEV (nbdfuse pid $FUSE_PID) <- nbdkit pid $KIT_PID on $KIT_SOCK <- $T/backing.raw"
}

# detach_device [quiet]: unmount nbdfuse, stop nbdkit (checks unless quiet)
detach_device() {
  local quiet=${1:-} i
  rm -f "$RTRIG" "$WTRIG"
  if mountpoint -q "$FUSE"; then
    if [ -n "$quiet" ]; then fusermount3 -u "$FUSE" 2>/dev/null || fusermount3 -uz "$FUSE"
    else check "fusermount3 -u" fusermount3 -u "$FUSE"; fi
  fi
  if [ -n "$FUSE_PID" ]; then
    for i in $(seq 1 100); do kill -0 "$FUSE_PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$FUSE_PID" 2>/dev/null; then
      [ -n "$quiet" ] || bad "nbdfuse still running 10s after unmount"
      kill "$FUSE_PID" 2>/dev/null
    fi
    wait "$FUSE_PID" 2>/dev/null || true
    FUSE_PID=
  fi
  if [ -n "$KIT_PID" ]; then
    kill -TERM "$KIT_PID" 2>/dev/null
    for _ in $(seq 1 100); do kill -0 "$KIT_PID" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$KIT_PID" 2>/dev/null && kill -KILL "$KIT_PID" 2>/dev/null
    wait "$KIT_PID" 2>/dev/null || true
    KIT_PID=
  fi
}

# on any exit: the server first (it holds the FUSE file), then the device
# stack, then lib.sh's cleanup (logs, temp dir, summary)
faults_io_exit() {
  local rc=$?
  set +e
  rm -f "$RTRIG" "$WTRIG"
  if [ -n "$SERVE_PID" ]; then
    kill -TERM "$SERVE_PID" 2>/dev/null
    for _ in $(seq 1 100); do kill -0 "$SERVE_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SERVE_PID" 2>/dev/null; wait "$SERVE_PID" 2>/dev/null; SERVE_PID=
  fi
  detach_device quiet
  (exit $rc); e2e_cleanup
}
trap faults_io_exit EXIT

no_panic() {
  if grep -q "panicked" "$SERVE_LOG"; then bad "tarn serve panicked: $(grep -m1 panicked "$SERVE_LOG")"
  else ok "no panic in the server log ($1)"; fi
}

step "1. pool on a file served by nbdfuse from nbdkit (error filter), a volume, 8 MiB flushed"
attach_device
check "tarn pool create on the existing nbdfuse file" tarn pool create "$DEV"
make_vol "$DEV" $VOL 64M
# no background commit: the commit that fails in step 4 must be the client's FLUSH
start_serve "$DEV" --commit-interval 3600
check "qemu-io write -P 0x5a 0 8M + flush" timeout 60 qemu-io -f raw "$(uri $VOL)" -c 'write -P 0x5a 0 8M' -c flush
expect_write 0 $((8 * M)) 0x5a; expect_sha
vol_sha
expect_eq "volume sha256 == expected (8 MiB of 0x5a, then zeros)" "$VOL_SHA" "$EXPECT_SHA"
SHA1=$VOL_SHA

step "2. read errors: EIO to the client, server up, counted, logged with the device"
drop_caches
touch "$RTRIG"
nbdop r:0:$M:0x5a r:$((4 * M)):$M:0x5a
expect_op "libnbd read of flushed data on a failing device gets EIO, no data" r:0:$M:0x5a EIO
expect_op "a second read elsewhere: EIO too" r:$((4 * M)):$M:0x5a EIO
check_fails "qemu-io read fails" timeout 60 qemu-io -f raw "$(uri $VOL)" -c "read -P 0x5a $((2 * M)) 1M"
if [ "$LAST_RC" != 124 ] && printf '%s' "$LAST_OUT" | grep -q "Input/output error"; then
  ok "qemu-io: 'read failed: Input/output error' (no hang)"
else bad "qemu-io read: exit $LAST_RC: $(printf '%s' "$LAST_OUT" | tr '\n' ' ' | cut -c1-200)"; fi
server_up "reads failing"
# The CLI finds the running server by the pool uuid on the device, or, when
# the device cannot be read, by the alias the server made for its path.
if out=$(timeout 30 "$TARN" pool status -p "$DEV" --json 2>&1); then
  ok "pool status answers while device reads fail"
else
  bad "pool status while device reads fail: $(printf '%s' "$out" | tr '\n' ' ' | cut -c1-200)"
fi
n=$(grep -cF "read error on $DEV" "$SERVE_LOG" || true)
expect_between "server log: 'read error on $DEV' lines" "$n" 1 1000
grep -F "read error on $DEV" "$SERVE_LOG" | head -n 1 | sed 's/^/       log: /'
grep -q "injecting EIO error into pread" "$T/nbdkit.log" && ok "nbdkit injected the pread errors" ||
  bad "nbdkit log has no injected pread error"

rm -f "$RTRIG"
json=$(tarn pool status -p "$DEV" --json 2>&1) || true
errs=$(printf '%s' "$json" | jq -r '.read_errors' 2>/dev/null || echo "?")
[[ "$errs" =~ ^[0-9]+$ ]] || { bad "pool status --json: no read_errors in: $(printf '%s' "$json" | cut -c1-200)"; errs=-1; }
expect_between "pool status read_errors" "$errs" 1 1000000
expect_eq "pool status checksum_errors (an I/O error is not a checksum error)" \
  "$(printf '%s' "$json" | jq -r '.checksum_errors' 2>/dev/null)" 0
say "  $(printf '%s' "$json" | jq -c '{checksum_errors,read_errors,healed_blocks,resynced_blocks}' 2>/dev/null)"
nbdop r:0:$M:0x5a r:$((4 * M)):$M:0x5a
expect_op "the device healed: the same read returns the data" r:0:$M:0x5a ok
expect_op "the second read too" r:$((4 * M)):$M:0x5a ok
vol_sha
expect_eq "volume sha256 after the read errors == step 1" "$VOL_SHA" "$SHA1"

step "3. a data write fails: EIO to its client, nothing else changes"
nbdop touch:"$WTRIG" w:$((8 * M)):$M:0x11 rm:"$WTRIG" w:$((8 * M)):$M:0x12 f r:$((8 * M)):$M:0x12
expect_op "write to a failing device gets EIO" w:$((8 * M)):$M:0x11 EIO
expect_op "device healed: the same write succeeds" w:$((8 * M)):$M:0x12 ok
expect_op "flush succeeds (pool not fenced by a failed data write)" f ok
expect_op "and reads back" r:$((8 * M)):$M:0x12 ok
expect_write $((8 * M)) $M 0x12; expect_sha
grep -q "write data on device $DEV" "$SERVE_LOG" && ok "server log: 'write data on device $DEV'" ||
  bad "server log does not name the device of the failed write"
server_up "after a failed write"

step "4. a commit fails: the FLUSH gets an error, the pool is fenced, reads and the server go on"
# the write is acknowledged (device cache), then the device fails, then FLUSH
nbdop w:$((16 * M)):$M:0x33 touch:"$WTRIG" f w:$((20 * M)):4096:0x44 f r:0:$M:0x5a
expect_op "write before the device fails is acknowledged" w:$((16 * M)):$M:0x33 ok
FLUSH_ERR=$(op_result f)
if [ "$FLUSH_ERR" != ok ] && [ "$FLUSH_ERR" != missing ] && [ "$FLUSH_ERR" != WRONGDATA ]; then
  ok "flush whose commit cannot be written fails with $FLUSH_ERR"
else bad "flush with the device failing writes: '$FLUSH_ERR', want an error"; printf '%s\n' "$NBDOP_OUT" | sed 's/^/       | /'; fi
# after the failed flush, the later write/flush lines: the fenced pool refuses them
fenced_w=$(printf '%s\n' "$NBDOP_OUT" | awk '$1 == "w:'$((20 * M))':4096:0x44" { print $2 }')
fenced_f=$(printf '%s\n' "$NBDOP_OUT" | awk '$1 == "f" { n++; if (n == 2) print $2 }')
expect_eq "write on the same connection after the failed commit (fenced)" "$fenced_w" ESHUTDOWN
expect_eq "flush after the failed commit (fenced)" "$fenced_f" ESHUTDOWN
expect_op "read on the same connection still works" r:0:$M:0x5a ok
grep -q "commit failed, fencing the pool: .*$DEV" "$SERVE_LOG" && ok "server log: $(grep -m1 'commit failed, fencing' "$SERVE_LOG" | sed 's/^.*ERROR //')" ||
  bad "server log has no 'commit failed, fencing the pool' line naming $DEV"
server_up "fenced"
check_fails "a new client's write + flush fails (fenced)" timeout 60 qemu-io -f raw "$(uri $VOL)" -c "write -P 0x55 $((24 * M)) 64k" -c flush
json=$(tarn pool status -p "$DEV" --json 2>&1) && ok "pool status answers while fenced (read_errors $(printf '%s' "$json" | jq -r .read_errors 2>/dev/null))" ||
  bad "pool status while fenced: $(printf '%s' "$json" | tr '\n' ' ' | cut -c1-200)"
expect_eq "pool status says fenced" "$(printf '%s' "$json" | "$SYSPY" -c 'import json,sys;print(json.load(sys.stdin)["fenced"])' 2>&1)" True
# until the restart the server still shows every acknowledged write, the
# uncommitted 0x33 too (it is in the device and in the in-memory map)
cp "$T/expect.raw" "$T/acked.raw"
expect_write $((16 * M)) $M 0x33 "$T/acked.raw"; expect_sha "$T/acked.raw"; ACKED_SHA=$EXPECT_SHA; expect_sha
drop_caches
vol_sha
expect_eq "fenced: the whole volume (caches dropped) reads as every acknowledged write" "$VOL_SHA" "$ACKED_SHA"

rm -f "$WTRIG"
nbdop w:$((20 * M)):4096:0x44 f r:$((8 * M)):$M:0x12
expect_op "device healed, still fenced until restart: write" w:$((20 * M)):4096:0x44 ESHUTDOWN
expect_op "device healed, still fenced: flush" f ESHUTDOWN
server_up "fenced, device healed"
no_panic "fenced"

step "5. restart on the healed device: flushed data intact, the failed commit gone, writes work"
stop_serve_rc
if [[ "$STOP_RC" =~ ^[0-9]+$ ]] && [ "$STOP_RC" -gt 0 ] && [ "$STOP_RC" -lt 128 ]; then
  ok "fenced tarn serve exits on SIGTERM with status $STOP_RC (not 0: no final commit; not a signal)"
else bad "fenced tarn serve after SIGTERM: status '$STOP_RC', want an error exit (1..127)"; fi
tail -n 1 "$SERVE_LOG" | sed 's/^/       last log line: /'
grep -q "final commit: the pool is fenced" "$SERVE_LOG" && ok "log says the final commit was refused (fenced)" ||
  bad "no 'final commit: the pool is fenced' in the server log"
no_panic "after SIGTERM"
pool_check "$DEV" "after the fenced shutdown"
start_serve "$DEV"
vol_sha
expect_eq "volume == every flushed write, the unflushed 0x33 never committed (zeros)" "$VOL_SHA" "$EXPECT_SHA"
check "qemu-io write + flush + read back after restart" timeout 60 qemu-io -f raw "$(uri $VOL)" \
  -c "write -P 0x6b $((16 * M)) 1M" -c flush -c "read -P 0x6b $((16 * M)) 1M"
expect_write $((16 * M)) $M 0x6b; expect_sha
stop_serve
pool_check "$DEV" "after writes on the restarted server"
start_serve "$DEV"
vol_sha
expect_eq "volume after a second restart == expected" "$VOL_SHA" "$EXPECT_SHA"
no_panic "restarted"
stop_serve

step "6. teardown: nbdfuse unmounted, nbdkit stopped"
detach_device
e2e_finish
