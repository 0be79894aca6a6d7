#!/usr/bin/env bash
# Exercise the `memserve` example with real NBD clients (libnbd's nbdinfo,
# nbdsh and nbdcopy, qemu-img, qemu-io, fio's nbd engine).
# Exits non-zero on the first failure or mismatch.
#
#   crates/nbd/tests/real_clients.sh            # builds memserve (release)
#   MEMSERVE=/path/to/memserve crates/nbd/tests/real_clients.sh
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
CRATE=$(dirname "$HERE")

fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }

for tool in nbdinfo nbdsh nbdcopy qemu-img qemu-io fio python3 cmp; do
    command -v "$tool" >/dev/null || fail "missing tool: $tool"
done

if [[ -z "${MEMSERVE:-}" ]]; then
    (cd "$CRATE" && cargo build --release --example memserve -q)
    TARGET=${CARGO_TARGET_DIR:-$(cd "$CRATE" && cargo metadata --format-version 1 --no-deps |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')}
    MEMSERVE=$TARGET/release/examples/memserve
fi
[[ -x "$MEMSERVE" ]] || fail "memserve not found at $MEMSERVE"

WORK=$(mktemp -d)
PORT=${PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
SOCK=$WORK/nbd.sock
URI=nbd://127.0.0.1:$PORT/mem
SIZE=$((64 * 1024 * 1024))

"$MEMSERVE" --size 64M --listen "127.0.0.1:$PORT" --socket "$SOCK" -v >"$WORK/memserve.log" 2>&1 &
PID=$!
cleanup() {
    kill "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
    if [[ -n "${KEEP:-}" ]]; then echo "logs in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'echo "--- memserve log (tail) ---"; tail -n 30 "$WORK/memserve.log" || true' ERR

for _ in $(seq 100); do
    nbdinfo --size "$URI" >/dev/null 2>&1 && break
    kill -0 "$PID" 2>/dev/null || fail "memserve exited: $(cat "$WORK/memserve.log")"
    sleep 0.1
done

# libnbd's nbdsh needs the system python with the nbd module.
nbdsh_() { PATH=/usr/bin:$PATH nbdsh "$@"; }

step "nbdinfo --list"
out=$(nbdinfo --list "nbd://127.0.0.1:$PORT")
echo "$out" | grep -q 'export="mem"' || fail "export not listed: $out"
echo "$out" | grep -q 'description: tarn in-memory test export' || fail "no description: $out"

step "nbdinfo --json"
nbdinfo --json "$URI" | python3 -c '
import json, sys
d = json.load(sys.stdin)
e = d["exports"][0]
assert d["protocol"] == "newstyle-fixed", d["protocol"]
assert e["export-size"] == '"$SIZE"', e["export-size"]
for k in ("can_flush", "can_fua", "can_trim", "can_zero", "can_fast_zero", "can_multi_conn", "can_cache", "can_df"):
    assert e[k] is True, k
assert e["is_read_only"] is False
assert e["block_size_minimum"] == 1 and e["block_size_preferred"] == 4096
assert e["block_size_maximum"] == 32 * 1024 * 1024
assert "base:allocation" in e["contexts"]
' || fail "nbdinfo --json"

step "nbdinfo over the Unix socket"
[[ $(nbdinfo --size "nbd+unix:///mem?socket=$SOCK") == "$SIZE" ]] || fail "unix socket size"
[[ $(stat -c %a "$SOCK") == 600 ]] || fail "socket mode $(stat -c %a "$SOCK")"

step "nbdinfo --map (empty export)"
map=$(nbdinfo --map "$URI" | awk '{print $1, $2, $3}')
[[ "$map" == "0 $SIZE 3" ]] || fail "unexpected map of empty export: $map"

step "qemu-img info"
out=$(qemu-img info "$URI")
echo "$out" | grep -q "virtual size: 64 MiB ($SIZE bytes)" || fail "qemu-img info: $out"

step "qemu-io write/read/discard/flush"
out=$(qemu-io -f raw "$URI" -c 'write -P 0xab 0 1M' -c 'read -P 0xab 0 1M' -c 'discard 0 64k' -c flush \
    -c 'read -P 0 0 64k' -c 'read -P 0xab 64k 960k' 2>&1)
echo "$out"
echo "$out" | grep -qi -e 'fail' -e 'error' -e 'mismatch' && fail "qemu-io reported an error"
[[ $(echo "$out" | grep -c '^wrote 1048576/1048576') == 1 ]] || fail "qemu-io write"
[[ $(echo "$out" | grep -c '^read ') == 3 ]] || fail "qemu-io reads"
echo "$out" | grep -q '^discard 65536/65536' || fail "qemu-io discard"

step "nbdinfo --map after discard"
map=$(nbdinfo --map "$URI" | awk '{print $1, $2, $3}' | tr '\n' ';')
[[ "$map" == "0 65536 3;65536 983040 0;1048576 $((SIZE - 1048576)) 3;" ]] || fail "unexpected map: $map"

step "nbdsh: zero, trim, block status, error replies"
nbdsh_ -c "uri = '$URI'" -c '
import errno
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(uri)
h.pwrite(b"\x5a" * 8192, 2 * 1024 * 1024)
assert h.pread(8192, 2 * 1024 * 1024) == b"\x5a" * 8192
h.zero(4096, 2 * 1024 * 1024, nbd.CMD_FLAG_NO_HOLE)
assert h.pread(4096, 2 * 1024 * 1024) == bytes(4096)
h.trim(4096, 2 * 1024 * 1024 + 4096)
assert h.pread(4096, 2 * 1024 * 1024 + 4096) == bytes(4096)
h.flush()
h.cache(65536, 0)
seen = []
def cb(meta, offset, entries, err):
    seen.append((meta, offset, list(entries)))
    return 0
h.block_status(8192, 2 * 1024 * 1024, cb)
assert seen[0][0] == "base:allocation", seen
assert seen[0][2][0:2] == [4096, 0], seen     # allocated 4 KiB
assert seen[0][2][2:4] == [4096, 3], seen     # trimmed: hole|zero
# Let bad requests reach the server and check its error replies.
h.set_strict_mode(0)
for args in ((512, 64 * 1024 * 1024 - 256), (512, 2**63)):
    try:
        h.pread(*args)
        raise SystemExit("out-of-range read succeeded")
    except nbd.Error as e:
        assert e.errnum == errno.EINVAL, e
try:
    h.pwrite(b"x" * 512, 64 * 1024 * 1024 - 256)
    raise SystemExit("out-of-range write succeeded")
except nbd.Error as e:
    assert e.errnum == errno.ENOSPC, e
assert h.pread(1, 2 * 1024 * 1024) == b"\x00"
' || fail "nbdsh checks"

step "nbdcopy into and out of a sparse file"
IN=$WORK/in.img
OUT=$WORK/out.img
truncate -s "$SIZE" "$IN"
for off in 0 3 17 40 63; do   # MiB offsets of data, the rest is holes
    head -c $((256 * 1024 + off * 4096)) /dev/urandom | dd of="$IN" bs=1M seek="$off" conv=notrunc status=none
done
nbdcopy "$IN" "$URI"
nbdcopy "$URI" "$OUT"
cmp "$IN" "$OUT" || fail "nbdcopy round trip differs"
allocated=$(nbdinfo --map "$URI" | awk '$3 == 0 {s += $2} END {print s + 0}')
(( allocated > 0 && allocated < 8 * 1024 * 1024 )) || fail "copy-in did not stay sparse: $allocated bytes allocated"
# Over the Unix socket, with multiple connections.
nbdcopy --connections=4 "nbd+unix:///mem?socket=$SOCK" "$OUT.2"
cmp "$IN" "$OUT.2" || fail "nbdcopy over unix socket differs"

step "fio randwrite QD32 with crc32c verification, 2 jobs"
# (run in $WORK: fio drops verify state files in its working directory)
(cd "$WORK" && fio --name=verify --ioengine=nbd --uri="$URI" --rw=randwrite --bs=4k --iodepth=32 \
    --verify=crc32c --size=32M --offset_increment=32M --numjobs=2 --group_reporting \
    --verify_state_save=0 --output="$WORK/fio.txt") || { cat "$WORK/fio.txt"; fail "fio"; }
grep -E 'IOPS=' "$WORK/fio.txt"
grep -qi 'verify: bad' "$WORK/fio.txt" && fail "fio verify errors"
grep -q 'err= 0' "$WORK/fio.txt" || { cat "$WORK/fio.txt"; fail "fio reported errors"; }

step "graceful shutdown on SIGTERM"
kill -TERM "$PID"
for _ in $(seq 100); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$PID" 2>/dev/null && fail "memserve did not exit within 10 s"
wait "$PID" || fail "memserve exited with status $?"
[[ -e "$SOCK" ]] && fail "socket file left behind"

echo "ALL REAL-CLIENT CHECKS PASSED"
