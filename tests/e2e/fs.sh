#!/usr/bin/env bash
# File volumes through FUSE (issue 15, first slice): `tarn fs create`, a
# real mount with `tarn mount`, real tools on it (cp -a, diff -r, tar,
# git, sqlite3), POSIX checks with expected results, a >4 GiB sparse file,
# statfs, usage in `tarn fs list`, unmount + pool close + remount keeps
# everything, objects stay hidden from block commands, bad input.
. "$(dirname "$0")/lib.sh"
need fusermount3 mountpoint diff tar git sqlite3 sha256sum df du truncate setpriv
need_root "mounts a FUSE file system for other users' tools"
need_fuse
e2e_init fs

G=$((1 << 30))
POOL=$T/pool.img
MNT=$T/mnt
mkdir -p "$MNT"
MOUNT_PID=


step "create: file volumes, hidden objects, bad input"
make_pool "$POOL" 8G
check "tarn fs create home" tarn fs create home -p "$POOL"
check_fails "fs create of an existing name" tarn fs create home -p "$POOL"
check_fails "vol create over a file volume's name" tarn vol create home --size 1G -p "$POOL"
check_fails "mount of an unknown file volume" tarn mount nosuch "$MNT" -p "$POOL"
expect_eq "fs list names home" "$(tarn fs list --json -p "$POOL" | jq -r '.[].name')" home

step "real trees: cp -a, diff -r, tar round trip"
fs_mount home
check "cp -a crates/ into the mount" cp -a "$REPO/crates" "$MNT/crates"
check "cp -a /usr/share/doc into the mount" cp -a /usr/share/doc "$MNT/doc"
check "diff -r --no-dereference equal" diff -r --no-dereference /usr/share/doc "$MNT/doc"
check "diff -r equal" diff -r "$REPO/crates" "$MNT/crates"
check "tar c | tar x out of the mount" bash -c "mkdir -p '$T/untar' && (cd '$MNT' && tar cf - crates) | (cd '$T/untar' && tar xf -)"
check "tar copy equal" diff -r "$REPO/crates" "$T/untar/crates"
check "tar x into the mount" bash -c "mkdir -p '$MNT/t2' && (cd '$T/untar' && tar cf - crates) | (cd '$MNT/t2' && tar xf -)"
check "second copy equal" diff -r "$REPO/crates" "$MNT/t2/crates"

step "POSIX: rename, links, symlinks, chmod, truncate, rmdir, names"
cd "$MNT"
echo one >a; echo two >b; mkdir -p d1/sub d2
check "rename over an existing name" mv -f b a
expect_eq "content after rename over" "$(cat a)" two
expect_eq "old name gone" "$(ls b 2>&1 >/dev/null | grep -c 'No such file')" 1
check "rename across directories" mv a d2/a
expect_eq "moved file" "$(cat d2/a)" two
check_fails "directory into its own subtree" mv d1 d1/sub/
# renameat2(2) with flags (coreutils 9.1's mv has no --exchange): FLAGS
# 1 = RENAME_NOREPLACE, 2 = RENAME_EXCHANGE; prints strerror on failure.
renameat2() {
  "$SYSPY" -c '
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.renameat2(-100, sys.argv[1].encode(), -100, sys.argv[2].encode(), int(sys.argv[3])) != 0:
    sys.exit(os.strerror(ctypes.get_errno()))' "$@"
}
echo keep >nr1; echo other >nr2
check_fails "RENAME_NOREPLACE over an existing name" renameat2 nr1 nr2 1
expect_eq "its error is EEXIST" "$(printf '%s' "$LAST_OUT" | grep -c 'File exists')" 1
expect_eq "the target is untouched" "$(cat nr2)" other
check "RENAME_NOREPLACE to a free name" renameat2 nr1 nr3 1
expect_eq "the file under its new name" "$(cat nr3)" keep
mkdir ex1; echo inside >ex1/f
check "RENAME_EXCHANGE of a directory and a file" renameat2 ex1 nr3 2
expect_eq "the file under the directory's name" "$(cat ex1)" keep
expect_eq "the directory under the file's name" "$(cat nr3/f)" inside
LINKS_D1=$(stat -c %h d1)
check "RENAME_EXCHANGE of directories across directories" renameat2 nr3 d1/sub 2
expect_eq "the swapped directory's content" "$(cat d1/sub/f)" inside
expect_eq "d1's link count unchanged (a directory for a directory)" "$(stat -c %h d1)" "$LINKS_D1"
check_fails "RENAME_EXCHANGE with a missing target" renameat2 nr2 nosuch 2
expect_eq "its error is ENOENT" "$(printf '%s' "$LAST_OUT" | grep -c 'No such file')" 1
check_fails "RENAME_EXCHANGE of a directory into its own subtree" renameat2 d1 d1/sub/f 2
# 4 = RENAME_WHITEOUT (overlayfs's upper layer): the old name becomes a
# character device 0:0 of mode 0.
echo lower >wo1
check "RENAME_WHITEOUT" renameat2 wo1 wo2 4
expect_eq "the file under its new name" "$(cat wo2)" lower
expect_eq "a whiteout at the old name" "$(stat -c '%F %t:%T %a' wo1)" "character special file 0:0 0"
check_fails "RENAME_WHITEOUT with NOREPLACE over an existing name" renameat2 wo2 nr2 5
expect_eq "both names untouched" "$(cat wo2 nr2)" "lower
other"
rm -rf nr2 nr3 ex1 wo1 wo2
# An overlayfs upper layer here (a container's writable layer): the
# kernel takes a FUSE upper only with RENAME_WHITEOUT, d_type and xattrs
# (user.overlay.* with userxattr), and refuses the mount otherwise.
mkdir -p "$T/ovl/lower/dir" "$T/ovl/merged" ovl/upper ovl/work
echo lower >"$T/ovl/lower/f"; echo x >"$T/ovl/lower/dir/g"
check "overlayfs mounted with its upper layer on the mount" mount -t overlay overlay \
  -o "lowerdir=$T/ovl/lower,upperdir=$MNT/ovl/upper,workdir=$MNT/ovl/work,userxattr" "$T/ovl/merged"
if mountpoint -q "$T/ovl/merged"; then
  check "a lower file deleted through the overlay" rm "$T/ovl/merged/f"
  check "a lower directory replaced by a new one" bash -c "rm -r '$T/ovl/merged/dir' && mkdir '$T/ovl/merged/dir' && echo new >'$T/ovl/merged/dir/h'"
  expect_eq "the merged view" "$(ls -A "$T/ovl/merged") / $(ls -A "$T/ovl/merged/dir")" "dir / h"
  expect_eq "a whiteout in the upper layer hides the lower file" "$(stat -c '%F %t:%T' ovl/upper/f)" "character special file 0:0"
  expect_eq "the new directory is opaque" "$("$SYSPY" -c 'import os, sys; print(os.getxattr(sys.argv[1], "user.overlay.opaque").decode())' ovl/upper/dir)" y
  check "overlayfs unmounted" umount "$T/ovl/merged"
fi
rm -rf ovl
mkdir spc
check "mkfifo" mkfifo -m 640 spc/fifo
expect_eq "a fifo, its mode" "$(stat -c '%F %a' spc/fifo)" "fifo 640"
check "the fifo carries data from one process to another" bash -c '(echo through >spc/fifo &); read -r x <spc/fifo; [ "$x" = through ]'
check "mknod c 1 3" mknod -m 666 spc/null c 1 3
expect_eq "a character device, its number" "$(stat -c '%F %t:%T %a' spc/null)" "character special file 1:3 666"
check "mknod b 7 200" mknod spc/blk b 7 200
expect_eq "a block device, its number" "$(stat -c '%F %t:%T' spc/blk)" "block special file 7:c8"
check "a unix socket bound in the mount" "$SYSPY" -c "import socket; socket.socket(socket.AF_UNIX).bind('spc/sock')"
expect_eq "a socket" "$(stat -c %F spc/sock)" socket
check "cp -a of the special files" cp -a spc spc2
expect_eq "the copies keep kind, numbers, mode, owner" "$(cd spc2 && stat -c '%n %F %t:%T %a %u' * | sort | md5sum)" "$(cd spc && stat -c '%n %F %t:%T %a %u' * | sort | md5sum)"
SPECIAL=$(cd spc && stat -c '%n %F %t:%T %a %u' * | sort)
check "hard link" ln d2/a d1/hard
expect_eq "nlink after ln" "$(stat -c %h d2/a)" 2
check "symlink" ln -s ../d2/a d1/sym
expect_eq "readlink" "$(readlink d1/sym)" ../d2/a
expect_eq "read through the symlink" "$(cat d1/sym)" two
LONG=$(printf 'x%.0s' $(seq 1 300))
check "long symlink target (300 bytes)" ln -s "$LONG" d1/longsym
expect_eq "long symlink read back" "$(readlink d1/longsym | wc -c)" 301
check "chmod 640" chmod 640 d2/a
expect_eq "mode" "$(stat -c %a d2/a)" 640
check "chown 1234:5678" chown 1234:5678 d2/a
expect_eq "owner" "$(stat -c %u:%g d2/a)" 1234:5678
check "touch -d (utimens)" touch -d '2001-02-03 04:05:06' d2/a
expect_eq "mtime" "$(stat -c %Y d2/a)" "$(date -d '2001-02-03 04:05:06' +%s)"
printf 'abcdefgh' >tr
check "truncate -s 3" truncate -s 3 tr
check "truncate -s 6" truncate -s 6 tr
expect_eq "truncated then extended reads zeros" "$(od -An -c tr | tr -s ' ')" " a b c \\0 \\0 \\0"
check_fails "rmdir of a non-empty directory" rmdir d1
expect_eq "rmdir error is ENOTEMPTY" "$(printf '%s' "$LAST_OUT" | grep -c 'not empty')" 1
N256=$(printf 'n%.0s' $(seq 1 256))
check_fails "a 256-byte name" touch "$N256"
expect_eq "error is ENAMETOOLONG" "$(printf '%s' "$LAST_OUT" | grep -c 'File name too long')" 1
check "a 255-byte name" touch "${N256:1}"
expect_eq "an open file unlinked is still read through its descriptor" "$("$SYSPY" -c "
import os
fd = os.open('tmpf', os.O_CREAT | os.O_RDWR, 0o600)
os.write(fd, b'kept')
os.unlink('tmpf')
print(os.pread(fd, 10, 0).decode(), os.path.exists('tmpf'))
os.close(fd)")" "kept False"
check "unlink the hard link" rm d1/hard
expect_eq "nlink after rm" "$(stat -c %h d2/a)" 1
cd "$T"

step "set-ID bits: dropped by the server as the kernel's own file systems do"
# The mount asks FUSE_HANDLE_KILLPRIV_V2 (no security.capability lookup
# per write): tarn then clears the bits itself. The same sequence on the
# host's file system is the reference; setpriv drops CAP_FSETID.
setid_modes() { # DIR: modes after a write, a truncate and a chown of 6755 files
  local out= pre f op how
  for how in root nofsetid; do
    pre=; [ $how = nofsetid ] && pre="setpriv --inh-caps=-fsetid --bounding-set=-fsetid --"
    for op in write trunc chown; do
      f=$1/sid-$how-$op; echo data >"$f"; chmod 6755 "$f"
      case $op in
        write) $pre sh -c "echo more >>'$f'" ;;
        trunc) $pre truncate -s 2 "$f" ;;
        chown) $pre chown 4321 "$f" ;;
      esac
      out+="$op/$how:$(stat -c %a "$f") "
    done
  done
  f=$1/sid-noexec; echo data >"$f"; chmod 2745 "$f"; chown 4321 "$f"
  echo "${out}chown-sgid-noexec:$(stat -c %a "$f")"
}
mkdir -p "$T/setid"
WANT="write/root:6755 trunc/root:6755 chown/root:755 write/nofsetid:755 trunc/nofsetid:755 chown/nofsetid:755 chown-sgid-noexec:2745"
expect_eq "set-ID modes on the host's file system" "$(setid_modes "$T/setid")" "$WANT"
expect_eq "set-ID modes on the mount" "$(setid_modes "$MNT")" "$WANT"
check "rm the set-ID files" rm "$MNT"/sid-*

step "a 5 GiB sparse file: write at 4.5 GiB, read back, holes"
check "truncate -s 5G" truncate -s 5G "$MNT/big"
head -c $((1 << 20)) /dev/urandom >"$T/chunk"
check "write 1 MiB at 4.5 GiB" dd if="$T/chunk" of="$MNT/big" bs=1M seek=4608 conv=notrunc status=none
check "read back at 4.5 GiB" cmp <(dd if="$MNT/big" bs=1M skip=4608 count=1 status=none) "$T/chunk"
expect_eq "size" "$(stat -c %s "$MNT/big")" $((5 * G))
expect_between "du of the sparse file (KiB)" "$(du -k "$MNT/big" | cut -f1)" 1024 1100
SEEK=$("$SYSPY" -c "
import os
f = os.open('$MNT/big', os.O_RDONLY)
print(os.lseek(f, 0, os.SEEK_DATA), os.lseek(f, 4608 << 20, os.SEEK_HOLE))")
expect_eq "SEEK_DATA from 0, SEEK_HOLE from the data" "$SEEK" "$((4608 << 20)) $((4609 << 20))"

step "statfs and usage"
DF_TOTAL=$(df -B1 --output=size "$MNT" | tail -1 | tr -d ' ')
expect_between "df size vs the 8 GiB pool" "$DF_TOTAL" $((7 * G)) $((8 * G))

step "git and sqlite3 on the mount"
check "git init/add/commit/branch/checkout" bash -c "cd '$MNT' && git init -q g && cd g && cp -a ../crates/fs . &&
  git add -A && git -c user.email=t@t -c user.name=t commit -qm one && git checkout -qb br &&
  echo x >>fs/Cargo.toml && git -c user.email=t@t -c user.name=t commit -qam two && git checkout -q - &&
  git fsck --strict && git gc -q"
check "sqlite3 writes" sqlite3 "$MNT/t.db" "create table t(a, b); insert into t select value, randomblob(500) from generate_series(1, 2000);"
expect_eq "sqlite3 integrity_check" "$(sqlite3 "$MNT/t.db" 'pragma integrity_check')" ok

step "a directory of many blocks: 6,000 creates, every other one unlinked, 1,000 more"
# Directory blocks (FS_DIR_BLOCKS): a change writes the blocks it touches;
# the names after remount are compared below with the rest of the tree.
check "6,000 files in one directory, 3,000 unlinked, 1,000 more" "$SYSPY" -c "
import os
d = '$MNT/manydir'
os.mkdir(d)
for i in range(6000):
    os.close(os.open(f'{d}/entry-{i:05d}-' + 'n' * (i % 90), os.O_CREAT | os.O_WRONLY, 0o644))
for i in range(0, 6000, 2):
    os.unlink(f'{d}/entry-{i:05d}-' + 'n' * (i % 90))
for i in range(1000):
    os.mkdir(f'{d}/late-{i}') if i % 10 == 0 else os.close(os.open(f'{d}/late-{i}', os.O_CREAT | os.O_WRONLY))
"
expect_eq "ls -f counts every entry" "$(ls -f "$MNT/manydir" | wc -l)" 4002
expect_between "the directory's size: its blocks" "$(stat -c %s "$MNT/manydir")" $((40 * 4096)) $((200 * 4096))
expect_eq "link count: 100 subdirectories" "$(stat -c %h "$MNT/manydir")" 102

step "unmount, close, reopen: everything is there"
(cd "$MNT" && find . -path ./g/.git -prune -o -type f -print0 | sort -z | xargs -0 sha256sum) >"$T/sums"
(cd "$MNT" && find . | sort) >"$T/names"
fs_umount
USED=$(tarn fs list --json -p "$POOL" | jq -r '.[0].used')
expect_between "fs list usage covers the data (MiB)" $((USED >> 20)) 2 200
expect_eq "vol list shows no object" "$(tarn vol list --json -p "$POOL" | jq length)" 0
expect_eq "snap list shows nothing" "$(tarn snap list --json -p "$POOL" | jq length)" 0
expect_eq "pool status: [block volumes, file volumes]" "$(tarn pool status --json -p "$POOL" | jq -c '[.volumes, .file_volumes]')" "[0,1]"
pool_check "$POOL" "after the first session"
check "tarn fs check home clean" tarn fs check home -p "$POOL"
expect_between "fs check counts the inodes" "$(tarn fs check home --json -p "$POOL" | jq .inodes)" 5000 100000
start_serve "$POOL"
expect_eq "NBD exports: none (objects are not exports)" "$(nbdinfo --list --json "nbd://127.0.0.1:$SERVE_PORT" | jq '.exports | length')" 0
check_fails "mount while tarn serve holds the pool" tarn mount home "$MNT" -p "$POOL"
stop_serve
fs_mount home
check "sha256sum -c after remount" bash -c "cd '$MNT' && sha256sum --quiet -c '$T/sums'"
expect_eq "same names after remount" "$(cd "$MNT" && find . | sort | sha256sum)" "$(sha256sum <"$T/names")"
expect_eq "sqlite3 integrity_check after remount" "$(sqlite3 "$MNT/t.db" 'pragma integrity_check')" ok
expect_eq "special files after remount" "$(cd "$MNT/spc" && stat -c '%n %F %t:%T %a %u' * | sort)" "$SPECIAL"
check "rm -rf of everything" bash -c "rm -rf '$MNT'/* && [ -z \"\$(ls -A '$MNT')\" ]"
fs_umount
pool_check "$POOL" "after rm -rf"

step "SIGTERM unmounts cleanly; kill -9 keeps every fsync'd byte"
fs_mount home
echo synced >"$MNT/s1"
check "write + fsync" dd if=/dev/urandom of="$MNT/fsynced" bs=64k count=16 conv=fsync status=none
cp "$MNT/fsynced" "$T/fsynced"
kill -TERM "$MOUNT_PID"
rc=0; wait "$MOUNT_PID" || rc=$?
expect_eq "tarn mount exit status after SIGTERM" "$rc" 0
expect_eq "mount gone after SIGTERM" "$(mountpoint -q "$MNT" && echo mounted || echo gone)" gone
fs_mount home
expect_eq "a file closed before SIGTERM" "$(cat "$MNT/s1")" synced
check "write + fsync, then kill -9 of tarn mount" dd if=/dev/urandom of="$MNT/fsynced2" bs=64k count=16 conv=fsync status=none
cp "$MNT/fsynced2" "$T/fsynced2"
kill -KILL "$MOUNT_PID"; wait "$MOUNT_PID" 2>/dev/null || true
check_fails "the dead mount reports an error" ls "$MNT"
check "fusermount3 -u of the dead mount" fusermount3 -u "$MNT"
fs_mount home
check "fsync'd file after kill -9" cmp "$MNT/fsynced2" "$T/fsynced2"
check "fsync'd file of the session before" cmp "$MNT/fsynced" "$T/fsynced"
fs_umount
pool_check "$POOL" "after kill -9 and remount"
check "tarn fs check home clean after kill -9" tarn fs check home -p "$POOL"

step "close is committed by the periodic commit, fsync of the mount root commits all, --commit-interval 0 at close"
fs_mount home --commit-interval 3600
echo one >"$MNT/c1"
check "sync MOUNT (fsync of the root: FSYNCDIR)" sync "$MNT"
echo two >"$MNT/c2"
kill9_mount
fs_mount home --commit-interval 0
expect_eq "a file closed before sync MOUNT survives kill -9" "$(cat "$MNT/c1")" one
expect_eq "a file closed after it, with no commit since, does not" "$(ls "$MNT/c2" 2>&1 | grep -c 'No such file')" 1
echo three >"$MNT/c3"
kill9_mount
fs_mount home
expect_eq "with --commit-interval 0 a closed file survives kill -9" "$(cat "$MNT/c3")" three
fs_umount
check "tarn fs check home clean" tarn fs check home -p "$POOL"

step "destroy"
check "tarn fs destroy home" tarn fs destroy home -p "$POOL"
expect_eq "fs list empty" "$(tarn fs list --json -p "$POOL" | jq length)" 0
pool_check "$POOL" "after destroy"

step "a full pool is ENOSPC, a quota EDQUOT; deletes still work"
POOL=$T/small.img
make_pool "$POOL" 96M
check "tarn fs create q --quota 8M" tarn fs create q --quota 8M -p "$POOL"
check "tarn fs create full" tarn fs create full -p "$POOL"
fs_mount q
check_fails "writing 16 MiB under an 8 MiB quota" dd if=/dev/zero of="$MNT/f" bs=1M count=16 conv=fsync status=none
expect_eq "the error is EDQUOT" "$(printf '%s' "$LAST_OUT" | grep -c 'Disk quota exceeded')" 1
fs_umount
fs_mount full
check_fails "writing 200 MiB into a 96 MiB pool" dd if=/dev/urandom of="$MNT/f" bs=1M count=200 conv=fsync status=none
expect_eq "the error is ENOSPC" "$(printf '%s' "$LAST_OUT" | grep -c 'No space left on device')" 1
check "rm of the file that filled the pool" rm "$MNT/f"
check "write after rm" dd if=/dev/urandom of="$MNT/g" bs=1M count=8 conv=fsync status=none
# With the writeback cache the failed write-back of f is reported once
# more, by the mount's next syncfs (the kernel's per-superblock error
# sequence, as on any file system); the one after it is clean.
sync -f "$MNT" 2>/dev/null || true
check "sync after rm and a write" sync -f "$MNT"
fs_umount
pool_check "$POOL" "after ENOSPC"
e2e_finish
