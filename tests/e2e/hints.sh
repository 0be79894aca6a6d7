#!/usr/bin/env bash
# File-system hints (seed 002) on a real kernel ext4: aged through
# nbdfuse + loop on a pool with a small device kept for metadata; `tarn vol
# classify` against e2image's idea of the metadata (precision and recall);
# `tarn vol hint --metadata-device` moves the metadata there (checked on
# the volume's map), `vol unhint` moves it back; e2fsck clean and every
# file intact after each, the pool checker clean at the end.
. "$(dirname "$0")/lib.sh"
need nbdfuse fusermount3 losetup mkfs.ext4 e2fsck e2image resize2fs sha256sum mountpoint qemu-img nbdcopy jq
need_root "losetup, mount"
need_fuse
need_loop
e2e_init hints

M=$((1 << 20))
POOL=$T/pool.img
META=$T/meta.img
VOL=fs
truncate -s 256M "$META"
check "pool create with a metadata device" "$TARN" pool create "$POOL" --size 3G --device "$META"
make_vol "$POOL" $VOL 1G
start_serve "$POOL" --metadata-device "$META"
FUSE=$T/fuse
MNT=$T/mnt
mkdir -p "$FUSE" "$MNT"
CHECK="$SYSPY $(dirname "$0")/hints_check.py"
# fs_intact WHEN: e2fsck clean, and every file as it was aged
fs_intact() {
  check "e2fsck -fn clean $1" e2fsck -fn "$LOOP"
  check "mount $1" mount -t ext4 "$LOOP" "$MNT"
  check "every file intact $1" bash -c "cd '$MNT' && sha256sum --quiet -c '$T/sums'"
  umount "$MNT" || bad "umount"
}
# truth LABEL CLASSIFY_JSON E2IMAGE: precision and recall, printed
truth() {
  local out rc=0
  out=$($CHECK truth "$LOOP" "$2" "$3" 2>&1) || rc=$?
  printf '%s\n' "$out" | sed 's/^/    /'
  if [ $rc = 0 ]; then ok "$1"; else bad "$1"; fi
}

step "ext4 aged: trees copied, files patched and deleted, round after round"
fuse_attach $VOL $((1 << 30))
check "mkfs.ext4" mkfs.ext4 -q -F "$LOOP"
check "mount" mount -t ext4 "$LOOP" "$MNT"
"$SYSPY" - "$MNT" <<'PY' || die "aging the file system failed"
import os, random, shutil, sys
root, r = sys.argv[1], random.Random(7)
for round_ in range(4):
    base = os.path.join(root, f"tree{round_}")
    for d in range(60):
        sub = os.path.join(base, f"dir{d % 12}", f"sub{d}")
        os.makedirs(sub, exist_ok=True)
        for f in range(r.randint(5, 40)):
            with open(os.path.join(sub, f"file{f}.c"), "wb") as fh:
                fh.write(r.randbytes(r.choice([200, 3000, 9000, 40000, 150000])))
    # patch: append to some files of older trees, delete others
    for old in range(round_):
        for dirpath, _, files in os.walk(os.path.join(root, f"tree{old}")):
            for name in files:
                p = os.path.join(dirpath, name)
                x = r.random()
                if x < 0.2:
                    os.remove(p)
                elif x < 0.4:
                    with open(p, "ab") as fh:
                        fh.write(r.randbytes(5000))
    if round_ == 2:
        shutil.rmtree(os.path.join(root, "tree0", "dir3"), ignore_errors=True)
PY
sync
(cd "$MNT" && find . -type f -print0 | sort -z | xargs -0 sha256sum) >"$T/sums"
say "  $(wc -l <"$T/sums") files, $(df -m --output=used "$MNT" | tail -1 | tr -d ' ') MiB used"
fuse_detach
fuse_attach $VOL $((1 << 30))

step "classify against e2image"
out=$("$TARN" vol classify $VOL -p "$POOL" --runs --json) || die "vol classify failed: $out"
printf '%s' "$out" >"$T/classify.json"
say "  $("$TARN" vol classify $VOL -p "$POOL" | tr '\n' ';')"
check "e2image -r" e2image -r "$LOOP" "$T/e2image.img"
truth "ext4: classifier precision and recall against e2image" "$T/classify.json" "$T/e2image.img"

# placement DEVICE: percent of mapped metadata blocks on DEVICE
placement() {
  "$TARN" vol map $VOL -p "$POOL" --json >"$T/map.json" || die "vol map failed"
  $CHECK placement "$T/classify.json" "$T/map.json" "$1"
}
read -r BEFORE NMETA <<<"$(placement 1)"
say "  before hints: $BEFORE% of $NMETA mapped metadata blocks on the metadata device"
expect_eq "no data on the metadata device before hints (serve --metadata-device)" "$BEFORE" "0.00"

step "vol hint --metadata-device: metadata moves to the metadata device"
out=$("$TARN" vol hint $VOL -p "$POOL" --metadata-device "$META" --json) || die "vol hint failed: $out"
say "  $(jq -c . <<<"$out")"
read -r AFTER _ <<<"$(placement 1)"
expect_between "metadata on the metadata device after hints (percent x100)" "${AFTER/./}" 9900 10000
out=$("$TARN" vol hint $VOL -p "$POOL" --metadata-device "$META" --json) || bad "second vol hint failed: $out"
expect_eq "a second hint moves nothing" "$(jq -r .moved_bytes <<<"$out")" 0
"$TARN" vol map $VOL -p "$POOL" --json >"$T/map.json" || bad "vol map failed"
DATA_AT=$($CHECK datablock "$T/classify.json" "$T/map.json") || die "no data block found"
out=$("$TARN" vol hint $VOL -p "$POOL" --metadata-device "$META" --metadata "$DATA_AT:4K" --json) || bad "explicit hint: $out"
expect_eq "an explicit hint of a data block moves it" "$(jq -r .moved_bytes <<<"$out")" 4096
out=$("$TARN" vol hint $VOL -p "$POOL" --metadata-device "$META" --json) || bad "third vol hint failed: $out"
expect_eq "an inferred hint sends the block that is no metadata back" "$(jq -r .returned_bytes <<<"$out")" 4096
read -r AGAIN _ <<<"$(placement 1)"
expect_eq "metadata still all on the metadata device" "$AGAIN" "100.00"
fs_intact "after hints"

step "vol unhint: metadata moves back"
out=$("$TARN" vol unhint $VOL -p "$POOL" --json) || die "vol unhint failed: $out"
say "  $(jq -c . <<<"$out")"
read -r BACK _ <<<"$(placement 1)"
expect_eq "no metadata left on the metadata device after unhint" "$BACK" "0.00"
fs_intact "after unhint"

step "vol export / vol import: the volume leaves tarn as a raw image and comes back"
check "vol export (served)" "$TARN" vol export $VOL "$T/export.raw" -p "$POOL"
check "exported image byte-identical to the volume" cmp "$T/export.raw" "$LOOP"
check "e2fsck -fn clean on the exported image" e2fsck -fn "$T/export.raw"
expect_between "exported image is sparse (MiB on disk)" "$(du -m "$T/export.raw" | cut -f1)" 1 300
check_fails "export over an existing file without --force" "$TARN" vol export $VOL "$T/export.raw" -p "$POOL"
check "vol import of the raw image" "$TARN" vol import "$T/export.raw" fsraw -p "$POOL"
check "qemu-img convert to qcow2" qemu-img convert -O qcow2 "$T/export.raw" "$T/export.qcow2"
out=$("$TARN" vol import "$T/export.qcow2" fsqcow -p "$POOL" --json) || bad "vol import of a qcow2 image: $out"
say "  $(jq -c . <<<"$out")"
for v in fsraw fsqcow; do
  check "$v reads back byte-identical" nbdcopy "$(uri $v)" "$T/$v.back"
  check "$v equals the image" cmp "$T/$v.back" "$T/export.raw"
  rm -f "$T/$v.back"
done
vol_get "$POOL" fsqcow allocated
expect_between "an import allocates only the data (MiB)" "$((VAL / M))" 1 300
check_fails "import into an existing volume" "$TARN" vol import "$T/export.raw" fsraw -p "$POOL"
check_fails "import of a missing file" "$TARN" vol import "$T/nonesuch.raw" fsnone -p "$POOL"
expect_eq "a failed import leaves no volume" "$("$TARN" vol list -p "$POOL" --json | jq '[.[] | select(.name == "fsnone")] | length')" 0
fuse_detach

step "ext2 and ext3 through the kernel: the classifier against e2image"
make_vol "$POOL" fsold $((256 * M))
for fs in ext2 ext3; do
  fuse_attach fsold $((256 * M))
  check "mkfs.$fs" mkfs.ext4 -q -F -t $fs "$LOOP"
  check "mount $fs" mount -t $fs "$LOOP" "$MNT"
  "$SYSPY" - "$MNT" <<'PY' || bad "filling $fs failed"
import os, random, sys
r = random.Random(11)
for d in range(30):
    sub = os.path.join(sys.argv[1], f"d{d % 5}", f"s{d}")
    os.makedirs(sub, exist_ok=True)
    for f in range(r.randint(5, 30)):
        with open(os.path.join(sub, f"f{f}"), "wb") as fh:
            fh.write(r.randbytes(r.choice([100, 5000, 60000, 400000])))
    if d % 7 == 3:
        os.symlink("x" * 200, os.path.join(sub, "long-link"))
PY
  umount "$MNT" || bad "umount $fs"
  fuse_detach
  fuse_attach fsold $((256 * M))
  out=$("$TARN" vol classify fsold -p "$POOL" --runs --json) || bad "vol classify on $fs failed: $out"
  printf '%s' "$out" >"$T/classify-$fs.json"
  expect_eq "classify names the file system" "$(jq -r .file_system "$T/classify-$fs.json")" $fs
  check "e2image -r ($fs)" e2image -r "$LOOP" "$T/e2image-$fs.img"
  truth "$fs: classifier precision and recall against e2image" "$T/classify-$fs.json" "$T/e2image-$fs.img"
  rm -f "$T/e2image-$fs.img"
  fuse_detach
done
# ext3 above was a reformat of the ext2; now resize2fs grows it.
check "vol resize fsold to 384 MiB" "$TARN" vol resize fsold --size 384M -p "$POOL"
fuse_attach fsold $((384 * M))
# resize2fs wants a check since the last mount (when its clock says so).
check "e2fsck -f before resize2fs" e2fsck -fy "$LOOP"
check "resize2fs to 384 MiB" resize2fs "$LOOP"
out=$("$TARN" vol classify fsold -p "$POOL" --runs --json) || bad "vol classify after resize2fs failed: $out"
printf '%s' "$out" >"$T/classify-grown.json"
check "e2image -r (grown)" e2image -r "$LOOP" "$T/e2image-grown.img"
truth "after resize2fs: classifier precision and recall against e2image" "$T/classify-grown.json" "$T/e2image-grown.img"
rm -f "$T/e2image-grown.img"
fuse_detach

step "bad input"
check_fails "hint to a device that is not the pool's" "$TARN" vol hint $VOL -p "$POOL" --metadata-device /dev/null
check_fails "a malformed range" "$TARN" vol hint $VOL -p "$POOL" --metadata 12
check_fails "a range outside the volume" "$TARN" vol hint $VOL -p "$POOL" --metadata 2G:1M
head -c $((1 * M)) /dev/zero | "$SYSPY" -c '
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1]); h.pwrite(sys.stdin.buffer.read(), 0); h.flush()' "$(uri $VOL)"
out=$("$TARN" vol classify $VOL -p "$POOL" 2>&1) && bad "classify of a wiped file system succeeded: $out" || {
  case "$out" in *"no ext2/3/4"*) ok "a volume without ext: $out";; *) bad "classify of a wiped volume: $out";; esac; }
stop_serve
check "vol export offline (pool opened by the CLI)" "$TARN" vol export fsraw "$T/offline.raw" -p "$POOL"
check "offline export equals the served one" cmp "$T/offline.raw" "$T/export.raw"
rm -f "$T"/*.raw "$T"/*.qcow2
pool_check "$POOL" "after hints, unhint, export and import"
e2e_finish
