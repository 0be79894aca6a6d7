# shellcheck shell=bash
# Shared helpers for tarn end-to-end tests. Source it from a test script:
#   . "$(dirname "$0")/lib.sh"; e2e_init NAME
# Env:
#   TARN=path        tarn binary (default target/release/tarn)
#   E2E_KEEP=1       keep the temp dir (always kept, minus big images, on failure)
#   E2E_TMP=dir      where temp dirs go (default /var/tmp; must not be tmpfs for
#                    fstrim/allocation numbers to mean anything)
#   TARN_SKIP=a,b    scripts (NAME) or parts of scripts (NAME:PART) to skip on
#                    purpose. A script that cannot run here (a tool, root,
#                    /dev/fuse, a loop device missing) FAILS unless TARN_SKIP
#                    names it: then it exits 77 (E2E_SKIP_EXIT) and
#                    scripts/test.sh lists it as SKIPPED, never as passed.
#   TARN_SKIP_REPORT=file  where skips are appended as "NAME<TAB>REASON"
#                    (set by scripts/test.sh to build its summary)
set -euo pipefail

E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$E2E_DIR/../.." && pwd)
TARN=${TARN:-$REPO/target/release/tarn}
# the libnbd python binding is only in the system python; a pyenv python3 may
# shadow it on PATH, so call it explicitly
SYSPY=/usr/bin/python3
nbdsh() { PATH=/usr/bin:$PATH command nbdsh "$@"; }
export LC_ALL=C

# the script's own name until e2e_init sets it, so that prerequisite checks
# before e2e_init can name the test that cannot run
E2E_NAME=$(basename "$0" .sh)
E2E_SKIP_EXIT=77
T=
E2E_PASS=0
E2E_FAIL=0
E2E_FAILED=()
E2E_PIDS=()
E2E_MOUNTS=()
E2E_LOOPS=()
E2E_FUSE=()
SERVE_PID=
SERVE_PORT=
SERVE_SOCK=
SERVE_POOL=
SERVE_LOG=

say()  { printf '%s\n' "$*"; }
step() { printf '\n== %s\n' "$*"; }
ok()   { E2E_PASS=$((E2E_PASS + 1)); printf '  ok   %s\n' "$*"; }
bad()  { E2E_FAIL=$((E2E_FAIL + 1)); E2E_FAILED+=("$*"); printf '  FAIL %s\n' "$*"; }
die()  { bad "$*"; say "aborting $E2E_NAME: $*"; exit 1; }

# check DESC CMD...: run CMD, record pass/fail, show the output tail on failure
check() {
  local desc=$1; shift
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  if [ $rc -eq 0 ]; then ok "$desc"; else
    bad "$desc (exit $rc: $(printf '%q ' "$@" | cut -c1-200))"
    printf '%s\n' "$out" | tail -n 15 | sed 's/^/       | /'
  fi
  return 0
}
# check_fails DESC CMD...: CMD must exit non-zero; its output is kept in $LAST_OUT
LAST_OUT=
LAST_RC=0
check_fails() {
  local desc=$1; shift
  LAST_RC=0
  LAST_OUT=$("$@" 2>&1) || LAST_RC=$?
  if [ $LAST_RC -ne 0 ]; then ok "$desc (exit $LAST_RC: $(printf '%s' "$LAST_OUT" | tr '\n' ' ' | cut -c1-160))"
  else
    bad "$desc: expected failure but exit 0 ($(printf '%q ' "$@" | cut -c1-200))"
    printf '%s\n' "$LAST_OUT" | tail -n 10 | sed 's/^/       | /'
  fi
  return 0
}
# expect_eq DESC GOT WANT
expect_eq() { if [ "$2" = "$3" ]; then ok "$1 ($2)"; else bad "$1: got '$2', want '$3'"; fi; }
# expect_between DESC VALUE LO HI (integers)
expect_between() {
  if [ "$2" -ge "$3" ] && [ "$2" -le "$4" ]; then ok "$1 ($2 in [$3, $4])"
  else bad "$1: $2 not in [$3, $4]"; fi
}

# skip_requested ID: TARN_SKIP (comma-separated) names ID
skip_requested() { [[ ",${TARN_SKIP:-}," == *",$1,"* ]]; }

# record_skip ID REASON: print and report a skip that TARN_SKIP asked for
record_skip() {
  say "SKIPPED $1 ($2)"
  if [ -n "${TARN_SKIP_REPORT:-}" ]; then printf '%s\t%s\n' "$1" "$2" >>"$TARN_SKIP_REPORT"; fi
}

# skip_exit REASON: end the script as skipped (only when TARN_SKIP names it)
E2E_SKIPPING=0
skip_exit() {
  record_skip "$E2E_NAME" "$1"
  E2E_SKIPPING=1
  exit $E2E_SKIP_EXIT
}

# cannot_run REASON: a prerequisite of this script is missing. That is a
# failure (a test that cannot run never passes), unless TARN_SKIP names the
# script: then it is a skip with its own exit code.
cannot_run() {
  if skip_requested "$E2E_NAME"; then skip_exit "$1"; fi
  say "FAIL $E2E_NAME: cannot run: $1 (TARN_SKIP=$E2E_NAME skips it on purpose)"
  exit 1
}

# missing_tools TOOL...: prints the tools that are not on PATH (nothing if all are)
missing_tools() {
  local c missing=()
  for c in "$@"; do command -v "$c" >/dev/null 2>&1 || missing+=("$c"); done
  if [ ${#missing[@]} -gt 0 ]; then printf '%s\n' "${missing[*]}"; fi
}

need() {
  local missing
  missing=$(missing_tools "$@")
  if [ -n "$missing" ]; then cannot_run "required tool(s) missing: $missing (run scripts/deps.sh)"; fi
}

# need_root WHY: root is needed (loop devices, mount, drop_caches)
need_root() { [ "$(id -u)" = 0 ] || cannot_run "needs root ($1)"; }
need_fuse() { [ -c /dev/fuse ] || cannot_run "/dev/fuse is not available"; }
need_loop() { losetup -f >/dev/null 2>&1 || cannot_run "no free loop device (losetup -f failed)"; }
need_pynbd() { "$SYSPY" -c 'import nbd' 2>/dev/null || cannot_run "python3-libnbd missing for $SYSPY (run scripts/deps.sh)"; }

# part_runs PART MISSING: whether the optional PART of this script runs.
# MISSING names a missing prerequisite (empty: none). TARN_SKIP=NAME:PART
# skips the part (reported as SKIPPED); otherwise a missing prerequisite is
# a recorded failure and the part does not run.
part_runs() {
  local id=$E2E_NAME:$1
  if skip_requested "$id"; then record_skip "$id" "${2:-TARN_SKIP names it}"; return 1; fi
  [ -n "$2" ] || return 0
  bad "cannot run $id: $2 (TARN_SKIP=$id skips it on purpose)"
  return 1
}

e2e_init() {
  E2E_NAME=$1
  # what this library itself uses (start_serve, vol_query, free_port)
  need nbdinfo jq timeout
  [ -x "$SYSPY" ] || cannot_run "$SYSPY missing"
  # after every prerequisite check (the script's come before e2e_init), so
  # that a skip names what is missing when something is
  if skip_requested "$E2E_NAME"; then skip_exit "TARN_SKIP names it"; fi
  [ -x "$TARN" ] || { say "FAIL $E2E_NAME: tarn binary $TARN not found (cargo build --release -p tarn-cli)"; exit 1; }
  local base=${E2E_TMP:-/var/tmp}
  T=$(mktemp -d "$base/tarn-e2e-$E2E_NAME.XXXXXX")
  trap e2e_cleanup EXIT
  trap 'say "interrupted"; exit 130' INT TERM
  say "### e2e $E2E_NAME (tarn: $TARN, dir: $T)"
}

e2e_cleanup() {
  local rc=$? p m l i
  set +e
  # a command that happens to exit 77 under set -e is a failure, not a
  # skip; so is a skip after checks already failed
  if [ $rc -eq $E2E_SKIP_EXIT ] && { [ $E2E_SKIPPING != 1 ] || [ $E2E_FAIL -ne 0 ]; }; then rc=1; fi
  for m in "${E2E_MOUNTS[@]}"; do mountpoint -q "$m" && { umount "$m" 2>/dev/null || umount -l "$m"; }; done
  for l in "${E2E_LOOPS[@]}"; do losetup "$l" >/dev/null 2>&1 && losetup -d "$l"; done
  for m in "${E2E_FUSE[@]}"; do mountpoint -q "$m" && { fusermount3 -u "$m" 2>/dev/null || fusermount3 -uz "$m"; }; done
  for p in "${E2E_PIDS[@]}"; do kill -0 "$p" 2>/dev/null && kill -TERM "$p" 2>/dev/null; done
  for p in "${E2E_PIDS[@]}"; do
    for i in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  if [ $rc -ne 0 ] || [ $E2E_FAIL -ne 0 ]; then
    for l in "$T"/*.log; do
      [ -s "$l" ] || continue
      say "--- last lines of $l"; tail -n 25 "$l" | sed 's/^/  /'
    done
  fi
  if [ -n "$T" ] && [ -d "$T" ]; then
    if [ "${E2E_KEEP:-0}" = 1 ]; then say "kept $T"
    elif [ $rc -ne 0 ] || [ $E2E_FAIL -ne 0 ]; then
      find "$T" -type f -size +1M -delete 2>/dev/null; say "kept logs in $T"
    else rm -rf "$T"; fi
  fi
  if [ $rc -eq 0 ] && [ $E2E_FAIL -ne 0 ]; then rc=1; fi
  say "### $E2E_NAME: $E2E_PASS checks passed, $E2E_FAIL failed"
  if [ $E2E_FAIL -ne 0 ]; then printf '    failed: %s\n' "${E2E_FAILED[@]}"; fi
  exit $rc
}

# e2e_finish: end of a script (exit code reflects recorded failures)
e2e_finish() { exit 0; }

bg() { "$@" & E2E_PIDS+=($!); }

free_port() {
  "$SYSPY" -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'
}

# wait_until SECONDS CMD...: poll CMD every 0.2s
wait_until() {
  local secs=$1; shift
  local end=$((SECONDS + secs))
  while [ $SECONDS -lt $end ]; do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  return 1
}

tarn() { timeout 120 "$TARN" "$@"; }

# make_pool PATH SIZE
make_pool() {
  check "tarn pool create $(basename "$1") --size $2" tarn pool create "$1" --size "$2"
  [ -e "$1" ] || die "pool $1 was not created"
}
# make_vol POOL NAME SIZE
make_vol() {
  local out
  out=$(tarn vol create "$2" --size "$3" -p "$1" 2>&1) || die "tarn vol create $2 --size $3 failed: $out"
  ok "tarn vol create $2 --size $3"
}

uri()      { echo "nbd://127.0.0.1:$SERVE_PORT/$1"; }
uri_unix() { echo "nbd+unix:///$1?socket=$SERVE_SOCK"; }

# start_serve POOL [extra serve args]: background `tarn serve`, wait until it answers
start_serve() {
  SERVE_POOL=$1; shift
  SERVE_PORT=$(free_port)
  SERVE_SOCK=$T/nbd.sock
  SERVE_LOG=$T/serve.log
  rm -f "$SERVE_SOCK"
  echo "--- tarn serve -p $SERVE_POOL --listen 127.0.0.1:$SERVE_PORT --socket $SERVE_SOCK $* ($(date +%T))" >>"$SERVE_LOG"
  "$TARN" serve -p "$SERVE_POOL" --listen "127.0.0.1:$SERVE_PORT" --socket "$SERVE_SOCK" "$@" >>"$SERVE_LOG" 2>&1 &
  SERVE_PID=$!
  E2E_PIDS+=("$SERVE_PID")
  local end=$((SECONDS + 30))
  while :; do
    if ! kill -0 "$SERVE_PID" 2>/dev/null; then
      local rc=0; wait "$SERVE_PID" || rc=$?; SERVE_PID=
      die "tarn serve exited during startup (exit $rc): $(tail -n 3 "$SERVE_LOG" | tr '\n' ' ')"
    fi
    if timeout 5 nbdinfo --list "nbd://127.0.0.1:$SERVE_PORT" >/dev/null 2>&1 &&
       [ -S "$SERVE_SOCK" ] && timeout 5 nbdinfo --list "nbd+unix://?socket=$SERVE_SOCK" >/dev/null 2>&1; then
      break
    fi
    [ $SECONDS -lt $end ] || die "tarn serve did not answer nbdinfo --list on 127.0.0.1:$SERVE_PORT and $SERVE_SOCK within 30s"
    sleep 0.2
  done
  say "  tarn serve up: pid $SERVE_PID, nbd://127.0.0.1:$SERVE_PORT, socket $SERVE_SOCK"
}

# stop_serve [TIMEOUT]: SIGTERM, wait; records a check that it exited 0 in time
stop_serve() {
  local secs=${1:-60} rc=0 i
  [ -n "$SERVE_PID" ] || return 0
  kill -TERM "$SERVE_PID" 2>/dev/null || true
  for i in $(seq 1 $((secs * 10))); do kill -0 "$SERVE_PID" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$SERVE_PID" 2>/dev/null; then
    bad "tarn serve still running ${secs}s after SIGTERM; killing it"
    kill -KILL "$SERVE_PID"; wait "$SERVE_PID" 2>/dev/null || true
  else
    wait "$SERVE_PID" || rc=$?
    expect_eq "tarn serve exit status after SIGTERM" "$rc" 0
  fi
  SERVE_PID=
}

# kill9_serve: SIGKILL without any chance to commit
kill9_serve() {
  [ -n "$SERVE_PID" ] || return 0
  kill -KILL "$SERVE_PID" 2>/dev/null || true
  wait "$SERVE_PID" 2>/dev/null || true
  SERVE_PID=
}

# vol_query POOL: sets VOL_JSON to `tarn vol list --json` (queried live over
# the control socket while serving). If the live query fails that is recorded
# once as a failure, and the server is stopped, queried offline and restarted.
# (Never call these in $(...): they record checks and may restart the server.)
VOL_LIVE_FAILED=0
VOL_JSON=
vol_query() {
  local pool=$1 out
  if out=$(timeout 30 "$TARN" vol list -p "$pool" --json 2>&1) && printf '%s' "$out" | jq -e 'type == "array"' >/dev/null 2>&1; then
    VOL_JSON=$out; return 0
  fi
  if [ -n "$SERVE_PID" ]; then
    if [ $VOL_LIVE_FAILED = 0 ]; then
      bad "tarn vol list --json while serving: $(printf '%s' "$out" | tr '\n' ' ' | cut -c1-200)"
      VOL_LIVE_FAILED=1
    fi
    stop_serve
    out=$(timeout 30 "$TARN" vol list -p "$pool" --json 2>&1) || out=
    start_serve "$pool"
  fi
  if printf '%s' "$out" | jq -e 'type == "array"' >/dev/null 2>&1; then VOL_JSON=$out; return 0; fi
  bad "tarn vol list --json -p $pool: $(printf '%s' "$out" | tr '\n' ' ' | cut -c1-200)"
  VOL_JSON='[]'
  return 1
}
# vol_get POOL NAME FIELD: sets VAL (-1 if unknown)
VAL=
vol_get() {
  vol_query "$1" || true
  VAL=$(printf '%s' "$VOL_JSON" | jq -r --arg n "$2" --arg f "$3" '.[] | select(.name == $n) | .[$f]' 2>/dev/null | head -n1)
  [[ "$VAL" =~ ^[0-9]+$ ]] || { bad "tarn vol list --json: no numeric '$3' for volume '$2' in: $(printf '%s' "$VOL_JSON" | cut -c1-200)"; VAL=-1; }
}

mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

# pool_check POOL: `tarn pool check` must exit 0
# fs_clean WHEN: `tarn fs check home` and `tarn pool check` of $POOL are clean
fs_clean() {
  check "tarn fs check home clean ($1)" tarn fs check home -p "$POOL"
  pool_check "$POOL" "$1"
}

pool_check() {
  local out rc=0
  out=$(timeout 300 "$TARN" pool check -p "$1" 2>&1) || rc=$?
  if [ $rc -eq 0 ]; then ok "tarn pool check clean${2:+ ($2)}"
  else
    bad "tarn pool check${2:+ ($2)} exit $rc"
    printf '%s\n' "$out" | tail -n 20 | sed 's/^/       | /'
  fi
}

# The kernel as an NBD client without the nbd module: nbdfuse exposes
# export VOL as the file $FUSE/disk, losetup makes it the block device
# $LOOP. The caller sets FUSE and MNT (directories); fuse_detach unmounts
# $MNT if mounted and tears everything down.
LOOP=
FUSE_PID=
fuse_attach() { # VOL SIZE_BYTES
  nbdfuse "$FUSE/disk" "$(uri "$1")" >>"$T/nbdfuse.log" 2>&1 &
  FUSE_PID=$!
  E2E_PIDS+=("$FUSE_PID"); E2E_FUSE+=("$FUSE")
  wait_until 20 test -s "$FUSE/disk" || die "nbdfuse did not expose $FUSE/disk within 20s"
  local sz; sz=$(stat -c %s "$FUSE/disk")
  expect_eq "nbdfuse file size" "$sz" "$2"
  LOOP=$(losetup -f --show "$FUSE/disk") || die "losetup of the nbdfuse file failed"
  E2E_LOOPS+=("$LOOP")
  say "  attached: nbdfuse pid $FUSE_PID, $FUSE/disk -> $LOOP"
}
fuse_detach() {
  sync
  if mountpoint -q "$MNT"; then check "umount" umount "$MNT"; fi
  [ -n "$LOOP" ] && { blockdev --flushbufs "$LOOP" 2>/dev/null || true; check "losetup -d $LOOP" losetup -d "$LOOP"; LOOP=; }
  if mountpoint -q "$FUSE"; then check "fusermount3 -u" fusermount3 -u "$FUSE"; fi
  if [ -n "$FUSE_PID" ]; then
    local i; for i in $(seq 1 100); do kill -0 "$FUSE_PID" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$FUSE_PID" 2>/dev/null && { bad "nbdfuse still running 10s after unmount"; kill "$FUSE_PID"; }
    wait "$FUSE_PID" 2>/dev/null || true
    FUSE_PID=
  fi
}

# File volumes (tarn mount), with the caller's POOL and MNT:
# fs_mount NAME [OPTION...]: `tarn mount` in the background until the mount is up
fs_mount() {
  local said
  said=$(grep -c "fuse transport:" "$T/mount.log" 2>/dev/null) || true
  "$TARN" mount "$1" "$MNT" -p "$POOL" "${@:2}" >>"$T/mount.log" 2>&1 &
  MOUNT_PID=$!
  E2E_PIDS+=("$MOUNT_PID")
  E2E_FUSE+=("$MNT")
  wait_until 30 mountpoint -q "$MNT" || die "tarn mount $1 did not come up: $(tail -n 3 "$T/mount.log" | tr '\n' ' ')"
  ok "tarn mount $1"
  fs_transport_follows_module "${said:-0}" "${@:2}"
}
# fs_transport_follows_module SAID ARGS: without --fuse-uring, the mount
# took the transport the fuse module's enable_uring allows (the test
# command runs the file volume scenarios with it N, then Y): SAID is the
# count of "fuse transport:" lines in mount.log before this mount.
fs_transport_follows_module() {
  local said=$1 want=/dev/fuse param=/sys/module/fuse/parameters/enable_uring
  [[ " ${*:2} " == *" --fuse-uring "* ]] && return 0
  [ -r "$param" ] && [ "$(cat "$param")" = Y ] && want="io_uring"
  wait_until 10 test "$(grep -c "fuse transport:" "$T/mount.log")" -gt "$said" ||
    die "tarn mount did not say its FUSE transport"
  expect_eq "FUSE transport (enable_uring $(cat "$param" 2>/dev/null))" \
    "$(sed -n 's/^tarn mount: fuse transport: \([^ ,]*\).*/\1/p' "$T/mount.log" | tail -n 1)" "$want"
}
# pyx CODE: python with os imported; err(f) runs f and prints ok or the
# errno's name (what a syscall on the mount answered)
pyx() { "$SYSPY" -c "import os, errno
def err(f):
    try:
        f(); print('ok')
    except OSError as e: print(errno.errorcode[e.errno])
$1"; }
# fs_umount: unmount; `tarn mount` then commits, closes the pool and exits 0
# kill9_mount: SIGKILL of `tarn mount` (no final commit), then the dead
# mount is unmounted (a check).
kill9_mount() {
  kill -KILL "$MOUNT_PID"; wait "$MOUNT_PID" 2>/dev/null || true
  MOUNT_PID=
  check "fusermount3 -u of the dead mount" fusermount3 -u "$MNT"
}

fs_umount() {
  local rc=0
  check "fusermount3 -u" fusermount3 -u "$MNT"
  wait "$MOUNT_PID" || rc=$?
  expect_eq "tarn mount exit status after unmount" "$rc" 0
  MOUNT_PID=
}

# ceph_cluster_start [ON_EXIT]: a throwaway single-node Ceph cluster
# (scripts/ceph.sh) in $T/ceph with a Ceph pool `tarn`, torn down at exit
# whatever happens (ON_EXIT runs first); exports CEPH_CONF and sets
# CEPHDIR. The cluster not starting is a failure of the script.
ceph_cluster_start() {
  CEPHDIR=$T/ceph
  trap "rc=\$?; $1; bash '$REPO/scripts/ceph.sh' stop '$CEPHDIR' >/dev/null 2>&1; (exit \$rc); e2e_cleanup" EXIT
  step "start a single-node Ceph cluster (scripts/ceph.sh)"
  CEPH_CONF=$(bash "$REPO/scripts/ceph.sh" start "$CEPHDIR" tarn 2>"$T/ceph-start.log") ||
    die "scripts/ceph.sh could not start the cluster: $(grep -m1 "^ceph.sh:" "$T/ceph-start.log" || tail -n 3 "$T/ceph-start.log")"
  export CEPH_CONF
}

# attach_error_device RAW [NBDKIT_ARGS...]: RAW (truncated to 256 MiB) served
# by nbdkit's error filter, reads failing with EIO while $RTRIG exists (more
# triggers in NBDKIT_ARGS), on $KIT_SOCK, exposed as the file $DEV by nbdfuse
# on $FUSE; sets KIT_PID and FUSE_PID (both stopped at the script's end)
attach_error_device() {
  local raw=$1; shift
  truncate -s 256M "$raw"
  rm -f "$RTRIG" "$KIT_SOCK"
  nbdkit --exit-with-parent -f -U "$KIT_SOCK" --filter=error file "$raw" \
    error=EIO error-pread-rate=100% error-pread-file="$RTRIG" "$@" >>"$T/nbdkit.log" 2>&1 &
  KIT_PID=$!
  E2E_PIDS+=("$KIT_PID")
  wait_until 20 test -S "$KIT_SOCK" || die "nbdkit did not create $KIT_SOCK within 20s"
  mkdir -p "$FUSE"
  nbdfuse "$DEV" --unix "$KIT_SOCK" >>"$T/nbdfuse.log" 2>&1 &
  FUSE_PID=$!
  E2E_PIDS+=("$FUSE_PID"); E2E_FUSE+=("$FUSE")
  wait_until 20 test -s "$DEV" || die "nbdfuse did not expose $DEV within 20s"
}
