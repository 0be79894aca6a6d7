#!/usr/bin/env bash
# NBD over TLS with real clients: a CA, a server and client certificates
# made here with openssl; `tarn serve --tls require --tls-ca --tls-allow`
# checked with libnbd (nbdinfo, nbdcopy, nbdsh) and qemu (qemu-img,
# qemu-io with tls-creds-x509): data written over TLS reads back, plaintext
# and foreign-CA clients are refused (and logged), the allow-list hides and
# refuses exports, garbage after STARTTLS does not disturb other sessions,
# Unix sockets are 0600 (or --socket-mode), bad certificate files stop
# `tarn serve` with exit 2; then `--tls on` serves plaintext and TLS; server
# keys of RSA 2048, 2432, 3072 and 4096 bits, ECDSA P-256 and Ed25519
# serve libnbd clients, and keys TLS cannot use (RSA 1024, secp256k1,
# Ed448) stop it with a message naming the key.
. "$(dirname "$0")/lib.sh"
need openssl qemu-img qemu-io nbdinfo nbdcopy nbdsh jq cmp stat
need_pynbd
e2e_init tls

M=$((1 << 20))
PKI=$T/pki

step "certificates (openssl, EC P-256)"
# newkey NAME: an EC key and a CSR with CN=$2
mkcsr() {
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -subj "/CN=$2" -keyout "$PKI/$1-key.pem" -out "$PKI/$1.csr" 2>>"$T/openssl.log"
}
mkca() { # NAME CN
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj "/CN=$2" -keyout "$PKI/$1-key.pem" -out "$PKI/$1-cert.pem" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>>"$T/openssl.log"
}
mkleaf() { # NAME CN CA EXT-LINES...
  local name=$1 cn=$2 ca=$3; shift 3
  mkcsr "$name" "$cn"
  printf '%s\n' basicConstraints=CA:FALSE keyUsage=critical,digitalSignature,keyEncipherment "$@" >"$PKI/$name.ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/$ca-cert.pem" -CAkey "$PKI/$ca-key.pem" \
    -CAcreateserial -days 2 -extfile "$PKI/$name.ext" -out "$PKI/$name-cert.pem" 2>>"$T/openssl.log"
}
# clientdir NAME CERT: the file names libnbd and qemu expect
clientdir() {
  mkdir -p "$T/$1"
  cp "$PKI/ca-cert.pem" "$T/$1/ca-cert.pem"
  if [ -n "$2" ]; then
    cp "$PKI/$2-cert.pem" "$T/$1/client-cert.pem"
    cp "$PKI/$2-key.pem" "$T/$1/client-key.pem"
  fi
}
mkdir -p "$PKI"
# "other" is an impostor CA with the same name as ours, so that GnuTLS
# clients (which pick a certificate matching the server's CA names) do send
# mallory's certificate and the server's verification is what refuses it.
if mkca ca "tarn e2e CA" && mkca other "tarn e2e CA" &&
   mkleaf server "tarn server" ca subjectAltName=DNS:localhost,IP:127.0.0.1 extendedKeyUsage=serverAuth &&
   mkleaf alice alice ca subjectAltName=DNS:alice.example extendedKeyUsage=clientAuth &&
   mkleaf bob bob ca extendedKeyUsage=clientAuth &&
   mkleaf mallory alice other subjectAltName=DNS:alice.example extendedKeyUsage=clientAuth; then
  ok "CA, server, alice, bob (CA-signed) and mallory (impostor CA, same names)"
else
  die "openssl could not make the certificates: $(tail -n 3 "$T/openssl.log")"
fi
clientdir alice alice
clientdir bob bob
clientdir mallory mallory
# qemu checks its own certificate against ca-cert.pem before connecting
cat "$PKI/other-cert.pem" >>"$T/mallory/ca-cert.pem"
clientdir anon ""

POOL=$T/pool.img
make_pool "$POOL" 1G
make_vol "$POOL" disk0 64M
make_vol "$POOL" disk1 64M
make_vol "$POOL" disk2 64M

step "bad certificate files stop tarn serve (exit 2)"
serve_fails() { # DESC WANT-IN-MESSAGE ARGS...
  local desc=$1 want=$2 rc=0 out; shift 2
  out=$(timeout 30 "$TARN" serve -p "$POOL" --listen 127.0.0.1:0 "$@" 2>&1) || rc=$?
  if [ $rc -eq 2 ] && printf '%s' "$out" | grep -q -- "$want"; then ok "$desc (exit 2: $(printf '%s' "$out" | head -n 1 | cut -c1-120))"
  else bad "$desc: exit $rc, output: $(printf '%s' "$out" | tr '\n' ' ' | cut -c1-200)"; fi
}
SC=(--tls-cert "$PKI/server-cert.pem")
SK=(--tls-key "$PKI/server-key.pem")
serve_fails "missing certificate file" "cannot read" --tls-cert "$T/nonexistent.pem" "${SK[@]}"
serve_fails "certificate file without a certificate" "no certificate" --tls-cert "$PKI/server-key.pem" "${SK[@]}"
serve_fails "key file without a key" "no private key" "${SC[@]}" --tls-key "$PKI/server-cert.pem"
serve_fails "key of another certificate" "not usable together" "${SC[@]}" --tls-key "$PKI/alice-key.pem"
serve_fails "unreadable CA file" "cannot read" "${SC[@]}" "${SK[@]}" --tls-ca "$T/nonexistent-ca.pem"
serve_fails "--tls-key without --tls-cert" "required" "${SK[@]}"
serve_fails "--tls-allow without --tls-ca" "required" "${SC[@]}" "${SK[@]}" --tls-allow alice=disk0
serve_fails "bad --tls-allow entry" "tls-allow" "${SC[@]}" "${SK[@]}" --tls-ca "$PKI/ca-cert.pem" --tls-allow alice
serve_fails "bad --socket-mode" "socket-mode" --socket "$T/x.sock" --socket-mode 999

# start_tls_serve ARGS...: like start_serve, but ready means alice can list
# over TLS (plaintext may be refused).
start_tls_serve() {
  SERVE_POOL=$POOL
  SERVE_PORT=$(free_port)
  SERVE_SOCK=$T/nbd.sock
  SERVE_LOG=$T/serve.log
  rm -f "$SERVE_SOCK"
  echo "--- tarn serve $* ($(date +%T))" >>"$SERVE_LOG"
  "$TARN" serve -p "$POOL" --listen "127.0.0.1:$SERVE_PORT" --socket "$SERVE_SOCK" "$@" >>"$SERVE_LOG" 2>&1 &
  SERVE_PID=$!
  E2E_PIDS+=("$SERVE_PID")
  wait_until 30 nbdinfo --list "$(turi "" alice)" || die "tarn serve with TLS did not answer within 30s"
  say "  tarn serve up: pid $SERVE_PID, port $SERVE_PORT"
}
# turi EXPORT CLIENTDIR: the libnbd TLS URI
turi() { echo "nbds://127.0.0.1:$SERVE_PORT/$1?tls-certificates=$T/$2"; }
# qemu options for client DIR and export
qobj() { echo "tls-creds-x509,id=tls0,dir=$T/$1,endpoint=client"; }
qopts() { echo "driver=nbd,host=127.0.0.1,port=$SERVE_PORT,export=$1,tls-creds=tls0"; }
listed() { # CLIENTDIR: sorted export names, or "refused"
  local out
  out=$(timeout 20 nbdinfo --list --json "$(turi "" "$1")" 2>/dev/null) || { echo refused; return; }
  printf '%s' "$out" | jq -r '.exports[]."export-name"' | sort | tr '\n' ' '
}

step "require mode with client certificates and an allow-list"
start_tls_serve --tls require "${SC[@]}" "${SK[@]}" --tls-ca "$PKI/ca-cert.pem" \
  --tls-allow 'alice=disk0,disk0@*' --tls-allow 'bob=disk1' --tls-allow '*=disk2'
expect_eq "unix socket mode (default)" "$(stat -c %a "$SERVE_SOCK")" 600
expect_eq "nbdinfo --size over TLS (alice)" "$(timeout 20 nbdinfo --size "$(turi disk0 alice)" 2>&1)" $((64 * M))

step "data written over TLS reads back (qemu writes, libnbd reads, and back)"
head -c $((16 * M)) /dev/urandom >"$T/src.img"
check "qemu-img convert src.img -> disk0 over TLS" timeout 120 qemu-img convert -n \
  --object "$(qobj alice)" --target-image-opts -f raw "$T/src.img" "$(qopts disk0)"
check "nbdcopy disk0 over TLS -> out.img" timeout 120 nbdcopy "$(turi disk0 alice)" "$T/out.img"
check "out.img first 16M == src.img" cmp -n $((16 * M)) "$T/src.img" "$T/out.img"
check "rest of disk0 reads as zeros" cmp -n $((48 * M)) -i $((16 * M)):0 "$T/out.img" /dev/zero
check "nbdsh (set_tls require, set_tls_certificates) writes 0x5a at 32M" timeout 60 \
  env PATH="/usr/bin:$PATH" nbdsh -c "h.set_tls(nbd.TLS_REQUIRE)" -c "h.set_tls_certificates('$T/alice')" \
  -c "h.set_export_name('disk0')" -c "h.connect_tcp('127.0.0.1', '$SERVE_PORT')" \
  -c "h.pwrite(b'\\x5a' * (1 << 20), 32 << 20)" -c "h.flush()" \
  -c "assert h.pread(1 << 20, 32 << 20) == b'\\x5a' * (1 << 20)"
check "qemu-io reads the 0x5a pattern and src.img's first MiB over TLS" timeout 60 \
  qemu-io --object "$(qobj alice)" --image-opts "$(qopts disk0)" \
  -c "read -P 0x5a $((32 * M)) 1M" -c "write -P 0x3c $((40 * M)) 256k" -c "read -P 0x3c $((40 * M)) 256k"
info=$(timeout 20 qemu-img info --output=json --object "$(qobj alice)" --image-opts "$(qopts disk0)" 2>&1) || info='{}'
expect_eq "qemu-img info virtual-size over TLS" "$(printf '%s' "$info" | jq -r '."virtual-size"' 2>/dev/null)" $((64 * M))

step "plaintext, anonymous and foreign-CA clients are refused"
check_fails "plaintext nbdinfo (tcp)" timeout 20 nbdinfo --size "nbd://127.0.0.1:$SERVE_PORT/disk0"
check_fails "plaintext nbdinfo --list" timeout 20 nbdinfo --list "nbd://127.0.0.1:$SERVE_PORT"
check_fails "plaintext nbdinfo (unix socket)" timeout 20 nbdinfo --size "nbd+unix:///disk0?socket=$SERVE_SOCK"
check_fails "plaintext qemu-img info" timeout 20 qemu-img info "nbd://127.0.0.1:$SERVE_PORT/disk0"
check_fails "TLS without a client certificate" timeout 20 nbdinfo --size "$(turi disk0 anon)"
refusals() { grep -c "WARN.*127\.0\.0\.1:[0-9]*): TLS refused: invalid peer certificate" "$SERVE_LOG" || true; }
before=$(refusals)
check_fails "client certificate from another CA (libnbd)" timeout 20 nbdinfo --size "$(turi disk0 mallory)"
check_fails "client certificate from another CA (qemu-img)" timeout 20 \
  qemu-img info --object "$(qobj mallory)" --image-opts "$(qopts disk0)"
sleep 0.5
expect_eq "both refusals logged at warn with the peer address" $(($(refusals) - before)) 2
say "  e.g. $(grep "TLS refused: invalid peer" "$SERVE_LOG" | tail -n 1 | cut -c1-200)"

step "allow-list"
expect_eq "alice lists disk0 and disk2 (*=disk2; disk0@* matches no snapshot yet)" "$(listed alice)" "disk0 disk2 "
expect_eq "bob lists disk1 and disk2" "$(listed bob)" "disk1 disk2 "
check_fails "alice cannot open disk1 (libnbd)" timeout 20 nbdinfo --size "$(turi disk1 alice)"
check_fails "alice cannot open disk1 (qemu-io)" timeout 20 \
  qemu-io --object "$(qobj alice)" --image-opts "$(qopts disk1)" -c "read 0 4k"
check_fails "bob cannot open disk0" timeout 20 nbdinfo --size "$(turi disk0 bob)"
expect_eq "bob opens disk1" "$(timeout 20 nbdinfo --size "$(turi disk1 bob)" 2>&1)" $((64 * M))
check "tarn snap create disk0@s1 (live)" tarn snap create disk0@s1 -p "$POOL"
expect_eq "alice now lists disk0@s1 too" "$(listed alice)" "disk0 disk0@s1 disk2 "
expect_eq "bob does not see disk0@s1" "$(listed bob)" "disk1 disk2 "
check "alice reads the snapshot disk0@s1 (0x5a at 32M)" timeout 60 \
  qemu-io -r --object "$(qobj alice)" --image-opts "$(qopts disk0@s1)" -c "read -P 0x5a $((32 * M)) 1M"

step "garbage after STARTTLS does not disturb other sessions"
# A TLS session opened before the garbage and used after it.
rm -f "$T/held.ready" "$T/held.go"
cat >"$T/held.py" <<EOF
import nbd, os, sys, time
h = nbd.NBD()
h.set_tls(nbd.TLS_REQUIRE)
h.set_tls_certificates("$T/alice")
h.set_export_name("disk0")
h.connect_tcp("127.0.0.1", "$SERVE_PORT")
open("$T/held.ready", "w").close()
for _ in range(600):
    if os.path.exists("$T/held.go"):
        break
    time.sleep(0.1)
ok = h.pread(1 << 20, 32 << 20) == b"\x5a" * (1 << 20)
h.shutdown()
sys.exit(0 if ok else 1)
EOF
"$SYSPY" "$T/held.py" >"$T/held.log" 2>&1 &
HELD=$!
E2E_PIDS+=("$HELD")
wait_until 30 test -e "$T/held.ready" || bad "held TLS session did not connect"
cat >"$T/garbage.py" <<'EOF'
import os, random, socket, struct, sys
port = int(sys.argv[1])
rng = random.Random(1234)
closed = 0
for i in range(30):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    g = s.recv(18, socket.MSG_WAITALL)
    assert g[:16] == b"NBDMAGICIHAVEOPT", g
    s.sendall(struct.pack(">I", 3))
    s.sendall(struct.pack(">QII", 0x49484156454F5054, 5, 0))
    r = s.recv(20, socket.MSG_WAITALL)
    assert struct.unpack(">QIII", r)[2] == 1, r  # NBD_REP_ACK
    n = rng.choice([1, 5, 100, 5000, 70000])
    junk = bytearray(rng.getrandbits(8) for _ in range(n))
    if i % 3 == 0:
        junk[:5] = b"\x16\x03\x01\xff\xff"  # a handshake record, absurd length
    elif i % 3 == 1:
        junk[:3] = b"\x17\x03\x03"  # application data before any handshake
    try:
        s.sendall(bytes(junk))
        s.shutdown(socket.SHUT_WR)
        for _ in range(64):  # an alert may come first, then EOF
            if not s.recv(65536):
                closed += 1
                break
    except OSError:  # reset, broken pipe, not connected: closed by the server
        closed += 1
    s.close()
print(closed)
EOF
closed=$(timeout 120 "$SYSPY" "$T/garbage.py" "$SERVE_PORT" 2>&1) || closed="error: $closed"
expect_eq "30 garbage-after-STARTTLS connections closed by the server" "$closed" 30
if kill -0 "$SERVE_PID" 2>/dev/null; then ok "tarn serve still running"; else die "tarn serve died"; fi
touch "$T/held.go"
rc=0; wait "$HELD" || rc=$?
expect_eq "the TLS session opened before the garbage still reads its data" "$rc" 0
expect_eq "new TLS sessions still work" "$(timeout 20 nbdinfo --size "$(turi disk0 alice)" 2>&1)" $((64 * M))
if grep -q "panicked" "$SERVE_LOG"; then bad "panic in $SERVE_LOG"; else ok "no panic in the server log"; fi
stop_serve

step "--tls on: plaintext and TLS side by side, --socket-mode 660"
start_serve "$POOL" --tls on "${SC[@]}" "${SK[@]}" --socket-mode 660
expect_eq "unix socket mode (--socket-mode 660)" "$(stat -c %a "$SERVE_SOCK")" 660
check "plaintext qemu-io reads the 0x5a pattern" timeout 60 qemu-io -f raw "$(uri disk0)" -c "read -P 0x5a $((32 * M)) 1M"
check "TLS (server-authenticated only) nbdcopy reads disk0" timeout 120 nbdcopy "$(turi disk0 anon)" "$T/out2.img"
check "TLS copy == plaintext data (first 16M == src.img)" cmp -n $((16 * M)) "$T/src.img" "$T/out2.img"
check "nbds+unix with TLS over the unix socket" timeout 20 \
  nbdinfo --size "nbds+unix:///disk0?socket=$SERVE_SOCK&tls-certificates=$T/anon&tls-hostname=localhost"
stop_serve

step "server keys of every size and kind a CA issues"
# keyleaf NAME OPENSSL-NEWKEY-ARGS...: a server certificate from our CA
# for a new key of that kind
keyleaf() {
  local name=$1; shift
  printf '%s\n' basicConstraints=CA:FALSE subjectAltName=DNS:localhost,IP:127.0.0.1 extendedKeyUsage=serverAuth \
    >"$PKI/$name.ext"
  openssl req -new "$@" -nodes -subj "/CN=tarn server $name" -keyout "$PKI/$name-key.pem" -out "$PKI/$name.csr" \
    2>>"$T/openssl.log" &&
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca-cert.pem" -CAkey "$PKI/ca-key.pem" -CAcreateserial -days 2 \
    -extfile "$PKI/$name.ext" -out "$PKI/$name-cert.pem" 2>>"$T/openssl.log"
}
for spec in "rsa2048 -newkey rsa:2048" "rsa2432 -newkey rsa:2432" "rsa3072 -newkey rsa:3072" \
  "rsa4096 -newkey rsa:4096" "p256 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1" "ed25519 -newkey ed25519"; do
  read -ra a <<<"$spec"
  keyleaf "${a[@]}" || { bad "openssl could not make the ${a[0]} certificate: $(tail -n 2 "$T/openssl.log")"; continue; }
  start_tls_serve --tls require --tls-cert "$PKI/${a[0]}-cert.pem" --tls-key "$PKI/${a[0]}-key.pem"
  expect_eq "${a[0]}: nbdinfo --size over nbds://" "$(timeout 20 nbdinfo --size "$(turi disk0 anon)" 2>&1)" $((64 * M))
  check "${a[0]}: nbdsh reads the 0x5a pattern over TLS" timeout 60 env PATH="/usr/bin:$PATH" nbdsh \
    -c "h.set_tls(nbd.TLS_REQUIRE)" -c "h.set_tls_certificates('$T/anon')" -c "h.set_export_name('disk0')" \
    -c "h.connect_tcp('127.0.0.1', '$SERVE_PORT')" -c "assert h.pread(1 << 20, 32 << 20) == b'\\x5a' * (1 << 20)"
  stop_serve
done
for spec in "rsa1024|RSA 1024 bits|-newkey rsa:1024" "k256|ECDSA secp256k1|-newkey ec -pkeyopt ec_paramgen_curve:secp256k1" \
  "ed448|Ed448|-newkey ed448"; do
  IFS='|' read -r name what args <<<"$spec"
  read -ra a <<<"$args"
  keyleaf "$name" "${a[@]}" || { bad "openssl could not make the $name certificate: $(tail -n 2 "$T/openssl.log")"; continue; }
  serve_fails "$what key refused, named" "unusable key ($what)" \
    --tls-cert "$PKI/$name-cert.pem" --tls-key "$PKI/$name-key.pem"
done
pool_check "$POOL"
e2e_finish
