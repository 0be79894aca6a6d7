#!/usr/bin/env bash
# The kernel as an NBD client, without the nbd module: nbdfuse exposes the
# export as a file, a loop device turns that into a block device, ext4 on
# top. Files are written, checksummed, fsck'ed, re-verified after a full
# teardown + server restart; then deleted and fstrim'ed, and the volume's
# allocated bytes must drop to roughly what the filesystem still holds.
. "$(dirname "$0")/lib.sh"
need nbdfuse fusermount3 losetup mkfs.ext4 e2fsck fstrim sha256sum mountpoint
need_root "losetup, mount"
need_fuse
need_loop
e2e_init ext4_kernel

M=$((1 << 20))
POOL=$T/pool.img
VOL=ext
make_pool "$POOL" 4G
make_vol "$POOL" $VOL 1G
start_serve "$POOL"

FUSE=$T/fuse
MNT=$T/mnt
mkdir -p "$FUSE" "$MNT"

step "nbdfuse + loop + mkfs.ext4 + mount"
fuse_attach $VOL $((1 << 30))
vol_get "$POOL" $VOL allocated; A_FRESH=$VAL
check "mkfs.ext4" mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 -L tarn "$LOOP"
check "mount ext4" mount -t ext4 "$LOOP" "$MNT"
mountpoint -q "$MNT" || die "ext4 not mounted"
sync
vol_get "$POOL" $VOL allocated; A_EMPTY=$VAL
say "  allocated: fresh volume $(mib "$A_FRESH"), after mkfs+mount $(mib "$A_EMPTY")"

step "write files: 2x64M + 6x8M random, 1500 small files, 1 sparse file"
(
  set -e
  head -c $((64 * M)) /dev/urandom >"$MNT/big1"
  head -c $((64 * M)) /dev/urandom >"$MNT/big2"
  mkdir -p "$MNT/mid" "$MNT/small/a" "$MNT/small/b" "$MNT/small/c"
  for i in 1 2 3 4 5 6; do head -c $((8 * M)) /dev/urandom >"$MNT/mid/f$i"; done
  "$SYSPY" - "$MNT/small" <<'PY'
import os, random, sys
r = random.Random(99)
base = sys.argv[1]
for i in range(1500):
    d = os.path.join(base, "abc"[i % 3])
    with open(os.path.join(d, f"s{i:04d}"), "wb") as f:
        f.write(r.randbytes(r.randint(1, 12000)))
PY
  truncate -s 300M "$MNT/sparse"
  dd if=/dev/urandom of="$MNT/sparse" bs=1M seek=150 count=2 conv=notrunc status=none
) || die "writing files on the mounted ext4 failed"
check "sync" sync
(cd "$MNT" && find . -type f -print0 | sort -z | xargs -0 sha256sum) >"$T/sums"
say "  $(wc -l <"$T/sums") files, $(du -sm "$MNT" | cut -f1) MiB used in the fs ($(df -m --output=used "$MNT" | tail -1 | tr -d ' ') MiB df)"
USED_FULL=$(du -s -B1 "$MNT" | cut -f1)
vol_get "$POOL" $VOL allocated; A_FULL=$VAL

step "unmount, e2fsck -fn, full teardown, restart tarn, remount, verify"
fuse_detach
fuse_attach $VOL $((1 << 30))
check "e2fsck -fn clean" e2fsck -fn "$LOOP"
fuse_detach
stop_serve
pool_check "$POOL" "after ext4 writes + SIGTERM"
start_serve "$POOL"
fuse_attach $VOL $((1 << 30))
check "remount ext4" mount -t ext4 "$LOOP" "$MNT"
check "sha256sum -c of all files after restart" bash -c "cd '$MNT' && sha256sum --quiet -c '$T/sums'"

step "delete most data, fstrim, check allocation drops"
rm -rf "$MNT/big1" "$MNT/big2" "$MNT/mid/f2" "$MNT/mid/f3" "$MNT/mid/f4" "$MNT/mid/f5" "$MNT/mid/f6" "$MNT/small/b" "$MNT/sparse"
sync
REMAIN=$(du -s -B1 "$MNT" | cut -f1)
trim_out=$(fstrim -v "$MNT" 2>&1) && ok "fstrim -v: $trim_out" || bad "fstrim -v failed: $trim_out"
sync
(cd "$MNT" && find . -type f -print0 | sort -z | xargs -0 sha256sum) >"$T/sums2"
check "remaining files intact after fstrim" bash -c "cd '$MNT' && sha256sum --quiet -c '$T/sums2'"
fuse_detach
vol_get "$POOL" $VOL allocated; A_TRIM=$VAL
say "  allocated bytes:"
say "    fresh volume            $(mib "$A_FRESH")"
say "    after mkfs (fs meta)    $(mib "$A_EMPTY")"
say "    after writing files     $(mib "$A_FULL")"
say "    after delete + fstrim   $(mib "$A_TRIM")   (fs still holds $(mib "$REMAIN") by du)"
say "    (fs used by du after writing: $(mib "$USED_FULL"))"
expect_between "allocation after writing ~= data in the fs" "$A_FULL" $((USED_FULL * 97 / 100)) \
  $((A_EMPTY + USED_FULL * 105 / 100 + 16 * M))
# remaining = fs metadata (as allocated right after mkfs) + what du says is
# still used, with 3% + 4 MiB slack for directory/journal churn
expect_between "allocation after fstrim ~= fs metadata + remaining data" "$A_TRIM" $((REMAIN / 2)) \
  $((A_EMPTY + REMAIN + (A_EMPTY + REMAIN) * 3 / 100 + 4 * M))

step "e2fsck after trim, server shutdown"
fuse_attach $VOL $((1 << 30))
check "e2fsck -fn clean after fstrim" e2fsck -fn "$LOOP"
fuse_detach
stop_serve
pool_check "$POOL" "after fstrim + SIGTERM"
e2e_finish
