# Sourced by the bench scripts: what each one's exit cleanup shares.

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
