#!/usr/bin/env bash
# Process-crash durability: rounds of writes/trims/zeroes each ended by a
# flush, then a stream of async writes with periodic flushes during which the
# server gets SIGKILL. `tarn pool check` must be clean on the crashed pool;
# after restart every flushed byte must read back identical, and sectors the
# crashed stream touched must hold either their durable content or some
# unflushed write (crashio.py verify). Three crash cycles, then a clean stop.
. "$(dirname "$0")/lib.sh"
need nbdcopy
need_pynbd
e2e_init crash_restart

CYCLES=${CRASH_CYCLES:-3}
POOL=$T/pool.img
VOL=crash
make_pool "$POOL" 2G
make_vol "$POOL" $VOL 256M
truncate -s 256M "$T/exp.img"   # a fresh thin volume reads as zeroes
CIO=("$SYSPY" "$E2E_DIR/crashio.py")
: >"$T/stream.log"

# read the whole export and check it against exp.img + the last stream's log
verify_readback() {
  local what=$1
  rm -f "$T/got.img" "$T/got-bs.img"
  # --no-extents: read every byte, so durability is judged on the data alone;
  # block status (which nbdcopy otherwise trusts to skip holes) is checked
  # separately below
  if ! timeout 300 nbdcopy --no-extents "$(uri $VOL)" "$T/got.img" >"$T/nbdcopy.log" 2>&1; then
    bad "$what: nbdcopy of the volume failed: $(tail -3 "$T/nbdcopy.log" | tr '\n' ' ')"; return 1
  fi
  if timeout 300 nbdcopy "$(uri $VOL)" "$T/got-bs.img" >>"$T/nbdcopy.log" 2>&1 && cmp -s "$T/got.img" "$T/got-bs.img"; then
    ok "$what: copy guided by block status == full read"
  else
    bad "$what: nbdcopy guided by block status differs from a full read (block status reports data as holes?): $(cmp "$T/got.img" "$T/got-bs.img" 2>&1 | head -1)"
  fi
  rm -f "$T/got-bs.img"
  if "${CIO[@]}" verify "$T/got.img" "$T/exp.img" "$T/stream.log" >"$T/verify.out" 2>&1; then
    ok "$what: $(tail -1 "$T/verify.out") ($(head -1 "$T/verify.out" | cut -d: -f2-))"
  else
    bad "$what: read-back does not match the flushed data"
    sed 's/^/       | /' "$T/verify.out" | tail -n 14
    # keep the evidence (sparse copies) for a look with E2E_KEEP=1
    local tag; tag=$(printf '%s' "$what" | tr -c 'a-zA-Z0-9' _ | cut -c1-40)
    cp --sparse=always "$T/exp.img" "$T/failed.$tag.exp.img"; cp --sparse=always "$T/got.img" "$T/failed.$tag.got.img"
    cp "$T/stream.log" "$T/failed.$tag.stream.log"
  fi
  # what survived becomes the new expected content
  cp --sparse=always "$T/got.img" "$T/exp.img"
  : >"$T/stream.log"
}

for cycle in $(seq 1 "$CYCLES"); do
  step "cycle $cycle/$CYCLES"
  start_serve "$POOL"
  [ "$cycle" -gt 1 ] && verify_readback "cycle $cycle: after SIGKILL + restart"
  if out=$(timeout 300 "${CIO[@]}" flushed "$(uri $VOL)" "$T/exp.img" $((cycle * 1000)) 4 2>&1); then
    ok "$out"
  else
    bad "flushed write rounds failed: $(printf '%s' "$out" | tail -3 | tr '\n' ' ')"
  fi
  # unflushed stream (over the unix socket), killed mid-flight
  timeout 120 "${CIO[@]}" stream "$(uri_unix $VOL)" "$T/stream.log" $((cycle * 1000 + 1)) 60 >"$T/stream.out" 2>&1 &
  SPID=$!; E2E_PIDS+=("$SPID")
  # kill somewhere after 1500-5500 streamed writes (many commits, journal turnover)
  want=$((1500 + RANDOM % 4000))
  end=$((SECONDS + 40))
  while [ $SECONDS -lt $end ] && kill -0 $SPID 2>/dev/null; do
    nw=$(grep -c '^W' "$T/stream.log" || true); nf=$(grep -c '^F' "$T/stream.log" || true)
    [ "$nw" -ge $want ] && [ "$nf" -ge 2 ] && break
    sleep 0.05
  done
  nw=$(grep -c '^W' "$T/stream.log" || true); nf=$(grep -c '^F' "$T/stream.log" || true)
  say "  killing tarn serve (pid $SERVE_PID) with SIGKILL after $nw streamed writes, $nf completed flushes"
  kill9_serve
  wait $SPID 2>/dev/null || true
  say "  $(tail -1 "$T/stream.out")"
  grep -q 'connection ended' "$T/stream.out" || bad "stream client did not see the connection end: $(tail -2 "$T/stream.out" | tr '\n' ' ')"
  [ "$nw" -ge 100 ] || bad "stream issued only $nw writes before the kill (server too slow / not writing?)"
  pool_check "$POOL" "cycle $cycle: right after SIGKILL, before restart"
done

step "final restart, verify, clean shutdown, verify again"
start_serve "$POOL"
verify_readback "after the last SIGKILL + restart"
cp --sparse=always "$T/exp.img" "$T/final.img"
stop_serve
pool_check "$POOL" "after clean SIGTERM shutdown"
start_serve "$POOL"
rm -f "$T/got.img"
check "nbdcopy after clean restart" timeout 300 nbdcopy --no-extents "$(uri $VOL)" "$T/got.img"
check "content identical across a clean restart" cmp "$T/final.img" "$T/got.img"
stop_serve
e2e_finish
