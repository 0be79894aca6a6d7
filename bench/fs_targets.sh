# Shared by bench/postmark.sh and bench/fs_app.sh: the three file-system
# targets of issue 15's benchmarks, each made fresh on $MNT by `setup
# KIND MODE` and removed by `teardown`:
#   tarnfs  a tarn file volume (`tarn mount`, FUSE); MODE ver adds the
#           close-version rule `*` (every file)
#   ext4nbd ext4 on a tarn block volume (`tarn serve`, nbdfuse + loop)
#   ext4raw ext4 on a loop device over a plain sparse file (the baseline)
#   tarnfsbase  as tarnfs, with the binary TARN_BASE (an A/B of two
#           builds in one run, alternating with the others)
#   tarnfsdev  as tarnfs, with `--fuse-uring off` (the /dev/fuse
#           transport: an A/B of the transports in one run; tarnfs takes
#           io_uring where the kernel offers it, see `fuse_transport`)
# and `ticker KIND` (MODE snap): a volume snapshot every SNAP_EVERY s, the
# last SNAP_KEEP kept. Needs TARN, DIR, SIZE, VOL_SIZE, PORT, SNAP_EVERY,
# SNAP_KEEP set by the caller.
# TARNFS_MOUNT_ARGS: more `tarn mount` arguments; default --no-discard,
# like for like with ext4raw and ext4nbd, whose ext4 mounts without `-o
# discard` (set it empty for tarn's default, a hole punched in the pool
# file per freed range: ARCHITECTURE.md *PostMark figures*).
TARNFS_MOUNT_ARGS=${TARNFS_MOUNT_ARGS---no-discard}
RUN=$DIR/run
MNT=$RUN/mnt
FUSE=$RUN/fuse
SRV= FUSE_PID= LOOP= MOUNT_PID= TICK=

teardown() {
  set +e
  [ -n "$TICK" ] && { kill "$TICK"; wait "$TICK"; TICK=; }
  # a snapshot's setfattr the ticker started may still be running (the
  # kill ends the ticker, not its child): the mount is busy until it ends
  local try
  for try in $(seq 50); do
    mountpoint -q "$MNT" || break
    if [ -n "$MOUNT_PID" ]; then fusermount3 -u "$MNT" 2>/dev/null && break; else umount "$MNT" 2>/dev/null && break; fi
    sleep 0.2
  done
  mountpoint -q "$MNT" && echo "teardown: $MNT still mounted" >&2
  [ -n "$MOUNT_PID" ] && { wait "$MOUNT_PID"; MOUNT_PID=; }
  [ -n "$LOOP" ] && { losetup -d "$LOOP"; LOOP=; }
  mountpoint -q "$FUSE" && fusermount3 -u "$FUSE"
  [ -n "$FUSE_PID" ] && { wait "$FUSE_PID"; FUSE_PID=; }
  [ -n "$SRV" ] && { kill -TERM "$SRV"; wait "$SRV"; SRV=; }
  rm -rf "$RUN"
  set -e
}

# fuse_transport: after a tarn mount's teardown, the requests it served
# through each FUSE transport (as `tarn mount` said at exit; "-" when it
# did not, an older binary)
fuse_transport() {
  local said
  said=$(sed -n 's/^tarn mount: fuse requests: //p' "$DIR/mount.log" 2>/dev/null)
  echo "${said:--}"
}

wait_for() { # TRIES CMD...: poll every 0.1 s
  local n=$1; shift
  for _ in $(seq 1 "$n"); do "$@" 2>/dev/null && return 0; sleep 0.1; done
  echo "postmark.sh: gave up waiting for: $*" >&2
  exit 1
}

# setup KIND MODE: a fresh file system on $MNT
setup() {
  rm -rf "$RUN"; mkdir -p "$MNT" "$FUSE"
  case $1 in
    ext4raw)
      truncate -s "$VOL_SIZE" "$RUN/raw.img"
      LOOP=$(losetup -f --show "$RUN/raw.img")
      mkfs.ext4 -q -F -b 4096 "$LOOP"
      mount "$LOOP" "$MNT" ;;
    ext4nbd)
      "$TARN" pool create "$RUN/pool.img" --size "$SIZE" >/dev/null
      "$TARN" vol create pm --size "$VOL_SIZE" -p "$RUN/pool.img" >/dev/null
      "$TARN" serve -p "$RUN/pool.img" --listen "127.0.0.1:$PORT" >"$DIR/serve.log" 2>&1 &
      SRV=$!
      wait_for 100 nbdinfo --can connect "nbd://127.0.0.1:$PORT/pm"
      nbdfuse "$FUSE/disk" "nbd://127.0.0.1:$PORT/pm" >"$DIR/nbdfuse.log" 2>&1 &
      FUSE_PID=$!
      wait_for 100 test -s "$FUSE/disk"
      LOOP=$(losetup -f --show "$FUSE/disk")
      mkfs.ext4 -q -F -b 4096 "$LOOP"
      mount "$LOOP" "$MNT" ;;
    tarnfs|tarnfsbase|tarnfsdev)
      local TARN=$TARN transport=
      [ "$1" = tarnfsbase ] && TARN=${TARN_BASE:?tarnfsbase needs TARN_BASE}
      [ "$1" = tarnfsdev ] && transport="--fuse-uring off"
      "$TARN" pool create "$RUN/pool.img" --size "$SIZE" >/dev/null
      "$TARN" fs create home -p "$RUN/pool.img" >/dev/null
      if [ "$2" = ver ]; then
        "$TARN" fs version-policy home add '*' -p "$RUN/pool.img" >/dev/null
      fi
      # shellcheck disable=SC2086 # TARNFS_MOUNT_ARGS, transport: words
      "$TARN" mount home "$MNT" -p "$RUN/pool.img" $TARNFS_MOUNT_ARGS $transport >"$DIR/mount.log" 2>&1 &
      MOUNT_PID=$!
      wait_for 100 mountpoint -q "$MNT" ;;
  esac
}

# ticker KIND: a volume snapshot every SNAP_EVERY s until killed, the
# last SNAP_KEEP kept (a rolling schedule: with every snapshot kept, all
# the data PostMark deletes stays and fills the pool)
ticker() {
  local n=0 old
  while sleep "$SNAP_EVERY"; do
    n=$((n + 1)) old=$((n - SNAP_KEEP))
    case $1 in
      tarnfs*) setfattr -n user.tarn.snapshot -v "pm$n" "$MNT" &&
        { [ "$old" -lt 1 ] || setfattr -n user.tarn.snapshot.delete -v "pm$old" "$MNT"; } ;;
      ext4nbd) "$TARN" snap create "pm@pm$n" -p "$RUN/pool.img" >/dev/null &&
        { [ "$old" -lt 1 ] || "$TARN" snap delete "pm@pm$old" -p "$RUN/pool.img" >/dev/null; } ;;
    esac || echo "snapshot $n failed" >&2
    echo "$n" >"$DIR/snaps"
  done
}

# The configurations of round R: LIST in order on odd rounds, reversed on
# even ones (alternating rounds), into the array ORDER.
round_order() {
  ORDER=("${LIST[@]}")
  if [ $(($1 % 2)) = 0 ]; then
    ORDER=(); for ((i = ${#LIST[@]} - 1; i >= 0; i--)); do ORDER+=("${LIST[$i]}"); done
  fi
}

# Median, min and max of the numbers on stdin (space separated).
stats() { tr ' ' '\n' | grep . | sort -n | awk '{ a[NR] = $1 } END { printf "%d %d %d\n", a[int((NR + 1) / 2)], a[1], a[NR] }'; }
