#!/usr/bin/env bash
# Fault injection between runs, with real clients: random bit flips in the
# data of a pool file must each be detected (EIO to the NBD client for
# exactly the damaged 4K blocks, never other bytes; counted; logged), listed
# by scrub as exact volume ranges; a damaged superblock copy is survived,
# reported and rewritten by `pool repair`; a device of another pool is
# refused without being written.
. "$(dirname "$0")/lib.sh"
need qemu-img nbdcopy nbdinfo sha256sum
need_pynbd
e2e_init faults

M=$((1 << 20))
POOL=$T/pool.img
FLIPS=${FAULT_FLIPS:-12}

step "a pool with 16 MiB of random data"
make_pool "$POOL" 256M
make_vol "$POOL" d 64M
head -c $((16 * M)) /dev/urandom >"$T/src.raw"
start_serve "$POOL"
check "nbdcopy 16 MiB of random data into d" nbdcopy "$T/src.raw" "$(uri d)"
check "qemu-img compare: d starts with the data" qemu-img compare -f raw -F raw "$T/src.raw" \
  "json:{\"file.driver\":\"nbd\",\"file.host\":\"127.0.0.1\",\"file.port\":\"$SERVE_PORT\",\"file.export\":\"d\"}" --force-share
stop_serve

step "flip one random bit in each of $FLIPS random data blocks of the pool file"
"$SYSPY" - "$POOL" "$T/src.raw" "$FLIPS" >"$T/flipped.txt" <<'EOF' || die "flip script failed"
import hashlib, random, sys
pool, src, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
BS = 4096
blocks = {}
with open(src, "rb") as f:
    i = 0
    while (b := f.read(BS)):
        blocks[hashlib.sha1(b).digest()] = i * BS
        i += 1
where = []  # (pool byte offset, volume byte offset)
with open(pool, "rb") as f:
    at = 0
    while (b := f.read(1 << 20)):
        for k in range(0, len(b), BS):
            h = hashlib.sha1(b[k:k + BS]).digest()
            if h in blocks:
                where.append((at + k, blocks[h]))
        at += len(b)
assert len(where) == len(blocks), f"found {len(where)} of {len(blocks)} data blocks"
with open(pool, "r+b") as f:
    for pos, off in random.sample(where, n):
        byte = pos + random.randrange(BS)
        f.seek(byte); v = f.read(1)[0]
        f.seek(byte); f.write(bytes([v ^ (1 << random.randrange(8))]))
        print(off)
EOF
sort -n "$T/flipped.txt" >"$T/flipped.sorted"
expect_eq "blocks damaged" "$(wc -l <"$T/flipped.sorted")" "$FLIPS"

step "every damaged block reads as EIO, every other block reads its data"
start_serve "$POOL"
rc=0
"$SYSPY" - "$(uri d)" "$T/src.raw" >"$T/eio.txt" 2>"$T/eio.err" <<'EOF' || rc=$?
import errno, sys, nbd
uri, src = sys.argv[1], sys.argv[2]
h = nbd.NBD(); h.connect_uri(uri)
data = open(src, "rb").read()
for off in range(0, len(data), 4096):
    try:
        got = h.pread(4096, off)
    except nbd.Error as e:
        assert e.errno in (errno.EIO, "EIO"), f"offset {off}: {e}"  # the binding gives the name
        print(off)
        continue
    assert got == data[off:off + 4096], f"offset {off}: wrong bytes returned"
EOF

expect_eq "libnbd read of all 4096 blocks: no wrong bytes, only EIO" "$rc" 0
[ $rc -eq 0 ] || cat "$T/eio.err"
if diff -q "$T/eio.txt" "$T/flipped.sorted" >/dev/null; then ok "EIO exactly on the $FLIPS damaged blocks"
else bad "EIO offsets differ from the damaged blocks: $(diff "$T/eio.txt" "$T/flipped.sorted" | head -5 | tr '\n' ' ')"; fi
check_fails "qemu-img convert of d fails rather than copying bad data" timeout 60 qemu-img convert -f raw -O raw "$(uri d)" "$T/copy.raw"
check "server still answers" timeout 10 nbdinfo --size "$(uri d)"
errs=$(tarn pool status -p "$POOL" --json | "$SYSPY" -c 'import json,sys;print(json.load(sys.stdin)["checksum_errors"])')
expect_between "pool status counts the checksum errors" "$errs" "$FLIPS" 100000
logged=$(grep -c "checksum mismatch" "$SERVE_LOG" || true)
expect_between "server log has a line per mismatch" "$logged" "$FLIPS" 100000

step "scrub (online, through the server) lists exactly the damaged ranges"
rc=0; tarn pool scrub -p "$POOL" --json >"$T/scrub.json" 2>"$T/scrub.err" || rc=$?
expect_eq "scrub exits 1 (data lost)" "$rc" 1
"$SYSPY" -c 'import json,sys
j = json.load(open(sys.argv[1]))
for l in j["lost"]:
    for o in range(l["offset"], l["offset"] + l["length"], 4096):
        assert l["volume"] == "d" and l["snapshot"] is None, l
        print(o)' "$T/scrub.json" | sort -n >"$T/lost.txt"
if diff -q "$T/lost.txt" "$T/flipped.sorted" >/dev/null; then ok "scrub lost ranges == damaged blocks"
else bad "scrub lost ranges differ: $(diff "$T/lost.txt" "$T/flipped.sorted" | head -5 | tr '\n' ' ')"; fi
text=$(tarn pool scrub -p "$POOL" 2>&1 || true)
printf '%s' "$text" | grep -q "lost: d bytes" && ok "scrub text names the lost ranges" || bad "scrub text: $text"
stop_serve
check "pool check clean (metadata is intact)" tarn pool check -p "$POOL"

step "a damaged superblock copy: reported, survived, rewritten by pool repair"
"$SYSPY" -c 'import sys
f = open(sys.argv[1], "r+b"); f.seek(16 * 4096 + 40); b = f.read(1)[0]; f.seek(16 * 4096 + 40); f.write(bytes([b ^ 0x10]))' "$POOL"
out=$(tarn pool status -p "$POOL" 2>&1)
printf '%s' "$out" | grep -q "superblock copy 1" && ok "pool status notes the bad superblock copy" || bad "no note: $out"
rc=0; tarn pool repair -p "$POOL" >"$T/repair.txt" 2>&1 || rc=$?
expect_eq "pool repair exits 1 (the data blocks stay lost)" "$rc" 1
grep -q "superblock copy 1 .* rewritten" "$T/repair.txt" && ok "repair rewrote the copy" || bad "repair: $(head -3 "$T/repair.txt")"
out=$(tarn pool status -p "$POOL" 2>&1)
printf '%s' "$out" | grep -q "superblock copy" && bad "note still there after repair: $out" || ok "no note after repair"
check "pool check clean after repair" tarn pool check -p "$POOL"

step "a device of another pool is refused and left as it was"
make_pool "$T/a.img" 64M
check "pool b with two devices" tarn pool create "$T/b.img" --size 64M --device "$T/b2.img"
before=$(sha256sum <"$T/a.img")
check_fails "pool b opened with pool a's device as its member" tarn pool status -p "$T/b.img" --device "$T/a.img"
printf '%s' "$LAST_OUT" | grep -qi "another pool\|does not belong" && ok "error says it belongs to another pool" || bad "message: $LAST_OUT"
expect_eq "pool a's device unchanged" "$(sha256sum <"$T/a.img")" "$before"

e2e_finish
