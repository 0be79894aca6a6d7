# Shared by the file-volume benches (fs_versions.sh, fs_close_versions.sh):
# a work dir with a pool file and a mount point, cleaned up at exit (the
# mount too), and helpers to time, take medians, read pool usage and
# mount / unmount the file volume `home`. Source it, then call
# `fs_bench_setup TAG` (needs TARN).
fs_bench_setup() {
  W=$(mktemp -d "/var/tmp/tarn-bench-$1.XXXXXX")
  POOL=$W/pool.img
  MNT=$W/mnt
  mkdir -p "$MNT"
  PID=
  trap fs_bench_cleanup EXIT
}
fs_bench_cleanup() {
  mountpoint -q "$MNT" && fusermount3 -u "$MNT"
  [ -n "$PID" ] && wait "$PID" 2>/dev/null
  rm -rf "$W"
}

now() { date +%s%N; }
median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
used() { "$TARN" pool status --json -p "$POOL" | jq .used; }
meta() { "$TARN" pool status --json -p "$POOL" | jq .metadata; }

mount_fs() {
  "$TARN" mount home "$MNT" -p "$POOL" >>"$W/mount.log" 2>&1 &
  PID=$!
  for _ in $(seq 1 100); do mountpoint -q "$MNT" && return 0; sleep 0.1; done
  echo "mount did not come up" >&2
  exit 1
}
umount_fs() {
  fusermount3 -u "$MNT"
  wait "$PID"
  PID=
}
