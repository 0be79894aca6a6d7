# Shared by bench/run.sh and bench/layout.sh (sourced): logging, NBD
# readiness, and the targets. setup_<target> starts a server for a fresh
# volume of SIZE_B bytes in TGT_DIR and sets FIO_TARGET (fio options),
# SRV_PID (or empty) and URI. Expects TARN, TRANSPORT, SIZE_B, POOL_B,
# SYSPY and the array PIDS (servers to stop at exit) from the caller;
# TARN_SERVE_ARGS adds arguments to `tarn serve`.
log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
free_port() { "$SYSPY" -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
wait_nbd() { # URI PID
  local end=$((SECONDS + 30))
  while [ $SECONDS -lt $end ]; do
    kill -0 "$2" 2>/dev/null || return 1
    timeout 5 nbdinfo --size "$1" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  return 1
}
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true; }
hwm_kb() { awk '/^VmHWM/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

# --- targets: setup sets FIO_TARGET (fio options), SRV_PID, TGT_DIR ---------
listen_args() { # sets ADDR_URI_BASE and echo nothing
  if [ "$TRANSPORT" = unix ]; then SOCK=$TGT_DIR/nbd.sock; URI_BASE="nbd+unix:///%s?socket=$SOCK"
  else PORT=$(free_port); URI_BASE="nbd://127.0.0.1:$PORT/%s"; fi
}
setup_tarn() { # [extra pool create args]
  local pool=$TGT_DIR/pool.img TARN=${SETUP_TARN:-$TARN}
  timeout 120 "$TARN" pool create "$pool" --size "$POOL_B" "$@" >"$TGT_DIR/create.log" 2>&1
  timeout 120 "$TARN" vol create bench --size "$SIZE_B" -p "$pool" >>"$TGT_DIR/create.log" 2>&1
  listen_args
  if [ "$TRANSPORT" = unix ]; then
    # shellcheck disable=SC2086 # TARN_SERVE_ARGS: words on purpose
    "$TARN" serve -p "$pool" --listen "127.0.0.1:$(free_port)" --socket "$SOCK" ${TARN_SERVE_ARGS:-} >"$TGT_DIR/serve.log" 2>&1 &
  else
    # shellcheck disable=SC2086
    "$TARN" serve -p "$pool" --listen "127.0.0.1:$PORT" ${TARN_SERVE_ARGS:-} >"$TGT_DIR/serve.log" 2>&1 &
  fi
  SRV_PID=$!; PIDS+=("$SRV_PID")
  URI=$(printf "$URI_BASE" bench)
  wait_nbd "$URI" "$SRV_PID" || { cat "$TGT_DIR/serve.log" >&2; return 1; }
  FIO_TARGET=("--ioengine=nbd" "--uri=$URI")
}
# tarn without data checksums: the cost of checksums is tarn / tarn_nosum
setup_tarn_nosum() { setup_tarn --no-checksums; }
# another build of tarn (TARN_B), for before/after comparisons in one run
setup_tarn_b() { [ -x "${TARN_B:-}" ] || { log "TARN_B not set or not executable"; return 1; }; SETUP_TARN=$TARN_B setup_tarn; }
QEMU_AIO=io_uring
setup_qemu() {
  qemu-img create -q -f qcow2 "$TGT_DIR/disk.qcow2" "$SIZE_B"
  local aio
  for aio in $QEMU_AIO native; do
    listen_args
    if [ "$TRANSPORT" = unix ]; then set -- -k "$SOCK"; else set -- -b 127.0.0.1 -p "$PORT"; fi
    qemu-nbd -f qcow2 --cache=none --aio=$aio --discard=unmap -t -x bench "$@" "$TGT_DIR/disk.qcow2" >"$TGT_DIR/qemu-nbd.log" 2>&1 &
    SRV_PID=$!; PIDS+=("$SRV_PID")
    URI=$(printf "$URI_BASE" bench)
    if wait_nbd "$URI" "$SRV_PID"; then QEMU_AIO=$aio; break; fi
    log "qemu-nbd --aio=$aio failed: $(tail -2 "$TGT_DIR/qemu-nbd.log" | tr '\n' ' ')"
    kill "$SRV_PID" 2>/dev/null || true; wait "$SRV_PID" 2>/dev/null || true; SRV_PID=
  done
  [ -n "$SRV_PID" ] || return 1
  FIO_TARGET=("--ioengine=nbd" "--uri=$URI")
}
setup_nbdkit() {
  truncate -s "$SIZE_B" "$TGT_DIR/disk.raw"
  listen_args
  if [ "$TRANSPORT" = unix ]; then set -- -U "$SOCK"; else set -- -i 127.0.0.1 -p "$PORT"; fi
  nbdkit -f --exit-with-parent "$@" file "$TGT_DIR/disk.raw" >"$TGT_DIR/nbdkit.log" 2>&1 &
  SRV_PID=$!; PIDS+=("$SRV_PID")
  URI=$(printf "$URI_BASE" bench)
  wait_nbd "$URI" "$SRV_PID" || return 1
  FIO_TARGET=("--ioengine=nbd" "--uri=$URI")
}
RAW_ENGINE=
setup_raw() {
  truncate -s "$SIZE_B" "$TGT_DIR/disk.raw"
  if [ -z "$RAW_ENGINE" ]; then
    RAW_ENGINE=libaio
    fio --name=probe --ioengine=io_uring --direct=1 --filename="$TGT_DIR/disk.raw" --size=1M --rw=read \
      --bs=4k --output=/dev/null >/dev/null 2>&1 && RAW_ENGINE=io_uring
  fi
  SRV_PID=
  FIO_TARGET=("--ioengine=$RAW_ENGINE" "--direct=1" "--filename=$TGT_DIR/disk.raw")
}
