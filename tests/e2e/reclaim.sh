#!/usr/bin/env bash
# Gray-box reclaim (VA seed 000): files deleted on an ext4 mounted without
# discard, never fstrim'ed, leave their blocks allocated in tarn; `tarn vol
# reclaim` reads the file system's bitmaps from a snapshot and gives the
# space back, while the server runs. A mounted (unfrozen) file system and a
# volume without ext are refused; a frozen one is reclaimed live, and
# blocks written after the scan survive. e2fsck and checksums verify.
. "$(dirname "$0")/lib.sh"
need nbdfuse fusermount3 losetup mkfs.ext4 e2fsck dumpe2fs fsfreeze sha256sum mountpoint
need_root "losetup, mount"
need_fuse
need_loop
e2e_init reclaim

M=$((1 << 20))
POOL=$T/pool.img
VOL=fs
make_pool "$POOL" 4G
make_vol "$POOL" $VOL 1G
make_vol "$POOL" raw 64M
start_serve "$POOL"
FUSE=$T/fuse
MNT=$T/mnt
mkdir -p "$FUSE" "$MNT"

# Bytes the file system marks used, from dumpe2fs of the unmounted device.
fs_used() {
  dumpe2fs -h "$LOOP" 2>/dev/null | awk -F: '
    /^Block count/ {n=$2} /^Free blocks/ {f=$2} /^Block size/ {b=$2}
    END {printf "%d", (n - f) * b}'
}
reclaim() { timeout 300 "$TARN" vol reclaim -p "$POOL" "$@"; }

step "ext4 mounted with nodiscard: write 240 MiB, delete 200 MiB, no fstrim"
fuse_attach $VOL $((1 << 30))
check "mkfs.ext4" mkfs.ext4 -q -F -E nodiscard,lazy_itable_init=0,lazy_journal_init=0 "$LOOP"
check "mount -o nodiscard" mount -t ext4 -o nodiscard "$LOOP" "$MNT"
(
  set -e
  mkdir -p "$MNT/keep" "$MNT/gone"
  for i in 1 2 3 4 5; do head -c $((40 * M)) /dev/urandom >"$MNT/gone/big$i"; done
  head -c $((32 * M)) /dev/urandom >"$MNT/keep/big"
  for i in $(seq 1 300); do head -c $((i * 100)) /dev/urandom >"$MNT/keep/s$i"; done
) || die "writing files failed"
sync
(cd "$MNT" && find keep -type f -print0 | sort -z | xargs -0 sha256sum) >"$T/sums"
rm -rf "$MNT/gone"
sync
vol_get "$POOL" $VOL allocated; A_DELETED=$VAL

step "refusals: a mounted ext4 (journal needs recovery), a volume without ext"
out=$(reclaim $VOL 2>&1) && bad "reclaim of a mounted ext4 succeeded: $out" || {
  case "$out" in *"journal needs recovery"*) ok "mounted ext4 refused: ${out##*: }";; *) bad "mounted ext4 refused with: $out";; esac; }
vol_get "$POOL" $VOL allocated; expect_eq "nothing freed by a refused reclaim" "$VAL" "$A_DELETED"
head -c $((4 * M)) /dev/urandom | "$SYSPY" -c '
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1]); h.pwrite(sys.stdin.buffer.read(), 0); h.flush()' "$(uri raw)"
out=$(reclaim raw 2>&1) && bad "reclaim of a volume without ext succeeded: $out" || {
  case "$out" in *"no ext2/3/4 file system"*) ok "non-ext volume refused";; *) bad "non-ext volume refused with: $out";; esac; }
snaps=$(timeout 60 "$TARN" snap list -p "$POOL" 2>&1)
case "$snaps" in *tarn-reclaim*) bad "the reclaim snapshot was left behind: $snaps";; *) ok "no reclaim snapshot left behind";; esac

step "frozen ext4: dry run, then reclaim live; write after the freeze is lifted"
check "fsfreeze -f" fsfreeze -f "$MNT"
out=$(reclaim $VOL --dry-run --json) || die "dry run failed: $out"
DRY=$(jq -r .reclaimed_bytes <<<"$out")
vol_get "$POOL" $VOL allocated; expect_eq "a dry run frees nothing" "$VAL" "$A_DELETED"
out=$(reclaim $VOL --json) || die "reclaim failed: $out"
check "fsfreeze -u" fsfreeze -u "$MNT"
GOT=$(jq -r .reclaimed_bytes <<<"$out")
say "  $(jq -c . <<<"$out")"
expect_eq "the dry run counted what the reclaim freed" "$DRY" "$GOT"
expect_between "reclaimed at least the 200 MiB deleted" "$GOT" $((195 * M)) $((260 * M))
head -c $((8 * M)) /dev/urandom >"$MNT/keep/after" || bad "write after reclaim failed"
sync
(cd "$MNT" && sha256sum keep/after) >>"$T/sums"
KEPT=$(du -s -B1 --apparent-size "$MNT/keep" | cut -f1)

step "unmount: e2fsck clean, files intact, allocation ~= file system usage"
fuse_detach
fuse_attach $VOL $((1 << 30))
check "e2fsck -fn clean" e2fsck -fn "$LOOP"
USED=$(fs_used)
vol_get "$POOL" $VOL allocated; A_AFTER=$VAL
say "  allocated: $(mib "$A_DELETED") after the deletes, $(mib "$A_AFTER") after reclaim; the fs uses $(mib "$USED")"
# At most what the file system uses (+2%); less where it counts blocks it
# never wrote (a zeroed journal stays a hole in tarn); at least the files kept.
expect_between "allocated within 2% of the file system's used blocks, or less" "$A_AFTER" "$KEPT" $((USED * 102 / 100))
check "mount again" mount -t ext4 "$LOOP" "$MNT"
check "every kept file intact" bash -c "cd '$MNT' && sha256sum --quiet -c '$T/sums'"
fuse_detach

step "an unmounted ext4 is reclaimed too (nothing left to free)"
out=$(reclaim $VOL --json) || bad "reclaim of an unmounted ext4 failed: $out"
expect_between "a second reclaim frees (almost) nothing" "$(jq -r .reclaimed_bytes <<<"$out")" 0 $((1 * M))
stop_serve
pool_check "$POOL" "after reclaim"
e2e_finish
