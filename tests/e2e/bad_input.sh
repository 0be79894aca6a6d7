#!/usr/bin/env bash
# Misuse and hostile input: bad CLI arguments, missing and corrupted pools
# (which must be refused without being modified), a pool running out of
# space (ENOSPC, then discard frees space), and out-of-range / overflowing
# NBD requests and protocol garbage that must not take the server down.
. "$(dirname "$0")/lib.sh"
need qemu-io nbdinfo sha256sum
need_pynbd
e2e_init bad_input

M=$((1 << 20))
POOL=$T/pool.img

# fails_with DESC PATTERN CMD...: must exit non-zero (not by a signal or
# timeout) and print something matching PATTERN (grep -Ei)
fails_with() {
  local desc=$1 pat=$2; shift 2
  check_fails "$desc" timeout 30 "$@"
  if [ "$LAST_RC" -ne 0 ]; then
    if [ "$LAST_RC" -ge 124 ]; then bad "$desc: exit $LAST_RC (timeout/signal, not a clean error)"
    elif ! printf '%s' "$LAST_OUT" | grep -Ei -- "$pat" >/dev/null; then bad "$desc: message does not match /$pat/: $(printf '%s' "$LAST_OUT" | head -3 | tr '\n' ' ')"
    fi
  fi
}

step "CLI argument errors"
fails_with "tarn with no arguments" 'usage|help|command' "$TARN"
fails_with "unknown subcommand" 'unrecognized|unknown|invalid|usage' "$TARN" frobnicate
fails_with "pool create on a missing file without --size" 'size' "$TARN" pool create "$T/nosize.img"
[ ! -e "$T/nosize.img" ] && ok "no file left behind by the failed pool create" || bad "failed pool create left $T/nosize.img"
make_pool "$POOL" 256M
fails_with "vol create without --size" 'size|required' "$TARN" vol create v -p "$POOL"
fails_with "vol create with a bad size" 'size|invalid|parse' "$TARN" vol create v --size 12XB -p "$POOL"
fails_with "vol create with size 0" 'size|zero|invalid|small' "$TARN" vol create v --size 0 -p "$POOL"
fails_with "vol create without a pool (-p / TARN_POOL unset)" 'pool|TARN_POOL|required' env -u TARN_POOL "$TARN" vol create v --size 1G
make_vol "$POOL" v 64M
fails_with "vol create of an existing name" 'exist|already|duplicate' "$TARN" vol create v --size 64M -p "$POOL"
fails_with "vol delete of an unknown volume" 'nosuch|not found|no such|unknown' "$TARN" vol delete nosuch -p "$POOL"
fails_with "vol resize of an unknown volume" 'nosuch|not found|no such|unknown' "$TARN" vol resize nosuch --size 1G -p "$POOL"
fails_with "vol resize shrink without --allow-shrink" 'shrink' "$TARN" vol resize v --size 32M -p "$POOL"
check "TARN_POOL env works for vol list" env TARN_POOL="$POOL" timeout 30 "$TARN" vol list
fails_with "vol create with an invalid name (slash)" 'name|invalid' "$TARN" vol create 'a/b' --size 1M -p "$POOL"

step "missing and corrupted pools"
fails_with "tarn serve -p /nonexistent/pool.img names the path" '/nonexistent/pool.img' \
  "$TARN" serve -p /nonexistent/pool.img --listen "127.0.0.1:$(free_port)"
fails_with "pool status of a missing pool names the path" '/nonexistent/pool.img' "$TARN" pool status -p /nonexistent/pool.img
rc=0; timeout 30 "$TARN" pool check -p /nonexistent/pool.img >/dev/null 2>&1 || rc=$?
expect_eq "pool check of a missing pool exits 2 (could not check)" "$rc" 2
head -c $((4 * M)) /dev/urandom >"$T/random.img"
fails_with "serve on a file of random bytes is refused" 'superblock|magic|not a tarn|pool|corrupt|invalid' \
  "$TARN" serve -p "$T/random.img" --listen "127.0.0.1:$(free_port)"

# a real pool with data, then copies with damaged superblock areas
start_serve "$POOL"
check "write 8M into v" timeout 60 qemu-io -f raw "$(uri v)" -c "write -P 0x3c 0 8M" -c flush
stop_serve
cp --sparse=always "$POOL" "$T/both.img"
dd if=/dev/urandom of="$T/both.img" bs=64K count=2 conv=notrunc status=none
sum_before=$(sha256sum <"$T/both.img")
fails_with "serve on a pool with both superblock copies (first 128 KiB) garbage" 'superblock|corrupt|checksum|magic|invalid|not a tarn' \
  "$TARN" serve -p "$T/both.img" --listen "127.0.0.1:$(free_port)"
fails_with "vol list on that pool" 'superblock|corrupt|checksum|magic|invalid|not a tarn' "$TARN" vol list -p "$T/both.img"
rc=0; timeout 60 "$TARN" pool check -p "$T/both.img" >"$T/check-both.out" 2>&1 || rc=$?
if [ $rc -eq 1 ] || [ $rc -eq 2 ]; then ok "pool check on it exits $rc ($(head -1 "$T/check-both.out"))"
else bad "pool check on a pool with both superblocks destroyed exits $rc (want 1 or 2)"; fi
expect_eq "corrupted pool file byte-identical after the attempts (sha256)" "$(sha256sum <"$T/both.img")" "$sum_before"
# one copy (the first 64 KiB, copy 0) damaged: the other copy should still open it
cp --sparse=always "$POOL" "$T/one.img"
dd if=/dev/urandom of="$T/one.img" bs=64K count=1 conv=notrunc status=none
out=$(timeout 30 "$TARN" vol list -p "$T/one.img" --json 2>&1) && printf '%s' "$out" | grep '"v"' >/dev/null &&
  ok "pool with only superblock copy 0 damaged still opens from copy 1" ||
  bad "pool with only superblock copy 0 (first 64 KiB) damaged does not open: $(printf '%s' "$out" | head -2 | tr '\n' ' ')"
rm -f "$T/one.img" "$T/both.img"

step "full pool: 64M pool, 1G volume"
FULL=$T/full.img
make_pool "$FULL" 64M
make_vol "$FULL" big 1G
start_serve "$FULL"
written=0; err=
for i in $(seq 0 31); do
  if ! out=$(timeout 60 qemu-io -f raw "$(uri big)" -c "write -P 0x5e $((i * 4 * M)) 4M" -c flush 2>&1) ||
     printf '%s' "$out" | grep -i 'error\|failed' >/dev/null; then
    err=$out; break
  fi
  written=$((written + 4 * M))
done
say "  wrote $(mib $written) before the first error"
if [ -z "$err" ]; then bad "writing 128M into a 64M pool never failed"
else
  printf '%s' "$err" | grep -i 'no space left' >/dev/null && ok "write fails with ENOSPC: $(printf '%s' "$err" | grep -i 'no space' | head -1)" ||
    bad "write into a full pool failed, but not with ENOSPC: $(printf '%s' "$err" | head -3 | tr '\n' ' ')"
fi
expect_between "bytes accepted before ENOSPC" "$written" $((16 * M)) $((64 * M))
check "server still serves reads on a new connection" timeout 30 qemu-io -f raw "$(uri big)" -c "read -P 0x5e 0 4M"
vol_get "$FULL" big allocated; A1=$VAL
check "qemu-io discard 0..32M on the full pool" timeout 60 qemu-io -f raw "$(uri big)" -c "discard 0 32M" -c flush
vol_get "$FULL" big allocated; A2=$VAL
say "  allocated before discard $(mib "$A1"), after $(mib "$A2")"
expect_between "discard freed >= 24M" $((A1 - A2)) $((24 * M)) $((40 * M))
check "writing 16M into freed space works again" timeout 60 qemu-io -f raw "$(uri big)" -c "write -P 0x6f 0 16M" -c flush -c "read -P 0x6f 0 16M"
if [ $written -gt $((32 * M)) ]; then
  check "data beyond the discard still intact" timeout 60 qemu-io -f raw "$(uri big)" -c "read -P 0x5e $((32 * M)) $((written - 32 * M))"
fi
stop_serve
pool_check "$FULL" "full pool after ENOSPC + discard"
out=$(timeout 30 "$TARN" pool status -p "$FULL" --json 2>&1) || out=
say "  pool status: $(printf '%s' "$out" | tr -d '\n' | cut -c1-200)"

step "hostile NBD requests"
start_serve "$POOL"
cat >"$T/oob.py" <<'PY'
import socket, sys, nbd
uri, uri2, host, port = sys.argv[1:5]
fails = 0
def conn(u):
    h = nbd.NBD()
    h.set_strict_mode(0)   # let bad requests reach the server
    h.connect_uri(u)
    return h
def expect_err(what, fn):
    global fails
    try:
        fn()
    except nbd.Error as e:
        print(f"  ok   {what}: error {e.errno or ''} {str(e)[:80]}")
        return
    print(f"  FAIL {what}: succeeded")
    fails += 1
h = conn(uri)
size = h.get_size()
expect_err("read past the end (size-512, 4096)", lambda: h.pread(4096, size - 512))
expect_err("read at offset 2^64-4096", lambda: h.pread(4096, 2**64 - 4096))
expect_err("write at offset 2^64-512 (wraps)", lambda: h.pwrite(b"x" * 4096, 2**64 - 512))
expect_err("trim past the end", lambda: h.trim(1 << 20, size - 4096))
expect_err("zero at offset 2^63", lambda: h.zero(4096, 2**63))
try:
    h.pread(64 << 20, 0)
    print("  note 64M read accepted")
except nbd.Error as e:
    print(f"  note 64M read refused: {str(e)[:80]}")
# the same connection should still work (errors are per request) ...
try:
    h.pwrite(b"\xab" * 4096, 0); assert h.pread(4096, 0) == b"\xab" * 4096
    print("  ok   first connection still usable after the errors")
except Exception as e:
    print(f"  FAIL first connection unusable after errors: {e}"); fails += 1
# ... and certainly a second one
try:
    h2 = conn(uri2)
    assert h2.pread(4096, 0) == b"\xab" * 4096
    h2.shutdown()
    print("  ok   second connection reads fine")
except Exception as e:
    print(f"  FAIL second connection: {e}"); fails += 1
# protocol garbage on raw sockets: must not take the server down
for junk in [b"\x00" * 64, b"GET / HTTP/1.0\r\n\r\n", b"\xff" * 4096]:
    s = socket.create_connection((host, int(port)), timeout=5)
    try:
        s.recv(256); s.sendall(junk); s.settimeout(3); s.recv(256)
    except Exception:
        pass
    s.close()
# a client that negotiates and then vanishes mid-request
s = socket.create_connection((host, int(port)), timeout=5)
s.close()
try:
    h3 = conn(uri2)
    assert h3.pread(4096, 0) == b"\xab" * 4096
    print("  ok   server alive after protocol garbage")
except Exception as e:
    print(f"  FAIL after protocol garbage: {e}"); fails += 1
sys.exit(1 if fails else 0)
PY
if out=$(timeout 120 "$SYSPY" "$T/oob.py" "$(uri v)" "$(uri_unix v)" 127.0.0.1 "$SERVE_PORT" 2>&1); then
  printf '%s\n' "$out"; ok "out-of-range / overflow requests refused, server and connections survive"
else
  printf '%s\n' "$out"; bad "hostile NBD requests: $(printf '%s' "$out" | grep FAIL | tr '\n' ' ' | cut -c1-300)"
fi
kill -0 "$SERVE_PID" 2>/dev/null && ok "tarn serve still running" || bad "tarn serve died"
stop_serve
pool_check "$POOL" "after hostile requests"
e2e_finish
