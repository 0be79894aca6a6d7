#!/usr/bin/env bash
# FUSE over io_uring (docs/ARCHITECTURE.md *FUSE transport*): a file
# volume mounted with `--fuse-uring on` serves a real workload through
# the per-CPU ring queues — create, write, fsync, read back, rename,
# unlink, xattrs, close versions (`foo@`), a kill -9 of the mount and a
# remount keeping every fsync'd byte — and says it used the ring. The
# fuse module's enable_uring is set to Y for the test and put back as it
# was. A kernel without the transport (before 6.14, or a fuse module
# without the parameter) FAILS the test; TARN_SKIP=fs_uring skips it on
# purpose. The other fs_* scripts run with whatever enable_uring is
# (`--fuse-uring auto`): run them with it N and Y to cover both
# transports.
. "$(dirname "$0")/lib.sh"
need fusermount3 mountpoint dd setfattr getfattr cmp
need_root "mounts a FUSE file system and sets the fuse module's enable_uring"
need_fuse
PARAM=/sys/module/fuse/parameters/enable_uring
[ -w "$PARAM" ] || cannot_run "$PARAM missing: the kernel has no FUSE over io_uring (Linux 6.14+)"
e2e_init fs_uring

OLD_URING=$(cat "$PARAM")
trap 'rc=$?; echo "$OLD_URING" >"$PARAM"; (exit $rc); e2e_cleanup' EXIT
echo Y >"$PARAM"

POOL=$T/pool.img
MNT=$T/mnt
mkdir -p "$MNT"
MOUNT_PID=
# said_transport: what the last `tarn mount` said at INIT
said_transport() { sed -n 's/^tarn mount: fuse transport: //p' "$T/mount.log" | tail -n 1; }
# ring_requests: the requests the last finished mount served through the ring
ring_requests() { sed -n 's/^tarn mount: fuse requests: \([0-9]*\) through io_uring.*/\1/p' "$T/mount.log" | tail -n 1; }

step "a workload through the ring"
make_pool "$POOL" 2G
check "tarn fs create home" tarn fs create home -p "$POOL"
check "policy add *.v (close versions)" tarn fs version-policy home add '*.v' -p "$POOL"
fs_mount home --fuse-uring on
expect_eq "the mount uses io_uring, one queue per CPU" "$(said_transport)" "io_uring, $(getconf _NPROCESSORS_CONF) queues"
check "8 MiB of random data, fsync'd" dd if=/dev/urandom of="$MNT/big" bs=1M count=8 conv=fsync status=none
cp "$MNT/big" "$T/big"
check "read back" cmp "$MNT/big" "$T/big"
mkdir -p "$MNT/d/e"
for i in $(seq 1 50); do echo "file $i" >"$MNT/d/e/f$i"; done
expect_eq "50 files listed" "$(ls "$MNT/d/e" | wc -l)" 50
check "rename" mv "$MNT/d/e/f1" "$MNT/d/renamed"
expect_eq "renamed content" "$(cat "$MNT/d/renamed")" "file 1"
check "unlink" rm "$MNT/d/e/f2"
check_fails "unlinked file is gone" cat "$MNT/d/e/f2"
check "setfattr user.k" setfattr -n user.k -v value "$MNT/d/renamed"
expect_eq "getfattr user.k" "$(getfattr --only-values -n user.k "$MNT/d/renamed")" value
echo one >"$MNT/doc.v"
echo two >"$MNT/doc.v"
expect_eq "close versions in doc.v@" "$(ls "$MNT/doc.v@" | wc -l)" 2
expect_eq "the first close version" "$(cat "$MNT/doc.v@/1")" one
check "truncate + write at an offset" bash -c "truncate -s 100000 '$MNT/sparse' && printf x | dd of='$MNT/sparse' bs=1 seek=70000 conv=notrunc,fsync status=none"
expect_eq "size after the sparse write" "$(stat -c %s "$MNT/sparse")" 100000
fs_umount
ring=$(ring_requests)
if [ "${ring:-0}" -gt 100 ]; then ok "requests served through the ring ($ring)"; else bad "requests through the ring: '${ring}'"; fi

step "kill -9 of a ring mount keeps every fsync'd byte"
fs_mount home --fuse-uring on
expect_eq "remounted on the ring" "$(said_transport)" "io_uring, $(getconf _NPROCESSORS_CONF) queues"
check "data after remount" cmp "$MNT/big" "$T/big"
check "write + fsync, then kill -9 of tarn mount" dd if=/dev/urandom of="$MNT/fsynced" bs=64k count=16 conv=fsync status=none
cp "$MNT/fsynced" "$T/fsynced"
kill -KILL "$MOUNT_PID"; wait "$MOUNT_PID" 2>/dev/null || true
check_fails "the dead mount reports an error" ls "$MNT"
check "fusermount3 -u of the dead mount" fusermount3 -u "$MNT"
fs_mount home --fuse-uring on
check "fsync'd file after kill -9" cmp "$MNT/fsynced" "$T/fsynced"
expect_eq "xattr after kill -9" "$(getfattr --only-values -n user.k "$MNT/d/renamed")" value
fs_umount
fs_clean "after kill -9 and remount"

step "--fuse-uring off and on without the module's consent"
fs_mount home --fuse-uring off
expect_eq "off: /dev/fuse" "$(said_transport)" "/dev/fuse"
check "data through /dev/fuse" cmp "$MNT/big" "$T/big"
fs_umount
echo N >"$PARAM"
check_fails "on, with enable_uring=N: refused" tarn mount home "$MNT" -p "$POOL" --fuse-uring on
refusal=$(tarn mount home "$MNT" -p "$POOL" --fuse-uring on 2>&1 || true)
case $refusal in
  *"mounted file volume"*) bad "on, with enable_uring=N: said 'mounted' before refusing: $refusal" ;;
  *enable_uring*) ok "on, with enable_uring=N: the refusal alone, naming enable_uring" ;;
  *) bad "on, with enable_uring=N: refusal does not name enable_uring: $refusal" ;;
esac
expect_eq "nothing mounted" "$(mountpoint -q "$MNT" && echo mounted || echo none)" none
fs_mount home
expect_eq "auto, with enable_uring=N: /dev/fuse" "$(said_transport | cut -d' ' -f1)" "/dev/fuse"
case $(said_transport) in
  *"enable_uring"*) ok "auto, with enable_uring=N: the mount says how to turn the ring on" ;;
  *) bad "auto, with enable_uring=N: no hint about enable_uring in '$(said_transport)'" ;;
esac
fs_umount
fs_clean "at the end"
e2e_finish
