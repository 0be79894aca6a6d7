#!/usr/bin/env bash
# Per-file readahead (issue 15 item 6b; docs/ARCHITECTURE.md *File
# readahead*): a file written at random through the mount (4 KiB O_DIRECT
# writes in shuffled order, so its blocks lie scattered in the pool) reads
# back cold, sequentially, byte for byte as written, with readahead on
# (the default: the mount says it hinted windows) and off (--readahead 0);
# an overwrite after a readahead reads back new at once, and cold again.
. "$(dirname "$0")/lib.sh"
need fusermount3 mountpoint sha256sum dd python3 cmp
need_root "mounts a FUSE file system and drops the page cache"
need_fuse
e2e_init fs_readahead

POOL=$T/pool.img
MNT=$T/mnt
mkdir -p "$MNT"
MOUNT_PID=
MB=48

sum() { sha256sum "$1" | cut -c1-64; }
cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# scatter SRC DST: SRC's 4 KiB blocks written to DST in shuffled order,
# each an O_DIRECT write of its own (the kernel's writeback cache would
# otherwise send them in order), then fsync
scatter() {
  python3 - "$1" "$2" <<'EOF'
import mmap, os, random, sys
src = open(sys.argv[1], "rb").read()
fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
buf = mmap.mmap(-1, 4096)  # page aligned, as O_DIRECT wants
order = list(range(len(src) // 4096))
random.Random(15).shuffle(order)
for i in order:
    buf[:] = src[i * 4096:(i + 1) * 4096]
    os.pwrite(fd, buf, i * 4096)
os.fsync(fd)
os.close(fd)
EOF
}

# hinted: windows the last mount hinted, from its exit line
hinted() { sed -n 's/.*readahead: [0-9]* windows, \([0-9]*\) hinted.*/\1/p' "$T/mount.log" | tail -n 1; }

step "a file written at random through the mount"
make_pool "$POOL" 1G
check "tarn fs create home" tarn fs create home -p "$POOL"
check "expected content: $MB MiB" dd if=/dev/urandom of="$T/want" bs=1M count=$MB status=none
export RUST_LOG=tarn_fs=info
fs_mount home
check "scattered write of $MB MiB" scatter "$T/want" "$MNT/f"
check "sequential copy for the contiguous peer" cp "$T/want" "$MNT/seq"
fs_umount

step "readahead on: cold sequential reads equal what was written"
fs_mount home
cold
check "cmp f (scattered) after a cold start" cmp "$MNT/f" "$T/want"
cold
check "cmp seq (contiguous)" cmp "$MNT/seq" "$T/want"
step "an overwrite after readahead reads back new, warm and cold"
check "overwrite 1 MiB at 8 MiB" dd if=/dev/urandom of="$T/patch" bs=1M count=1 status=none
check "patch the expected copy" dd if="$T/patch" of="$T/want" bs=1M seek=8 conv=notrunc status=none
check "patch f through the mount" dd if="$T/patch" of="$MNT/f" bs=1M seek=8 conv=notrunc,fsync status=none
check "cmp f after the overwrite (page cache)" cmp "$MNT/f" "$T/want"
cold
check "cmp f after the overwrite (cold)" cmp "$MNT/f" "$T/want"
fs_umount
n=$(hinted)
check "the mount hinted scattered windows (${n:-none})" test "${n:-0}" -gt 0

step "readahead off (--readahead 0): the same bytes"
fs_mount home --readahead 0
cold
check "cmp f with readahead off" cmp "$MNT/f" "$T/want"
expect_eq "sha256 of f matches" "$(sum "$MNT/f")" "$(sum "$T/want")"
fs_umount
fs_clean "after the readahead checks"

e2e_finish
