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
"$SYSPY" - "$POOL" "$T/src.raw" "$FLIPS" "$T/groups.txt" >"$T/flipped.txt" <<'EOF' || die "flip script failed"
import hashlib, random, sys
pool, src, n, groups_out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
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
# One flip per 64 KiB group of the pool file (a coarse checksum's group),
# each line of groups.txt: the flipped block's volume offset, then those of
# every block of its group.
by_group = {}
for pos, off in where:
    by_group.setdefault(pos // (16 * BS), []).append((pos, off))
with open(pool, "r+b") as f, open(groups_out, "w") as g:
    for group in random.sample(sorted(by_group), n):
        pos, off = random.choice(by_group[group])
        byte = pos + random.randrange(BS)
        f.seek(byte); v = f.read(1)[0]
        f.seek(byte); f.write(bytes([v ^ (1 << random.randrange(8))]))
        print(off)
        print(off, *sorted(o for _, o in by_group[group]), file=g)
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
# nbdcopy wrote d in long runs: most 64 KiB groups have one coarse checksum,
# so a flip fails exactly its block (a group with block sums) or exactly
# the 16 blocks of its group, never anything else.
rc=0; "$SYSPY" - "$T/eio.txt" "$T/groups.txt" >"$T/eio_kinds.txt" <<'EOF' || rc=$?
import sys
eio = {int(l) for l in open(sys.argv[1])}
seen, whole, single = set(), 0, 0
for line in open(sys.argv[2]):
    off, *group = map(int, line.split())
    failed = eio & set(group)
    if failed == set(group) and len(group) == 16:
        whole += 1
    elif failed == {off}:
        single += 1
    else:
        sys.exit(f"flip at {off}: EIO on {sorted(failed)}, not the block nor its whole group")
    seen |= failed
assert eio == seen, f"EIO outside the damaged groups: {sorted(eio - seen)[:5]}"
print(whole, single)
EOF
expect_eq "EIO exactly on each damaged block or its whole 64 KiB group" "$rc" 0
read -r whole single <"$T/eio_kinds.txt" || true
expect_between "damaged groups failed whole (coarse checksums written)" "${whole:-0}" 1 "$FLIPS"
say "  (${whole:-0} flips failed their whole coarse group, ${single:-0} only their block)"
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
if diff -q "$T/lost.txt" "$T/eio.txt" >/dev/null; then ok "scrub lost ranges == blocks that read as EIO"
else bad "scrub lost ranges differ: $(diff "$T/lost.txt" "$T/eio.txt" | head -5 | tr '\n' ' ')"; fi
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

step "coarse groups overwritten in part and whole, trimmed in part: data right, pool check clean"
CP=$T/c.img
make_pool "$CP" 128M
make_vol "$CP" e 16M
head -c $((8 * M)) /dev/urandom >"$T/e.raw"
start_serve "$CP"
check "nbdcopy 8 MiB into e (long runs: coarse groups)" nbdcopy "$T/e.raw" "$(uri e)"
rc=0; "$SYSPY" - "$(uri e)" "$T/e.raw" >"$T/e.out" 2>&1 <<'EOF' || rc=$?
import os, sys, nbd
uri, src = sys.argv[1], sys.argv[2]
h = nbd.NBD(); h.connect_uri(uri)
model = bytearray(open(src, "rb").read()) + bytearray(8 << 20)
G, K = 65536, 4096
def write(off, n):
    data = os.urandom(n); h.pwrite(data, off); model[off:off + n] = data
def trim(off, n):
    h.trim(n, off); model[off:off + n] = bytes(n)
write(3 * G + 5 * K, K)            # one block of a group, in place
write(10 * G, G)                   # a whole group, in place
write(20 * G + 2 * K, 3 * K)       # three blocks inside a group
trim(30 * G + 4 * K, 2 * K)        # part of a group freed
trim(40 * G + K, G + 3 * K)        # a whole group and parts of two
write(64 * G + K, 1 << 20)         # 1 MiB across 17 groups, unaligned
h.flush()
got = h.pread(len(model) - (8 << 20), 0)
assert got == bytes(model[:len(got)]), "e differs from the model after the overwrites"
print("ok")
EOF
expect_eq "overwrites and trims of coarse groups read back right" "$rc" 0
[ $rc -eq 0 ] || cat "$T/e.out"
splits=$(tarn pool status -p "$CP" --json | "$SYSPY" -c 'import json,sys;print(json.load(sys.stdin).get("split_groups", 0))')
expect_between "coarse groups split by the partial overwrites and trims" "$splits" 4 100
stop_serve
check "pool check clean after partial overwrites and trims of coarse groups" tarn pool check -p "$CP"
start_serve "$CP"
rc=0; tarn pool scrub -p "$CP" >"$T/c.scrub" 2>&1 || rc=$?
expect_eq "scrub after reopen finds nothing lost" "$rc" 0
stop_serve

step "a device of another pool is refused and left as it was"
make_pool "$T/a.img" 64M
check "pool b with two devices" tarn pool create "$T/b.img" --size 64M --device "$T/b2.img"
before=$(sha256sum <"$T/a.img")
check_fails "pool b opened with pool a's device as its member" tarn pool status -p "$T/b.img" --device "$T/a.img"
printf '%s' "$LAST_OUT" | grep -qi "another pool\|does not belong" && ok "error says it belongs to another pool" || bad "message: $LAST_OUT"
expect_eq "pool a's device unchanged" "$(sha256sum <"$T/a.img")" "$before"

e2e_finish
