#!/usr/bin/env bash
# Block and file volumes served by one process (issue 15): `tarn serve
# --mount NAME:DIR` serves a file volume through FUSE beside the pool's
# NBD exports. Namespace changes on the mount while an NBD client writes
# and flushes a block volume; kill -9 of the server (every fsync'd byte
# and every flushed block back, checkers clean); a clean stop unmounts
# and commits; a user's unmount leaves NBD serving; bad --mount input.
. "$(dirname "$0")/lib.sh"
need fusermount3 mountpoint nbdinfo nbdsh qemu-io sha256sum setfattr
need_root "mounts a FUSE file system"
need_fuse
e2e_init fs_serve

POOL=$T/pool.img
MNT=$T/mnt
mkdir -p "$MNT"
MOUNT_PID=

step "set-up and bad --mount input"
make_pool "$POOL" 4G
make_vol "$POOL" disk0 1G
check "tarn fs create home" tarn fs create home -p "$POOL"
check "version policy *.txt" tarn fs version-policy home add '*.txt' -p "$POOL"
check_fails "--mount without a directory" tarn serve -p "$POOL" --mount home
expect_eq "its error names NAME:DIR" "$(printf '%s' "$LAST_OUT" | grep -c 'NAME:DIR expected')" 1
check_fails "--mount of a snapshot" tarn serve -p "$POOL" --mount home@s1:"$MNT"
check_fails "--mount of an unknown file volume" tarn serve -p "$POOL" --listen 127.0.0.1:0 --mount nosuch:"$MNT"
expect_eq "its error names the volume" "$(printf '%s' "$LAST_OUT" | grep -c 'nosuch')" 1
check_fails "--mount on a missing directory" tarn serve -p "$POOL" --listen 127.0.0.1:0 --mount home:"$T/none"
expect_eq "nothing left mounted" "$(mountpoint -q "$MNT" && echo yes || echo no)" no
check "the pool is clean after the refused starts" tarn pool check -p "$POOL"

step "serve --mount: NBD and the file volume from one process"
start_serve "$POOL" --mount home:"$MNT"
E2E_FUSE+=("$MNT")
check "the file volume is mounted" mountpoint -q "$MNT"
expect_eq "mounted as tarn:home" "$(findmnt -n -o SOURCE "$MNT")" tarn:home
mkdir -p "$T/other"
check_fails "tarn mount of the served pool" tarn mount home "$T/other" -p "$POOL"
expect_eq "its error points to serve --mount" "$(printf '%s' "$LAST_OUT" | grep -c 'serve --mount')" 1
check "qemu-io writes disk0 over NBD" qemu-io -f raw -c "write -P 0x5a 0 4M" -c flush "$(uri disk0)"
head -c 3000000 /dev/urandom >"$T/big"
check "cp into the mount" cp "$T/big" "$MNT/big"
check "fsync of the copy" "$SYSPY" -c "import os; fd = os.open('$MNT/big', os.O_RDONLY); os.fsync(fd)"
mkdir -p "$MNT/a" "$MNT/b"
echo moving >"$MNT/a/f"
check "fsync of the mount's root" "$SYSPY" -c "import os; fd = os.open('$MNT', os.O_RDONLY); os.fsync(fd)"

step "versions and snapshots through the served mount"
for k in 1 2 3; do echo "state $k" >"$MNT/notes.txt"; done
expect_eq "notes.txt@ lists one close version per edit" "$(ls "$MNT/notes.txt@" | wc -l)" 3
expect_eq "notes.txt@2 is the second state" "$(cat "$MNT/notes.txt@2")" "state 2"
check "a volume snapshot by setfattr" setfattr -n user.tarn.snapshot -v s1 "$MNT"
echo "state 4" >"$MNT/notes.txt"
expect_eq "the snapshot in the version directory" "$(ls "$MNT/notes.txt@" | wc -l)" 5
check "fsync of the mount's root after the snapshot" "$SYSPY" -c "import os; fd = os.open('$MNT', os.O_RDONLY); os.fsync(fd)"

step "namespace changes beside an NBD writer's flushes, then kill -9"
# The NBD client writes 4 KiB blocks, each followed by a FLUSH (a commit
# the server makes from another thread than the mount's), and records the
# last block whose flush was answered.
cat >"$T/writer.py" <<EOF
import nbd, os
h = nbd.NBD()
h.connect_uri("$(uri disk0)")
for i in range(1, 100000):
    h.pwrite(bytes([i % 251]) * 4096, (i % 65536) * 4096 + 8 * 1024 * 1024)
    h.flush()
    with open("$T/flushed.tmp", "w") as f:
        f.write(str(i))
    os.replace("$T/flushed.tmp", "$T/flushed")
EOF
"$SYSPY" "$T/writer.py" >"$T/writer.log" 2>&1 &
WRITER=$!
E2E_PIDS+=("$WRITER")
# Renames across two directories, creates and unlinks on the mount.
(
  cd "$MNT"
  for i in $(seq 1 100000); do
    if [ $((i % 2)) = 1 ]; then mv a/f b/f; else mv b/f a/f; fi
    echo "$i" >"n$((i % 50))"
    rm -f "n$(((i + 25) % 50))"
  done
) >"$T/changes.log" 2>&1 &
CHANGER=$!
E2E_PIDS+=("$CHANGER")
sleep 6
check "the NBD writer flushed while the mount changed" test "$(cat "$T/flushed" 2>/dev/null || echo 0)" -gt 20
kill9_serve
FLUSHED=$(cat "$T/flushed")
kill "$CHANGER" "$WRITER" 2>/dev/null || true
wait "$CHANGER" "$WRITER" 2>/dev/null || true
check "fusermount3 -u of the dead mount" fusermount3 -u "$MNT"
say "  last flush answered: block $FLUSHED"
check "tarn fs check home clean after kill -9" tarn fs check home -p "$POOL"
pool_check "$POOL" "after kill -9"

step "after the restart: every fsync'd byte and flushed block"
start_serve "$POOL" --mount home:"$MNT"
expect_eq "the fsync'd copy" "$(sha256sum <"$MNT/big")" "$(sha256sum <"$T/big")"
expect_eq "the moved file under exactly one name" "$(ls "$MNT/a" "$MNT/b" | grep -c '^f$')" 1
off=$(( (FLUSHED % 65536) * 4096 + 8 * 1024 * 1024 ))
byte=$(printf '0x%02x' $((FLUSHED % 251)))
check "the last flushed block reads back" qemu-io -f raw -c "read -P $byte $off 4096" "$(uri disk0)"
check "the first write reads back" qemu-io -f raw -c "read -P 0x5a 0 4M" "$(uri disk0)"
expect_eq "the versions after the restart" "$(ls "$MNT/notes.txt@" | wc -l)" 5

step "a user's unmount leaves NBD serving; a clean stop commits"
echo "after restart" >"$MNT/late"
check "fusermount3 -u by the user" fusermount3 -u "$MNT"
check "NBD still answers" nbdinfo --list "$(uri disk0)"
stop_serve
start_serve "$POOL" --mount home:"$MNT"
expect_eq "a file closed before the user's unmount" "$(cat "$MNT/late")" "after restart"
echo "unsynced" >"$MNT/at-stop"
stop_serve
expect_eq "the stop unmounted" "$(mountpoint -q "$MNT" && echo yes || echo no)" no
fs_mount home
expect_eq "a file closed, never synced, before the stop" "$(cat "$MNT/at-stop")" unsynced
fs_umount
check "tarn fs check home clean at the end" tarn fs check home -p "$POOL"
pool_check "$POOL" "at the end"
e2e_finish
