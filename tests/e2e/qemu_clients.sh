#!/usr/bin/env bash
# Standard NBD clients against `tarn serve`: qemu-img (info/convert/compare),
# qemu-io patterns (unaligned writes, discard, write-zeroes, flush, aio),
# nbdinfo --map (block status), nbdcopy of a sparse image (thin allocation).
. "$(dirname "$0")/lib.sh"
need qemu-img qemu-io nbdinfo nbdcopy jq cmp
need_pynbd
e2e_init qemu_clients

M=$((1 << 20))
POOL=$T/pool.img
make_pool "$POOL" 4G
make_vol "$POOL" qc 256M
make_vol "$POOL" qio 64M
make_vol "$POOL" sp 256M
make_vol "$POOL" frag 64M
make_vol "$POOL" scat 16M
make_vol "$POOL" zh 64M
start_serve "$POOL"

step "export discovery"
list=$(timeout 20 nbdinfo --list --json "nbd://127.0.0.1:$SERVE_PORT" 2>&1) || list=
names=$(printf '%s' "$list" | jq -r '.exports[]."export-name"' 2>/dev/null | sort | tr '\n' ' ')
expect_eq "nbdinfo --list shows every volume" "$names" "frag qc qio scat sp zh "
size=$(timeout 20 nbdinfo --size "$(uri qc)" 2>&1) || size="error: $size"
expect_eq "nbdinfo --size qc" "$size" $((256 * M))
size=$(timeout 20 nbdinfo --size "$(uri_unix qio)" 2>&1) || size="error: $size"
expect_eq "nbdinfo --size over unix socket" "$size" $((64 * M))
check_fails "unknown export name is refused" timeout 20 nbdinfo --size "$(uri nosuchvolume)"
info=$(timeout 20 qemu-img info --output=json "$(uri qc)" 2>&1) || info='{}'
expect_eq "qemu-img info virtual-size" "$(printf '%s' "$info" | jq -r '."virtual-size"' 2>/dev/null)" $((256 * M))

step "qemu-img convert / compare (64M random image)"
head -c $((64 * M)) /dev/urandom >"$T/src.img"
check "qemu-img convert -n src.img -> nbd (tcp)" timeout 120 qemu-img convert -p -n -f raw -O raw "$T/src.img" "$(uri qc)"
check "qemu-img compare src.img nbd" timeout 120 qemu-img compare -f raw -F raw "$T/src.img" "$(uri qc)"
check "qemu-img compare nbd src.img (reverse, unix socket)" timeout 120 qemu-img compare -f raw -F raw "$(uri_unix qc)" "$T/src.img"
check "qemu-img convert nbd -> out.img" timeout 120 qemu-img convert -f raw -O raw "$(uri qc)" "$T/out.img"
check "out.img first 64M == src.img" cmp -n $((64 * M)) "$T/src.img" "$T/out.img"
check "out.img tail (192M) is zero" cmp -n $((192 * M)) -i $((64 * M)):0 "$T/out.img" /dev/zero
check "qemu-img compare out.img src.img" qemu-img compare -f raw -F raw "$T/out.img" "$T/src.img"
# modify one byte in the middle through qemu-io: compare must now see a difference
check "qemu-io write 1 byte at 33M+7" timeout 60 qemu-io -f raw -c "write -P 0x5a $((33 * M + 7)) 1" "$(uri qc)"
rc=0; timeout 120 qemu-img compare -q -f raw -F raw "$T/src.img" "$(uri qc)" || rc=$?
expect_eq "qemu-img compare detects a 1-byte change (exit 1)" "$rc" 1
rm -f "$T/out.img"

step "qemu-io patterns on a fresh 64M volume"
QIO=$(uri qio)
qio() { timeout 120 qemu-io -f raw "$QIO" "$@"; }
check "writes: aligned, 512-byte, odd unaligned, large" qio \
  -c "write -P 0x11 0 64k" \
  -c "write -P 0x22 $((1 * M)) 4k" \
  -c "write -P 0x33 $((2 * M + 512)) 512" \
  -c "write -P 0x44 $((3 * M + 1000)) 3000" \
  -c "write -P 0x55 $((8 * M)) 4M" \
  -c "write -P 0x66 $((16 * M)) 1M" \
  -c "write -P 0x77 $((20 * M)) 1M" \
  -c "write -P 0x78 $((24 * M)) 1M" \
  -c "write -P 0x79 $((28 * M)) 2M" \
  -c "write -f -P 0x7a $((40 * M)) 64k" \
  -c "flush"
check "overwrite inside a block (8M+100, 50 bytes)" qio -c "write -P 0x99 $((8 * M + 100)) 50" -c flush
check "discard 16M+1M, write -z 20M+1M, write -z -u 24M+1M, partial discard 28M+64k+128k" qio \
  -c "discard $((16 * M)) 1M" \
  -c "write -z $((20 * M)) 1M" \
  -c "write -z -u $((24 * M)) 1M" \
  -c "discard $((28 * M + 65536)) 128k" \
  -c "flush"
check "aio writes (8 in flight) + aio_flush" qio \
  -c "aio_write -P 0x81 $((44 * M)) 64k" -c "aio_write -P 0x82 $((44 * M + 65536)) 64k" \
  -c "aio_write -P 0x83 $((44 * M + 131072)) 4k" -c "aio_write -P 0x84 $((44 * M + 135168)) 4k" \
  -c "aio_write -P 0x85 $((45 * M)) 512" -c "aio_write -P 0x86 $((45 * M + 4096)) 1M" \
  -c "aio_write -P 0x87 $((47 * M)) 128k" -c "aio_write -P 0x88 $((48 * M - 4096)) 4k" \
  -c "aio_flush" -c "flush"
# verification on a new connection, over the unix socket this time
QIO=$(uri_unix qio)
check "read back aligned + 4k" qio -c "read -P 0x11 0 64k" -c "read -P 0 65536 $((M - 65536))" \
  -c "read -P 0x22 $((1 * M)) 4k" -c "read -P 0 $((1 * M + 4096)) $((M - 4096))"
check "read back 512-byte write and its zero neighbours" qio -c "read -P 0 $((2 * M)) 512" \
  -c "read -P 0x33 $((2 * M + 512)) 512" -c "read -P 0 $((2 * M + 1024)) $((M - 1024))"
check "read back odd unaligned write (3M+1000, 3000) and neighbours" qio \
  -c "read -P 0 $((3 * M)) 1000" -c "read -P 0x44 $((3 * M + 1000)) 3000" -c "read -P 0 $((3 * M + 4000)) 96"
check "read back 4M write with inner 50-byte overwrite" qio -c "read -P 0x55 $((8 * M)) 100" \
  -c "read -P 0x99 $((8 * M + 100)) 50" -c "read -P 0x55 $((8 * M + 150)) $((4 * M - 150))"
check "discarded 16M+1M reads zeros" qio -c "read -P 0 $((16 * M)) 1M"
check "write -z 20M+1M reads zeros" qio -c "read -P 0 $((20 * M)) 1M"
check "write -z -u 24M+1M reads zeros" qio -c "read -P 0 $((24 * M)) 1M"
check "data around the partial discard is intact" qio -c "read -P 0x79 $((28 * M)) 64k" \
  -c "read -P 0x79 $((28 * M + 196608)) $((2 * M - 196608))"
check "FUA write reads back" qio -c "read -P 0x7a $((40 * M)) 64k"
check "aio writes read back" qio -c "read -P 0x81 $((44 * M)) 64k" -c "read -P 0x82 $((44 * M + 65536)) 64k" \
  -c "read -P 0x83 $((44 * M + 131072)) 4k" -c "read -P 0x84 $((44 * M + 135168)) 4k" \
  -c "read -P 0x85 $((45 * M)) 512" -c "read -P 0x86 $((45 * M + 4096)) 1M" \
  -c "read -P 0x87 $((47 * M)) 128k" -c "read -P 0x88 $((48 * M - 4096)) 4k"
check "never-written tail reads zeros" qio -c "read -P 0 $((50 * M)) 14M"
check "unaligned read spanning data and zeros" qio -c "read -P 0x22 $((1 * M + 4000)) 96" -c "read -P 0 $((1 * M + 4096)) 100"

step "nbdinfo --map (block status) of qio"
if timeout 30 nbdinfo --map --json "$(uri qio)" >"$T/map.json" 2>"$T/map.err"; then
  nbdinfo --map "$(uri qio)" 2>/dev/null | sed 's/^/    /' | head -40
  check "map: written ranges are data" "$SYSPY" "$E2E_DIR/mapcheck.py" "$T/map.json" \
    data:0:65536 data:$((1 * M)):4096 data:$((8 * M)):$((4 * M)) data:$((28 * M)):65536 \
    data:$((40 * M)):65536 data:$((44 * M)):139264 data:$((45 * M + 4096)):$M
  # (write -z without -u sends NO_HOLE: allocated zeroes, reported as such)
  check "map: write -z (NO_HOLE) range is allocated and zero" "$SYSPY" "$E2E_DIR/mapcheck.py" "$T/map.json" \
    zeroalloc:$((20 * M)):$M
  check "map: discarded / zero-with-unmap ranges read as zero" "$SYSPY" "$E2E_DIR/mapcheck.py" "$T/map.json" \
    zero:$((16 * M)):$M zero:$((24 * M)):$M
  check "map: discarded range is a hole" "$SYSPY" "$E2E_DIR/mapcheck.py" "$T/map.json" hole:$((16 * M)):$M
  check "map: never-written ranges are holes" "$SYSPY" "$E2E_DIR/mapcheck.py" "$T/map.json" \
    hole:$((4 * M)):$((4 * M)) hole:$((12 * M)):$((4 * M)) hole:$((32 * M)):$((8 * M)) hole:$((50 * M)):$((14 * M))
else
  bad "nbdinfo --map failed: $(head -c 300 "$T/map.err")"
fi

step "block status after NO_HOLE zeroing (nbdsh)"
# base:allocation per proto.md: a range zeroed with NO_HOLE stays allocated
# and reads as zeros (STATE_ZERO without STATE_HOLE); one zeroed without it
# may be a hole (tarn punches it: HOLE|ZERO); data stays 0. 40 MiB zeroed
# with NO_HOLE takes several answers (each reads at most 8 MiB to be sure
# of the zeros): asked again from where each stopped, all of it is ZERO.
cat >"$T/zerostatus.py" <<'PY'
import nbd, sys
M = 1 << 20
h = nbd.NBD()
h.add_meta_context("base:allocation")
h.connect_uri(sys.argv[1])
h.pwrite(b"\xab" * (2 * M), 0)
h.zero(M, M, flags=nbd.CMD_FLAG_NO_HOLE)      # 1M..2M over data
h.zero(M, 3 * M)                               # 3M..4M, may be a hole
h.pwrite(b"\0" * 4096 + b"\1" * 4096, 5 * M)   # zeros sent as data, then data
h.zero(40 * M, 8 * M, flags=nbd.CMD_FLAG_NO_HOLE)
h.flush()
ext, pos, answers = [], 0, 0
while pos < 64 * M and answers < 100:
    got = []
    h.block_status(64 * M - pos, pos, lambda meta, off, e, err: got.extend(zip(e[0::2], e[1::2])))
    answers += 1
    for length, flags in got:
        ext.append((pos, length, flags))
        pos += length
def flags_of(off, length):
    return {f for o, l, f in ext if o < off + length and off < o + l}
want = [("data 0..1M", 0, M, {0}), ("NO_HOLE over data 1M..2M", M, M, {2}),
        ("zeroed without NO_HOLE 3M..4M", 3 * M, M, {3}), ("zeros written as data 5M+4K", 5 * M, 4096, {2}),
        ("data 5M+4K..8K", 5 * M + 4096, 4096, {0}), ("NO_HOLE 8M..48M", 8 * M, 40 * M, {2}),
        ("never written 48M..", 48 * M, 16 * M, {3})]
bad = 0
for what, off, length, expect in want:
    got = flags_of(off, length)
    print(("ok  " if got == expect else "BAD ") + f"{what}: flags {sorted(got)} (want {sorted(expect)})")
    bad += got != expect
print(f"{answers} answers covered {pos} bytes")
sys.exit(1 if bad or pos != 64 * M else 0)
PY
if out=$(timeout 60 "$SYSPY" "$T/zerostatus.py" "$(uri zh)" 2>&1); then
  ok "NO_HOLE zeroing reported allocated and zero ($(printf '%s' "$out" | tail -1))"
else bad "block status after NO_HOLE zeroing: $(printf '%s' "$out" | grep -v '^ok' | tr '\n' ' ' | cut -c1-400)"; fi

step "nbdcopy of a sparse 256M image (17M of data) in and out"
truncate -s $((256 * M)) "$T/sparse.img"

for off in 0 37 100 200 255; do
  dd if=/dev/urandom of="$T/sparse.img" bs=1M seek=$off count=$([ $off = 255 ] && echo 1 || echo 4) conv=notrunc status=none
done
DATA=$((17 * M))
say "  sparse.img: $(du -B1 --apparent-size "$T/sparse.img" | cut -f1) bytes apparent, $(du -B1 "$T/sparse.img" | cut -f1) allocated"
check "nbdcopy sparse.img -> nbd (flush)" timeout 120 nbdcopy --flush "$T/sparse.img" "$(uri sp)"
check "nbdcopy nbd -> back.img" timeout 120 nbdcopy "$(uri_unix sp)" "$T/back.img"
check "back.img == sparse.img" cmp "$T/sparse.img" "$T/back.img"
check "qemu-img compare sparse.img nbd" timeout 120 qemu-img compare -f raw -F raw "$T/sparse.img" "$(uri sp)"
vol_get "$POOL" sp allocated; ALLOC=$VAL
say "  volume sp: data written $(mib $DATA), tarn allocated $(mib "$ALLOC") of 256 MiB"
expect_between "sp allocated bytes ~= data written (not the full 256M)" "$ALLOC" $DATA $((DATA + DATA / 10 + 2 * M))
if timeout 30 nbdinfo --map --json "$(uri sp)" >"$T/spmap.json" 2>/dev/null; then
  check "sp map: data where written, holes elsewhere" "$SYSPY" "$E2E_DIR/mapcheck.py" "$T/spmap.json" \
    data:0:$((4 * M)) hole:$((4 * M)):$((33 * M)) data:$((37 * M)):$((4 * M)) hole:$((41 * M)):$((59 * M)) \
    data:$((200 * M)):$((4 * M)) hole:$((204 * M)):$((51 * M)) data:$((255 * M)):$M
fi
vol_get "$POOL" qc allocated
expect_between "qc allocated after 64M convert + 1 byte" "$VAL" $((64 * M)) $((64 * M + 64 * M / 10 + 2 * M))
vol_get "$POOL" qc size
expect_eq "vol list size of qc" "$VAL" $((256 * M))

step "fragmented volume: 1024 separate 4k extents (block status across many extents)"
# every 64k a 4k write with its own pattern byte; clients that trust block
# status (nbdcopy, qemu-img convert) must still copy every extent
args=()
for i in $(seq 0 1023); do args+=(-c "write -q -P $((i % 251 + 1)) $((i * 65536)) 4k"); done
check "1024 scattered 4k writes into frag" timeout 300 qemu-io -f raw "$(uri frag)" "${args[@]}" -c flush
"$SYSPY" - "$T/frag-exp.img" <<'PY'
import sys
with open(sys.argv[1], "wb") as f:
    f.truncate(64 << 20)
    for i in range(1024):
        f.seek(i * 65536)
        f.write(bytes([i % 251 + 1]) * 4096)
PY
if timeout 60 nbdinfo --map --json "$(uri frag)" >"$T/frag.map.json" 2>/dev/null; then
  n=$(jq '[.[] | select(.type % 2 == 0)] | length' "$T/frag.map.json")
  last=$(jq -c '.[-1]' "$T/frag.map.json")
  expect_eq "nbdinfo --map reports 1024 data extents (last extent: $last)" "$n" 1024
else
  bad "nbdinfo --map on frag failed"
fi
check "nbdcopy --no-extents frag == expected" bash -c "nbdcopy --no-extents '$(uri frag)' '$T/frag-full.img' && cmp '$T/frag-exp.img' '$T/frag-full.img'"
check "nbdcopy (guided by block status) frag == expected" bash -c "nbdcopy '$(uri frag)' '$T/frag-bs.img' && cmp '$T/frag-exp.img' '$T/frag-bs.img'"
check "qemu-img convert (uses block status) frag == expected" bash -c "qemu-img convert -f raw -O raw '$(uri frag)' '$T/frag-q.img' && cmp '$T/frag-exp.img' '$T/frag-q.img'"
check "qemu-img compare frag-exp.img nbd" timeout 120 qemu-img compare -f raw -F raw "$T/frag-exp.img" "$(uri frag)"
rm -f "$T"/frag-*.img

step "pool compact while served: a volume written in scattered order"
args=()
for i in $(seq 0 4095); do b=$((i * 97 % 4096)); args+=(-c "write -q -P $((b % 251 + 1)) $((b * 4096)) 4k"); done
check "4096 4k writes into scat in scattered order" timeout 300 qemu-io -f raw "$(uri scat)" "${args[@]}" -c flush
"$SYSPY" - "$T/scat-exp.img" <<'PY'
import sys
with open(sys.argv[1], "wb") as f:
    for b in range(4096):
        f.write(bytes([b % 251 + 1]) * 4096)
PY
# Throttled to 1 MiB/s and interrupted after 2.5 s: the server stops the
# compaction when its client goes away; what moved stays moved.
rc=0
timeout -s INT 2.5 "$TARN" pool compact -p "$POOL" --volume scat --rate 1M >/dev/null 2>&1 || rc=$?
expect_eq "interrupted compact exits by the signal" "$rc" 124
wait_until 15 grep -q "compaction stopped at volume scat" "$T/serve.log" \
  && ok "the server stopped the compaction when its client went away" \
  || bad "no 'compaction stopped' in serve.log"
if out=$(tarn pool compact -p "$POOL" --volume scat --json 2>"$T/compact.err"); then
  before=$(printf '%s' "$out" | jq '.volumes[0].extents_before')
  after=$(printf '%s' "$out" | jq '.volumes[0].extents_after')
  moved=$(printf '%s' "$out" | jq '.volumes[0].windows_moved')
  # 1 MiB/s for 2.5 s, and a window or two before the server notices: the
  # first run moved 1-6 of the 16 windows (unthrottled, all 16 in < 1 s).
  expect_between "the second compact moved the windows the first did not" "$moved" 10 15
  if [ "$after" -le 16 ] && [ "$before" -ge 100 ]; then ok "compact: $before -> $after extents"; else bad "compact: $before -> $after extents"; fi
else
  bad "tarn pool compact failed: $(tail -2 "$T/compact.err")"
fi
check "qemu-img compare scat-exp.img nbd after compact" timeout 120 qemu-img compare -f raw -F raw "$T/scat-exp.img" "$(uri scat)"

step "clean shutdown, restart, data still there"
stop_serve
pool_check "$POOL" "after clean shutdown"
start_serve "$POOL"
check "nbdcopy after restart == sparse.img" timeout 120 nbdcopy "$(uri sp)" "$T/back2.img"
check "back2.img == sparse.img" cmp "$T/sparse.img" "$T/back2.img"
check "compacted scat survives restart" timeout 120 qemu-img compare -f raw -F raw "$T/scat-exp.img" "$(uri scat)"
check "qio patterns survive restart" timeout 120 qemu-io -f raw "$(uri qio)" -c "read -P 0x11 0 64k" \
  -c "read -P 0x44 $((3 * M + 1000)) 3000" -c "read -P 0x99 $((8 * M + 100)) 50" -c "read -P 0 $((16 * M)) 1M" \
  -c "read -P 0x88 $((48 * M - 4096)) 4k"
stop_serve
e2e_finish
