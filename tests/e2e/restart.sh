#!/usr/bin/env bash
# Restarts and upgrades that no client notices: a qemu-io client with
# reconnect-delay writes patterns and reads them back (-P) while `tarn serve`
# is restarted three times with its listening socket kept, and nothing it
# does fails:
#  - socket activation: the socket held as systemd's socket unit holds it
#    (sockholder.py: LISTEN_FDS/LISTEN_PID/LISTEN_FDNAMES, SIGTERM, wait,
#    start again; as `systemctl restart tarn@NAME` with tarn@.socket);
#  - takeover: `tarn serve --takeover` takes the sockets (TCP and Unix)
#    from the running server, which drains, commits and exits; the third
#    takeover is an upgrade, a copy of the binary at another path.
# Then every region written reads back with its pattern, the pool checks
# clean, a second server on a held pool waits a bounded time and fails
# with a clear error, not touching the running one, and a server started
# while the lock is still held (as by a predecessor's final commit) waits
# for it and serves.
. "$(dirname "$0")/lib.sh"
need qemu-io flock
e2e_init restart

POOL=$T/pool.img
VOL=disk0
ROUNDS=${RESTART_ROUNDS:-90}      # per client run; a round is 256 KiB written and read back
REGION=262144
make_pool "$POOL" 1G
make_vol "$POOL" $VOL 128M

# client LOG FIRST: ROUNDS rounds from region FIRST on; a write, a read
# with the pattern check, a 100 ms pause; reconnect-delay 30 s
client() {
  local log=$1 first=$2 r cmds=()
  for r in $(seq "$first" $((first + ROUNDS - 1))); do
    cmds+=(-c "write -P $((r % 250 + 1)) $((r * REGION)) 256k" -c "read -P $((r % 250 + 1)) $((r * REGION)) 256k" -c "sleep 100")
  done
  timeout 300 qemu-io --image-opts \
    "driver=nbd,server.type=inet,server.host=127.0.0.1,server.port=$PORT,export=$VOL,reconnect-delay=30" \
    "${cmds[@]}" >"$log" 2>&1
}
# client_ok WHAT LOG RC: exit 0, every write and read done, no error line
client_ok() {
  local what=$1 log=$2 rc=$3 wrote readb errs
  wrote=$(grep -c '^wrote 262144/262144' "$log" || true)
  readb=$(grep -c '^read 262144/262144' "$log" || true)
  errs=$(grep -ciE 'fail|error|mismatch' "$log" || true)
  if [ "$rc" = 0 ] && [ "$wrote" = "$ROUNDS" ] && [ "$readb" = "$ROUNDS" ] && [ "$errs" = 0 ]; then
    ok "$what: qemu-io exit 0, $wrote writes and $readb verified reads, no error"
  else
    bad "$what: qemu-io exit $rc, $wrote/$ROUNDS writes, $readb/$ROUNDS reads, $errs error lines: $(grep -iE 'fail|error|mismatch' "$log" | sort | uniq -c | head -3 | tr '\n' ' ')"
  fi
}
# sessions LOG: how many times a client opened the export in that log
sessions() { grep -c "export \\\\\"$VOL\\\\\" selected" "$1" || true; }

step "socket activation: three restarts while the socket is held (as tarn@.socket)"
PORT=$(free_port)
ALOG=$T/activated.log
"$SYSPY" "$E2E_DIR/sockholder.py" "$PORT" 3 2.5 -- "$TARN" serve -p "$POOL" --log-level info >"$T/holder.out" 2>"$ALOG" &
HOLDER=$!; E2E_PIDS+=("$HOLDER")
# (a socket nobody accepts on queues a client forever: hence the timeouts)
wait_until 30 timeout 5 nbdinfo --list "nbd://127.0.0.1:$PORT" || die "no server on the held socket within 30 s: $(tail -3 "$ALOG" | tr '\n' ' ')"
rc=0; client "$T/client-a.log" 1 || rc=$?
client_ok "three restarts of a socket-activated server" "$T/client-a.log" $rc
kill -TERM "$HOLDER"; wait "$HOLDER" || true
expect_eq "servers started on the held socket" "$(grep -c '^start ' "$T/holder.out")" 4
expect_eq "servers that exited 0 after SIGTERM" "$(grep -c '^exit [0-9]* 0$' "$T/holder.out")" 4
expect_eq "servers that took the socket from LISTEN_FDS" "$(grep -c 'socket activation: 1 listening socket' "$ALOG")" 4
n=$(sessions "$ALOG")
if [ "$n" -ge 4 ]; then ok "the client reconnected to every server ($n sessions)"; else bad "the client opened the export $n times, want >= 4 (restarts not during its run?)"; fi
check_fails "the socket is closed once its holder exits" timeout 5 nbdinfo --list "nbd://127.0.0.1:$PORT"

step "takeover: three restarts without systemd, the last an upgrade"
start_serve "$POOL" --log-level info
PORT=$SERVE_PORT
mkdir -p "$T/upgrade"
cp "$TARN" "$T/upgrade/tarn-next"
client "$T/client-b.log" $((ROUNDS + 1)) & CLIENT=$!
for i in 1 2 3; do
  sleep 2.5
  bin=$TARN; [ "$i" = 3 ] && bin=$T/upgrade/tarn-next
  old=$SERVE_PID
  echo "--- takeover $i by $bin ($(date +%T))" >>"$SERVE_LOG"
  "$bin" serve -p "$POOL" --takeover --log-level info >>"$SERVE_LOG" 2>&1 &
  SERVE_PID=$!; E2E_PIDS+=("$SERVE_PID")
  rc=0; for _ in $(seq 1 300); do kill -0 "$old" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$old" 2>/dev/null; then bad "takeover $i: the old server $old still runs 30 s later"; continue; fi
  wait "$old" || rc=$?
  expect_eq "takeover $i: the old server exited" "$rc" 0
  kill -0 "$SERVE_PID" 2>/dev/null && ok "takeover $i: the new server $SERVE_PID runs ($(basename "$bin"))" \
    || bad "takeover $i: the new server exited: $(tail -3 "$SERVE_LOG" | tr '\n' ' ')"
done
rc=0; wait $CLIENT || rc=$?
client_ok "three takeovers (one an upgrade)" "$T/client-b.log" $rc
expect_eq "sockets taken over" "$(grep -c 'took over 2 listening socket(s) from pid' "$SERVE_LOG")" 3
n=$(grep -c "handed 2 listening socket(s) to a successor" "$SERVE_LOG" || true)
expect_eq "servers that handed their sockets over" "$n" 3
n=$(sessions "$SERVE_LOG")
if [ "$n" -ge 4 ]; then ok "the client reconnected to every server ($n sessions)"; else bad "the client opened the export $n times, want >= 4"; fi
check "the Unix socket was handed over too" timeout 10 nbdinfo --list "nbd+unix://?socket=$SERVE_SOCK"
check "admin commands reach the new server" tarn vol list -p "$POOL"

step "a second server while the pool is held: a bounded wait, a clear error"
rc=0; out=$(timeout 60 "$TARN" serve -p "$POOL" --listen "127.0.0.1:$(free_port)" --lock-wait 2 2>&1) || rc=$?
if [ $rc -ne 0 ] && printf '%s' "$out" | grep -q 'still in use by another tarn process after 2 s'; then
  ok "--lock-wait 2: exit $rc after the wait ($(printf '%s' "$out" | tail -1 | cut -c1-140))"
else bad "--lock-wait 2 on a held pool: exit $rc: $(printf '%s' "$out" | tail -2 | tr '\n' ' ')"; fi
rc=0; out=$(timeout 60 "$TARN" serve -p "$POOL" --listen "127.0.0.1:$(free_port)" 2>&1) || rc=$?
if [ $rc -ne 0 ] && printf '%s' "$out" | grep -q 'is in use by another tarn process'; then ok "without --lock-wait: refused at once (exit $rc)"
else bad "a second server on a held pool: exit $rc: $(printf '%s' "$out" | tail -2 | tr '\n' ' ')"; fi
kill -0 "$SERVE_PID" 2>/dev/null && ok "the running server is untouched" || bad "the running server went away"

step "every region reads back with its last pattern"
cmds=()
for r in $(seq 1 $((2 * ROUNDS))); do cmds+=(-c "read -P $((r % 250 + 1)) $((r * REGION)) 256k"); done
cmds+=(-c "read -P 0 0 256k" -c "read -P 0 $(((2 * ROUNDS + 1) * REGION)) 256k")
rc=0; timeout 120 qemu-io -f raw "$(uri $VOL)" "${cmds[@]}" >"$T/verify.log" 2>&1 || rc=$?
expect_eq "regions verified ($((2 * ROUNDS)) written, 2 never written)" \
  "$rc $(grep -c '^read 262144/262144' "$T/verify.log") $(grep -ciE 'fail|error' "$T/verify.log" || true)" "0 $((2 * ROUNDS + 2)) 0"
stop_serve
pool_check "$POOL" "after the restarts"

step "a new server while the old one still commits: it waits, then serves"
# flock(1) holds the pool's lock for 3 s, as a predecessor's final commit would
flock -x "$POOL" sleep 3 & HOLD=$!; E2E_PIDS+=("$HOLD")
sleep 0.3
t0=$(date +%s%N)
start_serve "$POOL" --lock-wait 30
waited=$((($(date +%s%N) - t0) / 1000000))
wait "$HOLD" || true
if [ $waited -ge 2000 ]; then ok "--lock-wait 30: waited ${waited} ms for the lock, then served"
else bad "--lock-wait 30: served after ${waited} ms, before the lock was free"; fi
check "data still there" timeout 60 qemu-io -f raw "$(uri $VOL)" -c "read -P $((ROUNDS % 250 + 1)) $((ROUNDS * REGION)) 256k"
stop_serve

e2e_finish
