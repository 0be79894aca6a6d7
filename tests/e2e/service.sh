#!/usr/bin/env bash
# Service integration: the shipped systemd unit passes `systemd-analyze
# verify`; the server started by the unit's own ExecStart line with a
# config file tells a real NOTIFY_SOCKET READY=1 only once it answers,
# RELOADING=1/READY=1 around a SIGHUP reload (TLS certificate swapped, log
# level changed, restart-only keys named, a broken file refused with the
# old settings kept) and STOPPING=1 on SIGTERM; flags win over the file;
# bad config files stop it with exit 2 naming file and key, nothing
# started; log lines are one logfmt line per event, with syslog priorities
# when stderr is the journal (also a failed start's error); shell completions and man pages generated
# from the CLI definition parse and render.
. "$(dirname "$0")/lib.sh"
need systemd-analyze man openssl nbdinfo nbdsh stat
e2e_init service

UNIT_SRC=$REPO/packaging/systemd/tarn@.service
EXAMPLE=$REPO/packaging/tarn.toml
M=$((1 << 20))
[ -f "$UNIT_SRC" ] || die "no unit file $UNIT_SRC"

step "completions and manual pages from the CLI definition"
for sh in bash zsh fish; do
  check "tarn completions $sh" sh -c "'$TARN' completions $sh >'$T/tarn.$sh' && test -s '$T/tarn.$sh'"
done
check "bash -n on the bash completion" bash -n "$T/tarn.bash"
expect_eq "sourced, it completes tarn" "$(bash -c ". '$T/tarn.bash' && complete -p tarn" 2>&1 | grep -c -- '-F _tarn')" 1
expect_eq "bash completion offers serve --config" \
  "$(bash -c ". '$T/tarn.bash'; COMP_WORDS=(tarn serve --con); COMP_CWORD=2; COMP_LINE='tarn serve --con'; COMP_POINT=\${#COMP_LINE}; _tarn tarn --con serve; printf '%s\n' \"\${COMPREPLY[@]}\"" 2>/dev/null | grep -cx -- --config)" 1
grep -q 'complete -c tarn' "$T/tarn.fish" && ok "fish completion defines tarn" || bad "fish completion has no 'complete -c tarn'"
check "tarn man --dir" "$TARN" man --dir "$T/man/man1"
expect_eq "pages for tarn and tarn-serve" "$(ls "$T/man/man1" | grep -cxE 'tarn\.1|tarn-serve\.1')" 2
for p in tarn tarn-serve tarn-pool-create; do
  out=$(MANWIDTH=100 man -l "$T/man/man1/$p.1" 2>"$T/man-$p.err") || out=
  if [ -n "$out" ] && [ ! -s "$T/man-$p.err" ]; then ok "man -l $p.1 renders ($(printf '%s\n' "$out" | wc -l) lines, no warnings)"
  else bad "man -l $p.1: $(head -c 300 "$T/man-$p.err")"; fi
done
MANWIDTH=100 man -l "$T/man/man1/tarn-serve.1" 2>/dev/null | grep -q -- '--config' && ok "tarn-serve(1) documents --config" \
  || bad "tarn-serve(1) does not mention --config"
cmp -s <("$TARN" man) "$T/man/man1/tarn.1" && ok "tarn man on stdout is tarn.1" || bad "tarn man differs from tarn.1"

step "the systemd unit"
EXEC=$(sed -n 's/^ExecStart=//p' "$UNIT_SRC")
case "$EXEC" in
  "/usr/local/bin/tarn serve --config /etc/tarn/%i.toml") ok "ExecStart: $EXEC" ;;
  *) die "ExecStart changed ('$EXEC'): update how this test runs it" ;;
esac
for want in 'Type=notify' 'ExecReload=/bin/kill -HUP $MAINPID' 'NotifyAccess=main'; do
  grep -qxF "$want" "$UNIT_SRC" && ok "unit has $want" || bad "unit lacks $want"
done
# verify checks that ExecStart's binary exists and Documentation= pages
# resolve: the built binary in place of /usr/local/bin, the pages made above.
mkdir -p "$T/unit"
sed "s#/usr/local/bin/tarn#$TARN#" "$UNIT_SRC" >"$T/unit/tarn@.service"
# clean: exit 0 and not a word (verify warns about some errors with exit 0)
verify_clean() {
  local out
  out=$(MANPATH=$T/man systemd-analyze verify "$1" 2>&1) && [ -z "$out" ] || { printf '%s\n' "$out"; return 1; }
}
check "systemd-analyze verify: clean" verify_clean "$T/unit/tarn@.service"
# the socket unit beside it (socket activation: restarts keep the socket)
cp "$REPO/packaging/systemd/tarn@.socket" "$T/unit/tarn@.socket"
check "systemd-analyze verify tarn@.socket (with its service): clean" verify_clean "$T/unit/tarn@.socket"
grep -qxF 'FileDescriptorName=nbd' "$T/unit/tarn@.socket" && ok "socket unit names its socket nbd" || bad "socket unit lacks FileDescriptorName=nbd"
bad_unit=$T/unit/bad/tarn@.service
mkdir -p "${bad_unit%/*}"
sed 's/^Type=notify/Type=notifyy/' "$T/unit/tarn@.service" >"$bad_unit"
check_fails "negative control: verify_clean flags a broken Type=" verify_clean "$bad_unit"

POOL=$T/pool.img
make_pool "$POOL" 512M
make_vol "$POOL" disk0 64M

step "bad config files: exit 2 naming file and key, nothing started"
PORT=$(free_port)
mkdir -p "$T/etc"
cfg_fails() { # DESC WANT-IN-MESSAGE TOML-LINE
  local f=$T/etc/bad.toml rc=0 out
  printf 'pool = "%s"\nlisten = "127.0.0.1:%s"\n%s\n' "$POOL" "$PORT" "$3" >"$f"
  out=$(timeout 30 "$TARN" serve --config "$f" 2>&1) || rc=$?
  if [ $rc -eq 2 ] && printf '%s' "$out" | grep -qF -- "$2" && printf '%s' "$out" | grep -qF "$f"; then
    ok "$1 (exit 2: $(printf '%s' "$out" | head -n 1 | cut -c1-150))"
  else bad "$1: exit $rc, output: $(printf '%s' "$out" | tr '\n' ' ' | cut -c1-250)"; fi
  if timeout 5 nbdinfo --list "nbd://127.0.0.1:$PORT" >/dev/null 2>&1; then bad "$1: something listens on $PORT"; fi
}
cfg_fails "unknown key (snake_case)" "key commit_interval: unknown field" 'commit_interval = 5'
cfg_fails "unknown key" "key colour: unknown field" 'colour = "blue"'
cfg_fails "wrong type (string for seconds)" "key commit-interval: invalid type: string" 'commit-interval = "5"'
cfg_fails "wrong type (number for a path)" "key socket: invalid type: integer" 'socket = 5'
cfg_fails "bad size" "key metadata-cache" 'metadata-cache = "lots"'
cfg_fails "decimal socket mode" "key socket-mode" $'socket = "/tmp/x.sock"\nsocket-mode = 660'
cfg_fails "not TOML" "line 3" 'listen = '
rc=0; out=$(timeout 30 "$TARN" serve --config "$T/etc/none.toml" 2>&1) || rc=$?
expect_eq "missing config file: exit 2" "$rc" 2
printf '%s' "$out" | grep -qF "$T/etc/none.toml" && ok "  ... naming it" || bad "missing file not named: $out"
printf 'pool = "%s"\nlisten = "127.0.0.1:%s"\nmetrics = "192.0.2.1:9"\n' "$POOL" "$PORT" >"$T/etc/unreach.toml"
rc=0; out=$(timeout 30 "$TARN" serve --config "$T/etc/unreach.toml" 2>&1) || rc=$?
if [ $rc -eq 2 ] && printf '%s' "$out" | grep -qF "192.0.2.1:9"; then ok "unreachable metrics address: exit 2 naming it"
else bad "unreachable metrics address: exit $rc: $(printf '%s' "$out" | tr '\n' ' ' | cut -c1-200)"; fi
rc=0; out=$(TARN_CONFIG=$T/etc/bad.toml timeout 30 "$TARN" serve 2>&1) || rc=$?
expect_eq "TARN_CONFIG is read (the last bad file: exit 2)" "$rc" 2

step "PKI for the TLS reload"
PKI=$T/pki
mkdir -p "$PKI" "$T/trust1" "$T/trust2"
mkpki() { # N: CA N and a server certificate it signs, in $PKI/caN-* and serverN-*
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj "/CN=tarn CA $1" \
    -keyout "$PKI/ca$1-key.pem" -out "$PKI/ca$1-cert.pem" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign &&
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=tarn server $1" \
    -keyout "$PKI/server$1-key.pem" -out "$PKI/server$1.csr" &&
  printf '%s\n' subjectAltName=DNS:localhost,IP:127.0.0.1 extendedKeyUsage=serverAuth >"$PKI/server.ext" &&
  openssl x509 -req -in "$PKI/server$1.csr" -CA "$PKI/ca$1-cert.pem" -CAkey "$PKI/ca$1-key.pem" \
    -CAcreateserial -days 2 -extfile "$PKI/server.ext" -out "$PKI/server$1-cert.pem" &&
  cp "$PKI/ca$1-cert.pem" "$T/trust$1/ca-cert.pem"
}
if mkpki 1 2>>"$T/openssl.log" && mkpki 2 2>>"$T/openssl.log"; then ok "two CAs, a server certificate from each"
else die "openssl: $(tail -n 3 "$T/openssl.log")"; fi
cp "$PKI/server1-cert.pem" "$T/etc/cert.pem"
cp "$PKI/server1-key.pem" "$T/etc/key.pem"

step "started by the unit's command line, with the config file; READY=1 once it answers"
cat >"$T/notify.py" <<'EOF'
# A service manager's end of NOTIFY_SOCKET: one line per state, "--" after
# each datagram.
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
with open(sys.argv[2], "a", buffering=1) as out:
    print("listening", file=out)
    while True:
        for line in s.recv(65536).decode().splitlines():
            print(line, file=out)
        print("--", file=out)
EOF
NSOCK=$T/notify.sock
NLOG=$T/notify.log
"$SYSPY" "$T/notify.py" "$NSOCK" "$NLOG" &
E2E_PIDS+=("$!")
wait_until 10 grep -qx listening "$NLOG" || die "the notify listener did not start"
SOCK=$T/nbd.sock
CONF=$T/etc/e2e.toml
# The example file, pointed at this pool, port and files.
sed -e "s#^pool = .*#pool = \"$POOL\"#" -e "s#^listen = .*#listen = \"127.0.0.1:$PORT\"#" \
  -e "s|^# socket = .*|socket = \"$SOCK\"|" -e 's/^commit-interval = 5/commit-interval = 3/' \
  -e 's/^# tls = "require"/tls = "require"/' -e "s|^# tls-cert = .*|tls-cert = \"$T/etc/cert.pem\"|" \
  -e "s|^# tls-key = .*|tls-key = \"$T/etc/key.pem\"|" "$EXAMPLE" >"$CONF"
grep -q '^log-level = "info"' "$CONF" || die "the example config no longer sets log-level = \"info\""
read -ra CMD <<<"$(printf '%s' "$EXEC" | sed -e "s#/usr/local/bin/tarn#$TARN#" -e "s#/etc/tarn/%i.toml#$CONF#")"
SERVE_LOG=$T/serve.log
NOTIFY_SOCKET=$NSOCK "${CMD[@]}" 2>>"$SERVE_LOG" &
SERVE_PID=$!
E2E_PIDS+=("$SERVE_PID")
turi() { echo "nbds://127.0.0.1:$PORT/$1?tls-certificates=$T/$2"; }
if wait_until 30 grep -qx READY=1 "$NLOG"; then
  # no retry: READY=1 means it answers now
  if timeout 10 nbdinfo --size "$(turi disk0 trust1)" >"$T/size.out" 2>&1; then
    ok "READY=1 received, and the server answers TLS at once ($(cat "$T/size.out") bytes)"
  else bad "READY=1 received but nbdinfo failed: $(cat "$T/size.out")"; fi
else
  bad "no READY=1 on NOTIFY_SOCKET within 30s: $(tr '\n' ' ' <"$NLOG")"
fi
grep -q '^STATUS=serving pool ' "$NLOG" && ok "STATUS: $(grep -m1 '^STATUS=' "$NLOG")" || bad "no STATUS= line"
expect_eq "the unix socket from the file, mode from the file's default" "$(stat -c %a "$SOCK" 2>&1)" 600
check_fails "plaintext refused (tls = \"require\" from the file)" timeout 10 nbdinfo --size "nbd://127.0.0.1:$PORT/disk0"
check "nbdsh writes and reads back over TLS" timeout 60 env PATH="/usr/bin:$PATH" nbdsh \
  -c "h.set_tls(nbd.TLS_REQUIRE)" -c "h.set_tls_certificates('$T/trust1')" -c "h.set_export_name('disk0')" \
  -c "h.connect_tcp('127.0.0.1', '$PORT')" -c "h.pwrite(b'\\x6b' * (1 << 20), 4 << 20)" -c "h.flush()" \
  -c "assert h.pread(1 << 20, 4 << 20) == b'\\x6b' * (1 << 20)"
check_fails "the other CA's clients are refused" timeout 10 nbdinfo --size "$(turi disk0 trust2)"
expect_eq "log-level info from the file: connections logged" \
  "$(grep -c 'level=INFO target=tarn_nbd::server msg="nbd: connection [0-9]* from' "$SERVE_LOG")" 4

step "log lines: one logfmt line per event"
nonconform=$(grep -cvE '^ts=[0-9T:.-]+Z level=(ERROR|WARN|NOTICE|INFO|DEBUG|TRACE) target=[A-Za-z0-9_:]+ msg="([^"\\]|\\.)*"$' "$SERVE_LOG" || true)
expect_eq "lines of serve.log not in the format" "$nonconform" 0
expect_eq "the listening notice" "$(grep -c "level=NOTICE target=tarn msg=\"listening on nbd://127.0.0.1:$PORT/\"" "$SERVE_LOG")" 1

step "SIGHUP: the server certificate swapped, log level lowered, restart-only keys named"
cp "$PKI/server2-cert.pem" "$T/etc/cert.pem"
cp "$PKI/server2-key.pem" "$T/etc/key.pem"
sed -i -e 's/^log-level = "info"/log-level = "warn"/' -e 's/^commit-interval = 3/commit-interval = 4/' "$CONF"
before=$(grep -c . "$NLOG")
kill -HUP "$SERVE_PID"
if wait_until 20 sh -c "tail -n +$((before + 1)) '$NLOG' | grep -qx READY=1"; then
  seq=$(tail -n +$((before + 1)) "$NLOG" | grep -E '^(RELOADING|READY)=1$' | tr '\n' ' ')
  expect_eq "RELOADING=1 then READY=1" "$seq" "RELOADING=1 READY=1 "
  tail -n +$((before + 1)) "$NLOG" | grep -qE '^MONOTONIC_USEC=[0-9]+$' && ok "MONOTONIC_USEC with RELOADING=1" \
    || bad "no MONOTONIC_USEC with RELOADING=1"
else bad "no READY=1 after SIGHUP: $(tail -n +$((before + 1)) "$NLOG" | tr '\n' ' ')"; fi
kill -0 "$SERVE_PID" 2>/dev/null && ok "still running after SIGHUP" || die "tarn serve died on SIGHUP"
expect_eq "the new CA's clients connect" "$(timeout 10 nbdinfo --size "$(turi disk0 trust2)" 2>&1)" $((64 * M))
check_fails "the old CA's clients are refused now" timeout 10 nbdinfo --size "$(turi disk0 trust1)"
grep -q 'level=WARN .*reload: commit-interval changed; it takes effect at the next restart' "$SERVE_LOG" \
  && ok "commit-interval named as restart-only" || bad "no restart-only warning for commit-interval"
expect_eq "log-level warn: the two connections since the reload not logged" \
  "$(grep -c 'msg="nbd: connection [0-9]* from' "$SERVE_LOG")" 4
check "data written before the reload reads back over the new certificate" timeout 60 env PATH="/usr/bin:$PATH" nbdsh \
  -c "h.set_tls(nbd.TLS_REQUIRE)" -c "h.set_tls_certificates('$T/trust2')" -c "h.set_export_name('disk0')" \
  -c "h.connect_tcp('127.0.0.1', '$PORT')" -c "assert h.pread(1 << 20, 4 << 20) == b'\\x6b' * (1 << 20)"

step "SIGHUP with a broken file: refused, old settings kept, READY=1 all the same"
cp "$CONF" "$T/etc/good.toml"
printf 'tls-kye = "oops"\n' >>"$CONF"
before=$(grep -c . "$NLOG")
kill -HUP "$SERVE_PID"
wait_until 20 sh -c "tail -n +$((before + 1)) '$NLOG' | grep -qx READY=1" && ok "READY=1 after the refused reload" \
  || bad "no READY=1 after the refused reload"
grep -q 'level=ERROR .*reload refused, configuration unchanged: config file .*key tls-kye: unknown field' "$SERVE_LOG" \
  && ok "logged: $(grep -m1 -o 'reload refused[^"]*' "$SERVE_LOG" | cut -c1-120)" || bad "the refused reload is not logged"
expect_eq "TLS still works with the kept certificate" "$(timeout 10 nbdinfo --size "$(turi disk0 trust2)" 2>&1)" $((64 * M))
cp "$T/etc/good.toml" "$CONF"
# a key file the TLS library cannot use: refused the same way
openssl genpkey -algorithm ed448 -out "$T/etc/key.pem" 2>>"$T/openssl.log"
before=$(grep -c . "$NLOG")
kill -HUP "$SERVE_PID"
wait_until 20 sh -c "tail -n +$((before + 1)) '$NLOG' | grep -qx READY=1" || bad "no READY=1 after the second refused reload"
grep -q 'reload refused, configuration unchanged: TLS: .*key.pem: ' "$SERVE_LOG" && ok "a bad key file refused at reload" \
  || bad "the bad key file at reload is not logged as refused"
expect_eq "TLS still works after it" "$(timeout 10 nbdinfo --size "$(turi disk0 trust2)" 2>&1)" $((64 * M))

step "SIGTERM: STOPPING=1, clean exit"
before=$(grep -c . "$NLOG")
kill -TERM "$SERVE_PID"
rc=0; wait "$SERVE_PID" || rc=$?
SERVE_PID=
expect_eq "exit status after SIGTERM" "$rc" 0
tail -n +$((before + 1)) "$NLOG" | grep -qx STOPPING=1 && ok "STOPPING=1 sent" || bad "no STOPPING=1"
grep -q 'level=NOTICE target=tarn msg="pool committed and closed"' "$SERVE_LOG" && ok "closing notice logged" \
  || bad "no closing notice"

step "the command line wins over the file; journald priorities"
PORT2=$(free_port)
cp "$PKI/server2-key.pem" "$T/etc/key.pem"
# stderr is a file standing in for the journal stream: JOURNAL_STREAM names it
JLOG=$T/journal.log
: >"$JLOG"
JOURNAL_STREAM=$(stat -c '%d:%i' "$JLOG") "$TARN" serve --config "$CONF" --listen "127.0.0.1:$PORT2" --tls on \
  --log-level debug --strict 2>>"$JLOG" &
SERVE_PID=$!
E2E_PIDS+=("$SERVE_PID")
wait_until 30 nbdinfo --size "nbd://127.0.0.1:$PORT2/disk0" && ok "--listen and --tls on override the file: plaintext on $PORT2" \
  || bad "no plaintext server on the --listen port $PORT2"
check_fails "nothing on the file's port" timeout 5 nbdinfo --list "nbd://127.0.0.1:$PORT"
grep -q '^<7>level=DEBUG ' "$JLOG" && ok "--log-level debug over the file's info: <7>DEBUG lines" || bad "no <7>DEBUG lines"
grep -q '^<5>level=NOTICE target=tarn msg="listening on' "$JLOG" && ok "notices at priority <5>" || bad "no <5> notice"
grep -q '^<6>level=INFO ' "$JLOG" && ok "info at priority <6>" || bad "no <6> info line"
expect_eq "journal lines without a priority or with a time stamp" "$(grep -cvE '^<[0-7]>level=' "$JLOG" || true)" 0
stop_serve
JLOG2=$T/journal-fail.log
: >"$JLOG2"
rc=0; JOURNAL_STREAM=$(stat -c '%d:%i' "$JLOG2") timeout 30 "$TARN" serve --config "$T/etc/bad.toml" 2>>"$JLOG2" || rc=$?
expect_eq "a failed start under the journal: exit" "$rc" 2
grep -q '^<3>tarn: error: config file ' "$JLOG2" && ok "its error at priority <3>" || bad "no <3> error line: $(head -c 200 "$JLOG2")"
pool_check "$POOL"
e2e_finish
