#!/usr/bin/env bash
# Exercise the `memserve` example with real NBD clients (libnbd's nbdinfo,
# nbdsh and nbdcopy, qemu-img, qemu-io, fio's nbd engine), including the
# changed-block tracking context `qemu:dirty-bitmap:cbt` (memserve
# --dirty-bitmap, 64 KiB granularity) as backup tools read it.
# qemu 10 negotiates extended headers (NBD_OPT_EXTENDED_HEADERS), libnbd
# 1.14 structured replies. Exits non-zero on the first failure or mismatch.
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
MiB=$((1024 * 1024))
BITMAP=qemu:dirty-bitmap:cbt

"$MEMSERVE" --size 64M --listen "127.0.0.1:$PORT" --socket "$SOCK" --dirty-bitmap cbt -v >"$WORK/memserve.log" 2>&1 &
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

# The dirty-bitmap map as "offset length flags;..." (nbdinfo --map=CONTEXT).
dirty_map() { nbdinfo --map="$BITMAP" "$URI" | awk '{print $1, $2, $3}' | tr '\n' ';'; }

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
assert e["contexts"] == ["base:allocation", "'"$BITMAP"'"], e["contexts"]
' || fail "nbdinfo --json"

step "nbdinfo --list --content shows the dirty-bitmap context"
out=$(nbdinfo --list --content "nbd://127.0.0.1:$PORT")
echo "$out" | grep -qx $'\t\t'"$BITMAP" || fail "context not listed: $out"

step "nbdsh: NBD_OPT_LIST_META_CONTEXT queries"
nbdsh_ -c "uri = '$URI'" -c '
h.set_opt_mode(True)
h.connect_uri(uri)
def listed(*queries):
    h.clear_meta_contexts()
    for q in queries:
        h.add_meta_context(q)
    out = []
    n = h.opt_list_meta_context(lambda name: out.append(name))
    assert n == len(out), (n, out)
    return out
bitmap = "'"$BITMAP"'"
assert listed() == ["base:allocation", bitmap], listed()
assert listed("qemu:") == [bitmap], listed("qemu:")
assert listed("qemu:dirty-bitmap:") == [bitmap]
assert listed("base:") == ["base:allocation"]
assert listed(bitmap) == [bitmap]
assert listed("qemu:dirty-bitmap:nope", "x-foo:bar", "qemu:allocation-depth") == []
h.opt_abort()
' || fail "nbdsh meta context listing"

step "nbdinfo --map=$BITMAP (nothing written yet)"
[[ $(dirty_map) == "0 $SIZE 0;" ]] || fail "unexpected dirty map of a fresh export: $(dirty_map)"

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

step "nbdinfo --map=$BITMAP after qemu-io (written and discarded: dirty)"
map=$(dirty_map)
[[ "$map" == "0 $MiB 1;$MiB $((SIZE - MiB)) 0;" ]] || fail "unexpected dirty map: $map"

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

step "nbdinfo --map=$BITMAP after nbdsh (64 KiB granularity)"
map=$(dirty_map)
want="0 $MiB 1;$MiB $MiB 0;$((2 * MiB)) 65536 1;$((2 * MiB + 65536)) $((SIZE - 2 * MiB - 65536)) 0;"
[[ "$map" == "$want" ]] || fail "unexpected dirty map: $map (want $want)"

step "nbdsh: base:allocation and $BITMAP in one block status"
nbdsh_ -c "uri = '$URI'" -c '
bitmap = "'"$BITMAP"'"
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.add_meta_context(bitmap)
h.add_meta_context("qemu:dirty-bitmap:nope")
h.connect_uri(uri)
assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION) and h.can_meta_context(bitmap)
assert not h.can_meta_context("qemu:dirty-bitmap:nope")
MiB = 1024 * 1024
def status(offset, length, flags=0):
    seen = {}
    def cb(meta, off, entries, err):
        assert off == offset and meta not in seen, (meta, off)
        seen[meta] = list(entries)
        return 0
    h.block_status(length, offset, cb, flags)
    return seen
s = status(MiB - 4096, 2 * MiB)
assert set(s) == {"base:allocation", bitmap}, s
assert s[bitmap] == [4096, 1, MiB, 0, 65536, 1, MiB - 69632, 0], s[bitmap]
assert sum(s["base:allocation"][0::2]) == 2 * MiB, s
s = status(2 * MiB + 100, 1000, nbd.CMD_FLAG_REQ_ONE)
assert s == {"base:allocation": [1000, 0], bitmap: [1000, 1]}, s
# Writes show up at once, rounded out to 64 KiB.
h.pwrite(b"\x11" * 512, 40 * MiB + 70000)
assert status(40 * MiB, MiB)[bitmap] == [65536, 0, 65536, 1, MiB - 131072, 0]
' || fail "nbdsh dirty bitmap block status"
DIRTY="0:$MiB $((2 * MiB)):65536 $((40 * MiB + 65536)):65536"

step "qemu-img map with x-dirty-bitmap=$BITMAP"
# In x-dirty-bitmap mode qemu reads the bitmap flags as base:allocation
# ones: dirty (bit 0) looks like a hole, so dirty ranges are
# "data": false, "present": false and clean ones "data": true.
qemu-img map --output=json --image-opts \
    "driver=nbd,server.type=inet,server.host=127.0.0.1,server.port=$PORT,export=mem,x-dirty-bitmap=$BITMAP" |
    python3 -c '
import json, sys
m = json.load(sys.stdin)
dirty = [tuple(map(int, r.split(":"))) for r in sys.argv[1].split()]
assert m[0]["start"] == 0 and sum(e["length"] for e in m) == '"$SIZE"', m
for a, b in zip(m, m[1:]):
    assert a["start"] + a["length"] == b["start"], (a, b)
got = [(e["start"], e["length"]) for e in m if not e["data"]]
assert got == dirty, (got, dirty)
for e in m:
    assert e["zero"] is False and e["present"] == e["data"], e
' "$DIRTY" || fail "qemu-img map x-dirty-bitmap"

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

step "qemu (extended headers) reads data and holes of the sparse copy"
# qemu 10 negotiates NBD_OPT_EXTENDED_HEADERS; the range read starts in
# data and ends in a hole, so the reply has OFFSET_DATA and OFFSET_HOLE
# chunks. Its hex dump must match the file.
OFF=$((3 * MiB + 256 * 1024)); LEN=$((64 * 1024))
qemu-io -f raw "$URI" -c "read -v $OFF $LEN" | python3 -c '
import sys
off, length, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
got = bytearray()
for line in sys.stdin:
    if ":  " in line and not line.startswith("read"):
        got += bytes(int(x, 16) for x in line.split(":  ")[1][:47].split())
want = open(path, "rb").read()[off:off + length]
assert len(got) == length, len(got)
assert got == want, "qemu-io read differs from the file"
assert any(want) and want[-4096:] == bytes(4096), "the range should hold data and a hole"
' "$OFF" "$LEN" "$IN" || fail "qemu-io sparse read"
grep -q 'extended headers true' "$WORK/memserve.log" || fail "qemu did not negotiate extended headers"
qemu-img convert -f raw -O raw "$URI" "$WORK/q.img"
cmp "$IN" "$WORK/q.img" || fail "qemu-img convert differs"

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
