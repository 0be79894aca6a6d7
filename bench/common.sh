# Sourced by the bench scripts: what their set-up and exit cleanup share.

# stop_pids SECS PID...: SIGTERM every server still running, give each up
# to SECS seconds to exit (tarn drains and commits), then SIGKILL it.
stop_pids() {
  local secs=$1 p; shift
  for p in "$@"; do kill -0 "$p" 2>/dev/null && kill -TERM "$p"; done
  for p in "$@"; do
    for _ in $(seq 1 $((secs * 10))); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$p" 2>/dev/null && kill -KILL "$p"
    wait "$p" 2>/dev/null
  done
}

# need_tools NAME CMD...: stop with a hint when a command is missing.
need_tools() {
  local name=$1 c; shift
  for c in "$@"; do
    command -v "$c" >/dev/null || { echo "$name: $c is missing (bash scripts/deps.sh)" >&2; exit 1; }
  done
}

# work_dir DIR KIND: DIR and bench/results made; W a fresh work directory
# under DIR, OUT this run's table (bench/results/<date>-KIND.txt).
work_dir() {
  mkdir -p "$1" "$REPO/bench/results"
  W=$(mktemp -d "$1/w.XXXX")
  OUT="$REPO/bench/results/$(date -u +%Y-%m-%d-%H%M%S)-$2.txt"
}

# need_plots NAME: the plots beside the tables (bench/plots.py) need
# matplotlib in the system python; checked before a long run, not after.
need_plots() {
  /usr/bin/python3 -c 'import matplotlib' 2>/dev/null && return 0
  echo "$1: python3-matplotlib missing (the plots), run: bash scripts/deps.sh --bench" >&2
  exit 1
}

# plots KIND ARGS...: write the PNGs (a failed plot never loses the table).
plots() {
  /usr/bin/python3 "$BENCH/plots.py" "$@" || echo "plots: bench/plots.py $1 failed (the table above stands)" >&2
}

# per_target_setup: DIR and RAW made; PIDS (servers), SRV_PID and TGT_DIR
# (a target's own directory, $DIR/t.*) start empty; at exit every server
# still running is stopped and the target directories go.
per_target_setup() {
  mkdir -p "$DIR" "$RAW"
  PIDS=()
  SRV_PID=
  TGT_DIR=
  trap per_target_cleanup EXIT
  trap 'exit 130' INT TERM
}
per_target_cleanup() {
  set +e
  stop_pids 60 "${PIDS[@]}"
  rm -rf "$DIR"/t.*
}

# evict_files PATH...: write back each existing file and drop it from the
# page cache (fdatasync + POSIX_FADV_DONTNEED): only the files under test
# go cold; dropping the whole cache (echo 3 > drop_caches) disturbs every
# other user of the machine.
evict_files() {
  python3 -c "
import os, sys
for p in sys.argv[1:]:
    if os.path.isfile(p):
        fd = os.open(p, os.O_RDONLY)
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
" "$@" 2>/dev/null || true
}

# append_volume_served BIN DIR SIZE: in DIR a pool file 3x SIZE bytes with
# volume `bench` of SIZE, served by BIN with append placement and the idle
# compactor off (only `pool compact` moves data); SRV its pid, URI the
# volume's NBD address, once it answers.
append_volume_served() {
  local bin=$1 d=$2 size=$3 port
  "$bin" pool create "$d/pool.img" --size $((size * 3)) >/dev/null
  "$bin" vol create bench --size "$size" -p "$d/pool.img" >/dev/null
  port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
  "$bin" serve -p "$d/pool.img" --listen "127.0.0.1:$port" --placement append --compact-idle 0 >"$d/serve.log" 2>&1 &
  SRV=$!
  URI="nbd://127.0.0.1:$port/bench"
  for _ in $(seq 1 100); do nbdinfo --size "$URI" >/dev/null 2>&1 && break; sleep 0.1; done
}
