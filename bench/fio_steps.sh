# Sourced by bench/layout.sh and bench/slow_disk.sh after targets.sh: the
# steps of a benchmark sequence on one target. Expects RAW, SYSPY,
# FIO_TARGET, SRV_PID from the caller.

evict() { # FILE
  "$SYSPY" -c 'import os,sys
fd=os.open(sys.argv[1],os.O_RDONLY); os.fdatasync(fd); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED); os.close(fd)' "$1"
}
stop_server() {
  [ -n "$SRV_PID" ] || return 0
  kill -TERM "$SRV_PID" 2>/dev/null || true
  local i; for i in $(seq 1 600); do kill -0 "$SRV_PID" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$SRV_PID" 2>/dev/null && kill -KILL "$SRV_PID"
  wait "$SRV_PID" 2>/dev/null || true
  SRV_PID=
}
RESULTS=$RAW/results.tsv
: >"$RESULTS"
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$RESULTS"; } # ROUND TARGET METRIC VALUE
fio_job() { # ROUND TARGET STEP fio-args...
  local r=$1 t=$2 step=$3; shift 3
  local js=$RAW/$t.r$r.$step.json
  timeout 900 fio --name="$step" "${FIO_TARGET[@]}" --numjobs=1 --output-format=json --output="$js" "$@" \
    >"$RAW/$t.r$r.$step.out" 2>&1 || { log "fio $step on $t failed: $(tail -2 "$RAW/$t.r$r.$step.out" | tr '\n' ' ')"; return 1; }
  "$SYSPY" - "$js" "$step" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
wrote = j["write"]["io_bytes"] > 0
d = j["write"] if wrote else j["read"]
print(d["iops"] if wrote and sys.argv[2] != "seqwrite" else d["bw_bytes"] / (1 << 20))
EOF
}

compact() { # ROUND TARGET: re-lay out the volume online, in MiB of volume per second
  local r=$1 t=$2 t0 t1
  t0=$(date +%s.%N)
  "$TARN" pool compact -p "$TGT_DIR/pool.img" --json >"$RAW/$t.r$r.compact.json" 2>"$RAW/$t.r$r.compact.err" ||
    { log "compact on $t failed: $(tail -2 "$RAW/$t.r$r.compact.err" | tr '\n' ' ')"; return 0; }
  t1=$(date +%s.%N)
  record "$r" "$t" compact_mibs "$("$SYSPY" -c "print($SIZE_B / (1 << 20) / ($t1 - $t0))")"
}

# rotate: ROUNDS rounds over TARGETS, the order rotating per round,
# `sequence ROUND TARGET` for each (the caller's).
rotate() {
  local r k t n
  read -r -a T_ARR <<<"$TARGETS"
  n=${#T_ARR[@]}
  for r in $(seq 1 "$ROUNDS"); do
    for k in $(seq 0 $((n - 1))); do
      t=${T_ARR[$(((r - 1 + k) % n))]}
      log "round $r: $t"
      sequence "$r" "$t"
    done
  done
}

# extents_per_gib POOL: the first volume's map entries per GiB of SIZE_B.
extents_per_gib() {
  local v
  v=$("$TARN" vol list -p "$1" --json | "$SYSPY" -c 'import json,sys;print(json.load(sys.stdin)[0]["extents"])') &&
    "$SYSPY" -c "print($v / ($SIZE_B / (1 << 30)))"
}
