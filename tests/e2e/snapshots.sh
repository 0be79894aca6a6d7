#!/usr/bin/env bash
# Snapshots, clones, rollback and changed-block tracking with real clients:
# snapshots taken while served are read-only NBD exports equal to what the
# head held (qemu-img compare, nbdinfo --map), writes to them fail with EPERM,
# an ext4 frozen for the snapshot fscks clean from it, the dirty bitmaps
# (nbdinfo, qemu-img map, libnbd) agree with `tarn diff` and rebuild the head
# from the snapshot, clones read the snapshot until written, flatten frees
# the origin, rollback restores it, the space accounting is exact, bad input
# is refused with exit 2, and a full pool still deletes snapshots and trims.
. "$(dirname "$0")/lib.sh"
need qemu-img qemu-io nbdinfo nbdcopy jq cmp sha256sum
need_pynbd
e2e_init snapshots

M=$((1 << 20))
K=4096
POOL=$T/pool.img
make_pool "$POOL" 2G
make_vol "$POOL" vol 64M
start_serve "$POOL"

qio()    { timeout 120 qemu-io -f raw "$@"; }
qio_ro() { timeout 120 qemu-io -r -f raw "$@"; }
cmp_img() { timeout 120 qemu-img compare -q -f raw -F raw "$1" "$2"; }
# differs A B: qemu-img compare must exit 1 (different), not 0 or an error
differs() {
  local rc=0
  timeout 120 qemu-img compare -q -f raw -F raw "$1" "$2" >/dev/null 2>&1 || rc=$?
  [ $rc -eq 1 ]
}
# merge: "offset length" lines (sorted) -> adjacent ranges merged
merge() { awk '{ if (n && $1 == s + l) { l += $2 } else { if (n) print s, l; s = $1; l = $2; n = 1 } } END { if (n) print s, l }'; }
oneline() { tr '\n' ' ' | sed 's/ $//'; }

# fails2 DESC PATTERN CMD...: must exit exactly 2 and print something matching PATTERN
fails2() {
  local desc=$1 pat=$2; shift 2
  check_fails "$desc" timeout 60 "$@"
  [ "$LAST_RC" -ne 0 ] || return 0
  if [ "$LAST_RC" -ne 2 ]; then bad "$desc: exit $LAST_RC, want 2"
  elif ! printf '%s' "$LAST_OUT" | grep -Ei -- "$pat" >/dev/null; then
    bad "$desc: message does not match /$pat/: $(printf '%s' "$LAST_OUT" | head -3 | oneline)"
  fi
}

# snap_field VOL@NAME FIELD: sets VAL from `tarn snap list --json`
snap_field() {
  local out
  out=$(tarn snap list "${1%@*}" -p "$POOL" --json 2>&1) || out='[]'
  VAL=$(printf '%s' "$out" | jq -r --arg n "${1#*@}" --arg f "$2" '.[] | select(.name == $n) | .[$f]' 2>/dev/null | head -n1)
  [ -n "$VAL" ] || { bad "tarn snap list --json: no '$2' for $1 in: $(printf '%s' "$out" | oneline | cut -c1-200)"; VAL=-1; }
}
pool_used() { tarn pool status -p "$1" --json 2>/dev/null | jq -r '.used // -1'; }
pool_free() { tarn pool status -p "$1" --json 2>/dev/null | jq -r '.free // -1'; }
# export_field NAME FIELD: a field of `nbdinfo --list --json` for one export
export_field() {
  timeout 30 nbdinfo --list --json "nbd://127.0.0.1:$SERVE_PORT" 2>/dev/null |
    jq -c --arg n "$1" --arg f "$2" '.exports[] | select(."export-name" == $n) | .[$f]' 2>/dev/null
}
# patch FILE OFFSET LENGTH BYTE: what a qemu-io `write -P BYTE` does, on a local image
patch() {
  "$SYSPY" -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(int(sys.argv[2])); f.write(bytes([int(sys.argv[4], 0)]) * int(sys.argv[3]))' "$@"
}
# dirty_nbdinfo EXPORT BITMAP: merged dirty ranges as nbdinfo --map reports them
dirty_nbdinfo() {
  timeout 30 nbdinfo --map="qemu:dirty-bitmap:$2" --json "$(uri "$1")" |
    jq -r '.[] | select(.type % 2 == 1) | "\(.offset) \(.length)"' | merge
}
dirty_tarn() { tarn diff "$@" -p "$POOL" | grep -v '^total'; }

step "a pattern, a snapshot while served, overwrites"
check "qemu-io writes before the snapshot" qio "$(uri vol)" \
  -c "write -P 0x11 0 1M" -c "write -P 0x22 $((4 * M)) 64k" -c "write -P 0x33 $((10 * M)) 4k" \
  -c "write -P 0x44 $((32 * M)) 2M" -c flush
check "save the head with qemu-img convert" timeout 120 qemu-img convert -f raw -O raw "$(uri vol)" "$T/s1.img"
out=$(tarn snap create vol@s1 -p "$POOL" 2>&1) && ok "tarn snap create vol@s1 while served: $out" ||
  die "tarn snap create vol@s1 failed: $out"
# 19 distinct 4 KiB blocks of the snapshot's data leave the head (2 + 16
# discarded + 1, rewrites of the same block count once); 64k goes into a hole
check "qemu-io overwrites after the snapshot" qio "$(uri vol)" \
  -c "write -P 0x99 0 8k" -c "write -P 0x98 0 4k" -c "discard $((4 * M)) 64k" \
  -c "write -P 0xaa $((20 * M)) 64k" -c "write -P 0xbb $((32 * M + K)) 4k" -c "write -P 0xbc $((32 * M + 6000)) 100" -c flush
OVERWRITTEN=$((19 * K))
DIRTY_S1="0 8192 $((4 * M)) 65536 $((20 * M)) 65536 $((32 * M + K)) 4096"
check "save the new head" timeout 120 qemu-img convert -f raw -O raw "$(uri vol)" "$T/head1.img"

step "the snapshot export"
expect_eq "nbdinfo --list: vol@s1 is read-only" "$(export_field vol@s1 is_read_only)" true
expect_eq "nbdinfo --list: vol@s1 size" "$(export_field vol@s1 export-size)" $((64 * M))
expect_eq "nbdinfo --list: vol is writable" "$(export_field vol is_read_only)" false
check "qemu-img compare vol@s1 == the copy saved before the snapshot" cmp_img "$(uri vol@s1)" "$T/s1.img"
check "qemu-img compare: the head differs from it now" differs "$(uri vol)" "$T/s1.img"
check "qemu-io -r reads the old patterns from vol@s1" qio_ro "$(uri vol@s1)" -c "read -P 0x11 0 1M" \
  -c "read -P 0x22 $((4 * M)) 64k" -c "read -P 0x44 $((32 * M)) 2M" -c "read -P 0 $((20 * M)) 64k"
check "the head reads the new ones" qio_ro "$(uri vol)" -c "read -P 0x98 0 4k" -c "read -P 0x99 4k 4k" \
  -c "read -P 0 $((4 * M)) 64k" -c "read -P 0xaa $((20 * M)) 64k" -c "read -P 0xbb $((32 * M + K)) 1904" \
  -c "read -P 0xbc $((32 * M + 6000)) 100"
if timeout 30 nbdinfo --map --json "$(uri vol@s1)" >"$T/s1map.json" 2>"$T/map.err"; then
  check "nbdinfo --map vol@s1: data where written before it, holes elsewhere (also where the head has data now)" \
    "$SYSPY" "$E2E_DIR/mapcheck.py" "$T/s1map.json" data:0:$M hole:$M:$((3 * M)) data:$((4 * M)):65536 \
    data:$((10 * M)):$K hole:$((20 * M)):65536 data:$((32 * M)):$((2 * M)) hole:$((34 * M)):$((30 * M))
else
  bad "nbdinfo --map vol@s1 failed: $(head -c 300 "$T/map.err")"
fi
if timeout 30 nbdinfo --map --json "$(uri vol)" >"$T/headmap.json" 2>"$T/map.err"; then
  check "nbdinfo --map vol: the discard is a hole in the head, the new write data" \
    "$SYSPY" "$E2E_DIR/mapcheck.py" "$T/headmap.json" hole:$((4 * M)):65536 data:$((20 * M)):65536
else
  bad "nbdinfo --map vol failed: $(head -c 300 "$T/map.err")"
fi

step "writes to the snapshot export are refused"
check_fails "qemu-io write on vol@s1 fails" qio "$(uri vol@s1)" -c "write -P 0x66 0 4k"
printf '%s' "$LAST_OUT" | grep -Ei 'permission denied|operation not permitted|read-only' >/dev/null &&
  ok "qemu-io says: $(printf '%s' "$LAST_OUT" | grep -Ei 'permission|permitted|read-only' | head -1)" ||
  bad "qemu-io write on the snapshot failed without a permission error: $(printf '%s' "$LAST_OUT" | head -2 | oneline)"
cat >"$T/eperm.py" <<'PY'
import errno, sys, nbd
h = nbd.NBD()
h.set_strict_mode(0)  # send the requests; the server must refuse them
h.connect_uri(sys.argv[1])
fails = 0
for what, fn in [("pwrite", lambda: h.pwrite(b"x" * 4096, 0)), ("trim", lambda: h.trim(4096, 0)),
                 ("zero", lambda: h.zero(4096, 0))]:
    try:
        fn()
        print(f"  FAIL {what} on a snapshot succeeded"); fails += 1
    except nbd.Error as e:
        if e.errno in (errno.EPERM, "EPERM"):  # the binding gives the name
            print(f"  ok   {what}: EPERM ({e})")
        else:
            print(f"  FAIL {what}: errno {e.errno}, want EPERM: {e}"); fails += 1
if h.pread(4096, 0) != b"\x11" * 4096:
    print("  FAIL the snapshot changed"); fails += 1
sys.exit(1 if fails else 0)
PY
check "libnbd pwrite / trim / zero on vol@s1 fail with EPERM (server side, strict mode off)" \
  timeout 60 "$SYSPY" "$T/eperm.py" "$(uri vol@s1)"
check "vol@s1 unchanged by the attempts" cmp_img "$(uri vol@s1)" "$T/s1.img"

step "space accounting of one snapshot (volume acc)"
make_vol "$POOL" acc 32M
check "write 8M into acc" qio "$(uri acc)" -c "write -P 0x5a 0 8M" -c flush
check "tarn snap create acc@a" tarn snap create acc@a -p "$POOL"
# 37 distinct blocks (53 is coprime to 2048: i*53 mod 2048 never repeats),
# the first 5 written twice, plus 64k into a hole that no snapshot holds
args=()
for i in $(seq 0 36); do args+=(-c "write -q -P 0x6b $(((i * 53 % 2048) * K)) 4k"); done
for i in $(seq 0 4); do args+=(-c "write -q -P 0x6c $(((i * 53 % 2048) * K)) 4k"); done
check "overwrite 37 distinct 4k blocks of acc (5 twice), 64k into a hole" qio "$(uri acc)" "${args[@]}" \
  -c "write -q -P 0x6d $((16 * M)) 64k" -c flush
snap_field acc@a exclusive; expect_eq "snap list --json: acc@a exclusive = 37 * 4096" "$VAL" $((37 * K))
snap_field acc@a referenced; expect_eq "snap list --json: acc@a referenced = 8M" "$VAL" $((8 * M))
snap_field acc@a shared; expect_eq "snap list --json: acc@a shared = 8M - 37 * 4096" "$VAL" $((8 * M - 37 * K))
vol_get "$POOL" acc allocated; expect_eq "vol list: acc head allocated = 8M + 64k" "$VAL" $((8 * M + 65536))
vol_get "$POOL" acc snapshot_bytes; expect_eq "vol list: acc snapshot bytes = 37 * 4096" "$VAL" $((37 * K))
vol_get "$POOL" acc snapshots; expect_eq "vol list: acc has 1 snapshot" "$VAL" 1
snap_field vol@s1 exclusive; expect_eq "snap list --json: vol@s1 exclusive = 19 overwritten blocks" "$VAL" $OVERWRITTEN
out=$(tarn snap list -p "$POOL" 2>&1) || out=
say "$(printf '%s\n' "$out" | sed 's/^/    /')"
printf '%s' "$out" | grep -E '^acc@a ' >/dev/null && printf '%s' "$out" | grep -E '^acc: ' >/dev/null &&
  ok "tarn snap list table has acc@a and a total line for acc" || bad "tarn snap list table: $(printf '%s' "$out" | oneline)"
# clients stay connected to acc@a and to acc's bitmap of it while it goes
cat >"$T/gone.py" <<'PY'
import os, sys, time, nbd
snap_uri, head_uri, up, go = sys.argv[1:5]
s = nbd.NBD(); s.connect_uri(snap_uri)
h = nbd.NBD(); h.add_meta_context("qemu:dirty-bitmap:a"); h.connect_uri(head_uri)
s.pread(4096, 0); h.block_status(1 << 20, 0, lambda *a: 0)
open(up, "w").close()
for _ in range(300):
    if os.path.exists(go): break
    time.sleep(0.1)
fails = 0
for what, fn in [("read of the deleted snapshot", lambda: s.pread(4096, 0)),
                 ("dirty bitmap of the deleted snapshot", lambda: h.block_status(1 << 20, 0, lambda *a: 0))]:
    try:
        fn(); print(f"  FAIL {what} succeeded"); fails += 1
    except nbd.Error as e:
        print(f"  ok   {what} fails: {e}")
try:
    assert h.pread(4096, 4096) == b"\x5a" * 4096
    print("  ok   the head connection still reads")
except Exception as e:
    print(f"  FAIL head read after the snapshot went: {e}"); fails += 1
sys.exit(1 if fails else 0)
PY
"$SYSPY" "$T/gone.py" "$(uri acc@a)" "$(uri acc)" "$T/gone.up" "$T/gone.go" >"$T/gone.out" 2>&1 &
GONE=$!; E2E_PIDS+=("$GONE")
wait_until 20 test -e "$T/gone.up" || bad "the clients of acc@a did not connect: $(cat "$T/gone.out")"
U1=$(pool_used "$POOL")
out=$(tarn snap delete acc@a -p "$POOL" 2>&1) || out="error: $out"
printf '%s' "$out" | grep -E "freed $((37 * K)) bytes" >/dev/null && ok "tarn snap delete acc@a: $out" ||
  bad "tarn snap delete acc@a: want 'freed $((37 * K)) bytes', got: $out"
U2=$(pool_used "$POOL")
expect_eq "pool status used drops by the freed bytes" $((U1 - U2)) $((37 * K))
touch "$T/gone.go"; rc=0; wait "$GONE" || rc=$?
cat "$T/gone.out"
expect_eq "requests on a snapshot deleted under its clients fail, the server goes on" $rc 0
kill -0 "$SERVE_PID" 2>/dev/null && ok "tarn serve still running" || die "tarn serve died"
check "acc head intact after the snapshot went" qio_ro "$(uri acc)" -c "read -P 0x6c 0 4k" -c "read -P 0x5a 4k 4k" \
  -c "read -P 0x6d $((16 * M)) 64k"

step "a snapshot taken under a live writer holds exactly a prefix of its writes"
make_vol "$POOL" live 16M
cat >"$T/live.py" <<'PY'
# One client writes 4 KiB blocks back to back, block i % N holding the
# number i; the snapshot must show the volume as it was after one write m:
# every write acknowledged before `tarn snap create` started (m >= before),
# none issued after it returned (m <= after), and nothing torn or mixed.
import subprocess, sys, threading, time, nbd
head, snap_uri, tarn, snap, pool = sys.argv[1:6]
N = 4096
h = nbd.NBD(); h.connect_uri(head)
acked, stop = [0], [False]
def writer():
    i = 0
    while not stop[0]:
        h.pwrite(i.to_bytes(8, "little") * 512, (i % N) * 4096)
        i += 1; acked[0] = i
t = threading.Thread(target=writer); t.start()
time.sleep(0.5)
before = acked[0]
r = subprocess.run([tarn, "snap", "create", snap, "-p", pool], capture_output=True, text=True)
after = acked[0]
time.sleep(0.2); stop[0] = True; t.join()
if r.returncode != 0:
    sys.exit(f"snap create failed: {r.stderr}")
s = nbd.NBD(); s.connect_uri(snap_uri)
vals = []
for b in range(N):
    d = s.pread(4096, b * 4096)
    v = int.from_bytes(d[:8], "little")
    if d != v.to_bytes(8, "little") * 512:
        sys.exit(f"block {b} is torn")
    vals.append(v)
m = max(vals)
wrong = [b for b in range(N) if m - (m - b) % N >= 0 and vals[b] != m - (m - b) % N]
print(f"writes acknowledged before snap create: {before}, after: {after}; snapshot = state after write {m}; "
      f"{len(wrong)} blocks differ from that state")
sys.exit(0 if before - 1 <= m <= after and before > N and not wrong else 1)
PY
if out=$(timeout 60 "$SYSPY" "$T/live.py" "$(uri live)" "$(uri live@x)" "$TARN" live@x "$POOL" 2>&1); then
  ok "snapshot under a live writer: $out"
else
  bad "snapshot under a live writer: $(printf '%s' "$out" | tail -n 3 | oneline)"
fi
check "tarn vol delete live --recursive" tarn vol delete live --recursive -p "$POOL"

step "changed-block tracking: qemu:dirty-bitmap:s1 on the head"
expect_eq "the head offers qemu:dirty-bitmap:s1" "$(export_field vol contexts | jq -r 'map(select(startswith("qemu:"))) | join(",")')" \
  "qemu:dirty-bitmap:s1"
expect_eq "vol@s1 offers no dirty bitmap (no older snapshot)" "$(export_field vol@s1 contexts | jq -r 'map(select(startswith("qemu:"))) | length')" 0
expect_eq "nbdinfo --map=qemu:dirty-bitmap:s1 = the ranges written after s1" "$(dirty_nbdinfo vol s1 | oneline)" "$DIRTY_S1"
expect_eq "tarn diff vol@s1 (text) = the same ranges" "$(dirty_tarn vol@s1 | oneline)" "$DIRTY_S1"
out=$(tarn diff vol@s1 vol --json -p "$POOL" 2>&1) || out='{}'
expect_eq "tarn diff vol@s1 vol --json ranges" "$(printf '%s' "$out" | jq -r '.ranges[] | "\(.[0]) \(.[1])"' | oneline)" "$DIRTY_S1"
expect_eq "tarn diff --json changed_bytes" "$(printf '%s' "$out" | jq -r .changed_bytes)" $((8192 + 65536 + 65536 + 4096))
expect_eq "tarn diff --json from/to" "$(printf '%s' "$out" | jq -r '"\(.from) \(.to)"')" "vol@s1 vol"
qmap=$(timeout 30 qemu-img map --output=json --image-opts \
  "driver=nbd,server.type=inet,server.host=127.0.0.1,server.port=$SERVE_PORT,export=vol,x-dirty-bitmap=qemu:dirty-bitmap:s1" 2>&1 |
  jq -r '.[] | select(.data == false) | "\(.start) \(.length)"' 2>/dev/null | merge | oneline)
expect_eq "qemu-img map x-dirty-bitmap=qemu:dirty-bitmap:s1 (dirty = data:false)" "$qmap" "$DIRTY_S1"
cat >"$T/incremental.py" <<'PY'
# An incremental backup as a backup tool does it: the dirty extents of the
# bitmap, read from the head and written over the previous full copy.
import sys, nbd
uri, bitmap, image = sys.argv[1:4]
h = nbd.NBD()
h.add_meta_context(bitmap)
h.connect_uri(uri)
if not h.can_meta_context(bitmap):
    sys.exit(f"server did not agree to {bitmap}")
size, off, dirty = h.get_size(), 0, []
while off < size:
    got = []
    def cb(ctx, start, entries, err):
        if ctx == bitmap:
            got.append((start, entries))
        return 0
    h.block_status(min(size - off, 1 << 30), off, cb)
    start, entries = got[0]
    for i in range(0, len(entries), 2):
        if entries[i + 1] & 1:
            dirty.append((start, entries[i]))
        start += entries[i]
    off = start
copied = 0
with open(image, "r+b") as f:
    for o, n in dirty:
        print(o, n)
        for at in range(o, o + n, 1 << 20):
            chunk = min(1 << 20, o + n - at)
            f.seek(at); f.write(h.pread(chunk, at)); copied += chunk
print(f"copied {copied}", file=sys.stderr)
PY
check "full backup: nbdcopy vol@s1 -> inc.img" timeout 120 nbdcopy "$(uri vol@s1)" "$T/inc.img"
if inc=$(timeout 120 "$SYSPY" "$T/incremental.py" "$(uri vol)" qemu:dirty-bitmap:s1 "$T/inc.img" 2>"$T/inc.err"); then
  expect_eq "incremental: libnbd block status on the bitmap = the dirty ranges" "$(printf '%s\n' "$inc" | merge | oneline)" "$DIRTY_S1"
  check "incremental: s1 copy + dirty ranges from the head == the head (qemu-img compare)" cmp_img "$T/inc.img" "$(uri vol)"
else
  bad "incremental backup script failed: $(head -c 300 "$T/inc.err")"
fi
rm -f "$T/inc.img"

step "a second snapshot: bitmaps on snapshot exports, diff between snapshots"
check "write 40M 4k, snapshot s2, write 48M 4k" bash -c "
  timeout 60 qemu-io -f raw '$(uri vol)' -c 'write -P 0xcd $((40 * M)) 4k' -c flush &&
  timeout 60 '$TARN' snap create vol@s2 -p '$POOL' &&
  timeout 60 qemu-io -f raw '$(uri vol)' -c 'write -P 0xce $((48 * M)) 4k' -c flush"
DIRTY_S1_S2="$DIRTY_S1 $((40 * M)) 4096"
expect_eq "the head offers both bitmaps" "$(export_field vol contexts | jq -r 'map(select(startswith("qemu:"))) | join(",")')" \
  "qemu:dirty-bitmap:s1,qemu:dirty-bitmap:s2"
expect_eq "vol@s2 offers only qemu:dirty-bitmap:s1" "$(export_field vol@s2 contexts | jq -r 'map(select(startswith("qemu:"))) | join(",")')" \
  "qemu:dirty-bitmap:s1"
expect_eq "nbdinfo --map=qemu:dirty-bitmap:s1 on vol@s2" "$(dirty_nbdinfo vol@s2 s1 | oneline)" "$DIRTY_S1_S2"
expect_eq "tarn diff vol@s1 vol@s2" "$(dirty_tarn vol@s1 vol@s2 | oneline)" "$DIRTY_S1_S2"
expect_eq "nbdinfo --map=qemu:dirty-bitmap:s2 on the head" "$(dirty_nbdinfo vol s2 | oneline)" "$((48 * M)) 4096"
expect_eq "tarn diff vol@s2" "$(dirty_tarn vol@s2 | oneline)" "$((48 * M)) 4096"
check "save the head" timeout 120 qemu-img convert -f raw -O raw "$(uri vol)" "$T/head2.img"

step "bad input: refused with exit 2, nothing changed"
fails2 "snap create vol@ (empty name)" 'VOL@|empty' "$TARN" snap create vol@ -p "$POOL"
fails2 "snap create @s (empty volume)" 'VOL@|empty' "$TARN" snap create @s -p "$POOL"
fails2 "snap create vol (no @)" 'VOL@' "$TARN" snap create vol -p "$POOL"
fails2 "snap create vol@a@b (second @)" "'@'" "$TARN" snap create vol@a@b -p "$POOL"
fails2 "snap create vol@a/b (slash)" 'name.*/' "$TARN" snap create vol@a/b -p "$POOL"
fails2 "snap create 'vol@a b' (space)" 'name.*space' "$TARN" snap create 'vol@a b' -p "$POOL"
fails2 "snap create of an existing snapshot" 'already' "$TARN" snap create vol@s1 -p "$POOL"
fails2 "snap create of a missing volume" 'no volume.*nosuch' "$TARN" snap create nosuch@s -p "$POOL"
fails2 "snap delete of a missing snapshot" 'no snapshot.*nope' "$TARN" snap delete vol@nope -p "$POOL"
fails2 "snap rollback to a missing snapshot" 'no snapshot.*nope' "$TARN" snap rollback vol@nope -p "$POOL"
fails2 "snap rollback past newer snapshots without --destroy-newer" 'destroy-newer' \
  "$TARN" snap rollback vol@s1 -p "$POOL"
printf '%s' "$LAST_OUT" | grep -q 's2' && ok "the message names s2" || bad "rollback refusal does not name s2: $LAST_OUT"
fails2 "vol delete of a volume with snapshots without --recursive" 'snapshot.*recursive' "$TARN" vol delete vol -p "$POOL"
fails2 "vol clone of a missing snapshot" 'no snapshot' "$TARN" vol clone vol@nope c9 -p "$POOL"
fails2 "vol clone onto an existing volume name" 'exist' "$TARN" vol clone vol@s1 acc -p "$POOL"
fails2 "vol clone with a bad new name" 'name' "$TARN" vol clone vol@s1 'x/y' -p "$POOL"
fails2 "vol flatten of a volume that is no clone" 'not a clone' "$TARN" vol flatten vol -p "$POOL"
fails2 "diff of two volumes" 'one volume' "$TARN" diff vol@s1 acc -p "$POOL"
fails2 "diff from a newer to an older snapshot" 'older' "$TARN" diff vol@s2 vol@s1 -p "$POOL"
fails2 "diff from a missing snapshot" 'no snapshot' "$TARN" diff vol@nope -p "$POOL"
expect_eq "still exactly s1, s2" "$(tarn snap list vol -p "$POOL" --json | jq -r 'map(.name) | join(",")')" "s1,s2"
check "vol@s1 intact" cmp_img "$(uri vol@s1)" "$T/s1.img"
check "head intact" cmp_img "$(uri vol)" "$T/head2.img"
pool_check "$POOL" "online, after the refused commands"

step "restart: snapshots persist, offline commands"
stop_serve
out=$(tarn snap list -p "$POOL" --json 2>&1) || out='[]'
expect_eq "offline snap list" "$(printf '%s' "$out" | jq -r 'map("\(.volume)@\(.name)") | join(",")')" "vol@s1,vol@s2"
expect_eq "offline tarn diff vol@s1" "$(dirty_tarn vol@s1 | oneline)" "$DIRTY_S1 $((40 * M)) 4096 $((48 * M)) 4096"
pool_check "$POOL" "offline, with snapshots"
start_serve "$POOL"
check "vol@s1 after restart == s1.img" cmp_img "$(uri vol@s1)" "$T/s1.img"
check "head after restart == head2.img" cmp_img "$(uri vol)" "$T/head2.img"

step "ext4: freeze, snapshot, keep writing; the snapshot fscks clean and has the old files"
# ext4_missing: what the ext4 part needs and this machine lacks (empty: nothing)
ext4_missing() {
  local why=() tools
  [ "$(id -u)" = 0 ] || why+=("root")
  [ -c /dev/fuse ] || why+=("/dev/fuse")
  tools=$(missing_tools nbdfuse fusermount3 losetup mkfs.ext4 e2fsck fsfreeze mountpoint)
  [ -z "$tools" ] || why+=("tools: $tools")
  losetup -f >/dev/null 2>&1 || why+=("a free loop device")
  [ ${#why[@]} -eq 0 ] || printf 'missing %s' "$(IFS=,; printf '%s' "${why[*]}" | sed 's/,/, /g')"
}
EXT4=0
if part_runs ext4 "$(ext4_missing)"; then EXT4=1; fi
# attach NAME EXPORT [ro]: nbdfuse + loop; sets LOOP_<NAME>
attach() {
  local dir=$T/fuse-$1 ro=${3:-} loop pid
  mkdir -p "$dir"
  nbdfuse ${ro:+-r} "$dir/disk" "$(uri "$2")" >>"$T/nbdfuse.log" 2>&1 &
  pid=$!; E2E_PIDS+=("$pid"); E2E_FUSE+=("$dir")
  wait_until 20 test -s "$dir/disk" || { bad "nbdfuse did not expose $2 within 20s"; return 1; }
  loop=$(losetup ${ro:+-r} -f --show "$dir/disk") || { bad "losetup of $2 failed"; return 1; }
  E2E_LOOPS+=("$loop")
  printf -v "LOOP_$1" '%s' "$loop"
  say "  $2 -> $dir/disk -> $loop${ro:+ (read-only)}"
}
detach() {
  local dir=$T/fuse-$1 var=LOOP_$1
  [ -n "${!var:-}" ] && { losetup -d "${!var}" 2>/dev/null || bad "losetup -d ${!var}"; }
  mountpoint -q "$dir" && { fusermount3 -u "$dir" || bad "fusermount3 -u $dir"; }
  printf -v "$var" '%s' ""
}
if [ $EXT4 = 1 ]; then
  make_vol "$POOL" fs 512M
  MNT=$T/mnt; SMNT=$T/smnt; mkdir -p "$MNT" "$SMNT"
  attach head fs || die "cannot attach fs"
  check "mkfs.ext4" mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$LOOP_head"
  check "mount ext4" mount -t ext4 "$LOOP_head" "$MNT"; E2E_MOUNTS+=("$MNT")
  (
    set -e
    head -c $((8 * M)) /dev/urandom >"$MNT/a"; head -c $((8 * M)) /dev/urandom >"$MNT/b"
    mkdir "$MNT/small"; for i in $(seq 1 200); do head -c $((i * 97)) /dev/urandom >"$MNT/small/f$i"; done
  ) || bad "writing files into the ext4 failed"
  (cd "$MNT" && find . -type f -print0 | sort -z | xargs -0 sha256sum) >"$T/sums-snap"
  check "fsfreeze -f (the fs flushes and is consistent on the device)" fsfreeze -f "$MNT"
  out=$(tarn snap create fs@frozen -p "$POOL" 2>&1) && ok "tarn snap create fs@frozen: $out" || bad "snap create fs@frozen: $out"
  check "fsfreeze -u" fsfreeze -u "$MNT"
  (
    set -e
    head -c $((8 * M)) /dev/urandom >"$MNT/a"; rm "$MNT/b"; head -c $((4 * M)) /dev/urandom >"$MNT/c"
    rm -r "$MNT/small"; sync
  ) || bad "writing on the head after the snapshot failed"
  check "the head's files changed" bash -c "! (cd '$MNT' && sha256sum --quiet -c '$T/sums-snap' >/dev/null 2>&1)"
  if attach snap fs@frozen ro; then
    check "e2fsck -fn on the snapshot: clean" e2fsck -fn "$LOOP_snap"
    check "mount -o ro,noload the snapshot" mount -t ext4 -o ro,noload "$LOOP_snap" "$SMNT"; E2E_MOUNTS+=("$SMNT")
    check "sha256 of every file in the snapshot = at snapshot time" bash -c "cd '$SMNT' && sha256sum --quiet -c '$T/sums-snap'"
    [ ! -e "$SMNT/c" ] && ok "a file created after the snapshot is not in it" || bad "file c is in the snapshot"
    umount "$SMNT" || bad "umount snapshot"
    detach snap
  fi
  check "umount the head" umount "$MNT"
  check "e2fsck -fn on the head: clean" e2fsck -fn "$LOOP_head"
  detach head
fi

step "rollback"
cat >"$T/idle.py" <<'PY'
import sys, time, nbd
h = nbd.NBD(); h.connect_uri(sys.argv[1]); h.pread(4096, 0)
open(sys.argv[3], "w").close()
time.sleep(float(sys.argv[2]))
PY
"$SYSPY" "$T/idle.py" "$(uri vol)" 60 "$T/idle.up" &
IDLE=$!; E2E_PIDS+=("$IDLE")
wait_until 20 test -e "$T/idle.up" || bad "the idle NBD client did not connect"
rc=0; out=$(tarn snap rollback vol@s2 -p "$POOL" 2>&1) || rc=$?
expect_eq "rollback to the newest snapshot with a client connected: exit" $rc 0
printf '%s' "$out" | grep -qi 'warning.*connection' && ok "it warns: $(printf '%s' "$out" | grep -i warning)" ||
  bad "no warning about the connected client: $out"
kill "$IDLE" 2>/dev/null; wait "$IDLE" 2>/dev/null || true
check "head == vol@s2 after rolling back to it" cmp_img "$(uri vol)" "$(uri vol@s2)"
out=$(tarn snap rollback vol@s1 --destroy-newer -p "$POOL" 2>&1) && ok "tarn snap rollback vol@s1 --destroy-newer: $(printf '%s' "$out" | oneline)" ||
  bad "rollback vol@s1 --destroy-newer: $out"
printf '%s' "$out" | grep -q 'destroyed newer snapshots: s2' && ok "it names the destroyed s2" || bad "rollback output does not name s2: $out"
printf '%s' "$out" | grep -qi warning && bad "warned although no client was connected: $out" || ok "no warning without clients"
check "head == the copy saved before s1" cmp_img "$(uri vol)" "$T/s1.img"
expect_eq "only s1 is left" "$(tarn snap list vol -p "$POOL" --json | jq -r 'map(.name) | join(",")')" "s1"
check_fails "vol@s2 is no export any more" timeout 20 nbdinfo --size "$(uri vol@s2)"
expect_eq "nothing changed since s1 now (tarn diff)" "$(tarn diff vol@s1 --json -p "$POOL" | jq -r .changed_bytes)" 0
expect_eq "... and the dirty bitmap agrees" "$(dirty_nbdinfo vol s1 | oneline)" ""
pool_check "$POOL" "after rollback"

step "clones and flatten"
out=$(tarn vol clone vol@s1 c1 -p "$POOL" 2>&1) && ok "tarn vol clone vol@s1 c1: $out" || bad "vol clone: $out"
vol_query "$POOL"
expect_eq "vol list --json: c1's origin" "$(printf '%s' "$VOL_JSON" | jq -r '.[] | select(.name == "c1") | .origin')" "vol@s1"
check "c1 reads as vol@s1" cmp_img "$(uri c1)" "$T/s1.img"
check "write into c1 (over s1 data and into a hole)" qio "$(uri c1)" -c "write -P 0xc1 0 64k" -c "write -P 0xc2 $((5 * M)) 4k" -c flush
cp --sparse=always "$T/s1.img" "$T/c1.img"; patch "$T/c1.img" 0 65536 0xc1; patch "$T/c1.img" $((5 * M)) 4096 0xc2
check "c1 == s1 + its writes" cmp_img "$(uri c1)" "$T/c1.img"
check "the origin snapshot is unchanged" cmp_img "$(uri vol@s1)" "$T/s1.img"
check "the origin head is unchanged" cmp_img "$(uri vol)" "$T/s1.img"
fails2 "snap delete of the snapshot c1 depends on" 'c1' "$TARN" snap delete vol@s1 -p "$POOL"
fails2 "vol delete --recursive of the origin volume" 'c1' "$TARN" vol delete vol --recursive -p "$POOL"
rc=0; out=$(tarn vol flatten c1 -p "$POOL" 2>"$T/flatten.err") || rc=$?
expect_eq "tarn vol flatten c1 (served) exit" "$rc" 0
say "    $out"; sed 's/^/    stderr: /' "$T/flatten.err" | tail -n 3
grep -q '100%' "$T/flatten.err" && ok "flatten reported progress up to 100% on stderr" || bad "no 100% progress line: $(oneline <"$T/flatten.err")"
vol_query "$POOL"
expect_eq "c1 has no origin after flatten" "$(printf '%s' "$VOL_JSON" | jq -r '.[] | select(.name == "c1") | "\(.origin) \(.origin_bytes)"')" "null 0"
out=$(tarn snap delete vol@s1 -p "$POOL" 2>&1) && ok "snap delete vol@s1 after flatten: $out" || bad "snap delete vol@s1 after flatten: $out"
check "c1 still == s1 + its writes" cmp_img "$(uri c1)" "$T/c1.img"
check "vol still == s1.img" cmp_img "$(uri vol)" "$T/s1.img"
check "tarn snap create vol@last" tarn snap create vol@last -p "$POOL"
U1=$(pool_used "$POOL")
out=$(tarn vol delete vol --recursive -p "$POOL" 2>&1) && ok "vol delete vol --recursive: $out" || bad "vol delete --recursive: $out"
U2=$(pool_used "$POOL")
expect_between "the volume's space is back" $((U1 - U2)) $((3 * M)) $((4 * M))
check_fails "vol@last is no export any more" timeout 20 nbdinfo --size "$(uri vol@last)"
# only the ext4 part's snapshot is left, if that part ran
LEFT=; [ $EXT4 = 0 ] || LEFT=fs@frozen
expect_eq "vol's snapshots went with it" "$(tarn snap list -p "$POOL" --json | jq -r 'map("\(.volume)@\(.name)") | join(",")')" "$LEFT"
stop_serve
pool_check "$POOL" "after clones, flatten and deletes"

step "a full pool: snapshot, overwrite to ENOSPC, trim and snap delete at 100%"
FULL=$T/full.img
make_pool "$FULL" 64M
make_vol "$FULL" f 1G
POOL=$FULL
start_serve "$FULL"
F0=$(pool_free "$FULL")
DATA=$(((F0 * 6 / 10) / (4 * M) * (4 * M)))
say "  pool free $(mib "$F0"); writing $(mib "$DATA") before the snapshot"
check "fill f with $(mib "$DATA") of 0x5e" qio "$(uri f)" -c "write -P 0x5e 0 $DATA" -c flush
check "tarn snap create f@s" tarn snap create f@s -p "$FULL"
# fill_enospc START PATTERN: write 4M, then 64k, then 4k pieces from START
# until the pool refuses; sets FILLED (bytes accepted) and ENOSPC_MSG
fill_enospc() {
  local at=$1 pat=$2 chunk out
  FILLED=0; ENOSPC_MSG=
  for chunk in $((4 * M)) 65536 4096; do
    while :; do
      if out=$(timeout 60 qemu-io -f raw "$(uri f)" -c "write -P $pat $at $chunk" -c flush 2>&1) &&
         ! printf '%s' "$out" | grep -qi 'error\|failed'; then
        at=$((at + chunk)); FILLED=$((FILLED + chunk))
        [ $FILLED -lt $((1 << 30)) ] || return 0
      else
        ENOSPC_MSG=$out; break
      fi
    done
  done
}
fill_enospc 0 0x7f
OVER=$FILLED
say "  overwrote $(mib $FILLED) of the snapshot's data before the pool was full"
printf '%s' "$ENOSPC_MSG" | grep -qi 'no space left' && ok "the overwrite that needs new space fails with ENOSPC: $(printf '%s' "$ENOSPC_MSG" | grep -i 'no space' | head -1)" ||
  bad "overwriting a snapshotted volume never failed with ENOSPC: $(printf '%s' "$ENOSPC_MSG" | head -2 | oneline)"
expect_between "the overwrites used the free space" $FILLED $((F0 - DATA - 8 * M)) $((F0 - DATA))
check_fails "a 4k write into a hole fails at 100%" qio "$(uri f)" -c "write -P 1 $((900 * M)) 4k"
printf '%s' "$LAST_OUT" | grep -qi 'no space left' && ok "with ENOSPC" || bad "hole write at 100% failed, but not with ENOSPC: $(printf '%s' "$LAST_OUT" | oneline)"
check "rewriting blocks the head owns alone still works at 100%" qio "$(uri f)" -c "write -P 0x70 0 1M" -c flush
check "reads work at 100%" qio_ro "$(uri f@s)" -c "read -P 0x5e 0 1M"
FR1=$(pool_free "$FULL")
check "discard 0..4M (head-owned) at 100%" qio "$(uri f)" -c "discard 0 4M" -c flush
FR2=$(pool_free "$FULL")
expect_between "the discard gave space back" $((FR2 - FR1)) $((4 * M - 65536)) $((4 * M + 65536))
fill_enospc $((900 * M)) 0x71
say "  refilled $(mib $FILLED) of holes"
FR3=$(pool_free "$FULL")
snap_field f@s exclusive; EXCL=$VAL
out=$(tarn snap delete f@s -p "$FULL" 2>&1) && ok "tarn snap delete f@s at 100%: $out" || bad "snap delete at 100% full: $out"
FR4=$(pool_free "$FULL")
say "  free: at full $(mib "$FR3"), after snap delete $(mib "$FR4"); the snapshot held $(mib "$EXCL") alone"
expect_between "snap delete gave the snapshot's exclusive bytes back" $((FR4 - FR3)) $((EXCL - 65536)) $((EXCL + 65536))
[ "$EXCL" -gt $((8 * M)) ] && ok "that is more than 8M" || bad "the snapshot held only $EXCL bytes alone"
check "writing works again" qio "$(uri f)" -c "write -P 0x72 $((800 * M)) 4M" -c flush
check "data: discarded zeros, overwrites, old pattern after them" qio_ro "$(uri f)" -c "read -P 0 0 4M" \
  -c "read -P 0x7f $((4 * M)) $((OVER - 4 * M))" -c "read -P 0x5e $OVER $((DATA - OVER))" -c "read -P 0x72 $((800 * M)) 4M"
stop_serve
pool_check "$FULL" "full pool after snapshot delete and trim"
e2e_finish
