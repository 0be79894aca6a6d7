#!/usr/bin/env bash
# Pictures: `tarn map` draws each device's layout (PNG and SVG) and `tarn
# vol map --png` one volume's map, while served and offline. Checked by
# their properties: the size asked for, the legend colours of the volumes
# written present in the devices' grids (and a volume never written
# absent), snapshot space drawn in its lighter shade, SVG that parses with
# one group per volume; bad input refused with a clear error.
. "$(dirname "$0")/lib.sh"
need qemu-io jq
e2e_init pictures

POOL=$T/pool.img
DEV1=$T/dev1.img
check "pool of 2 devices" tarn pool create "$POOL" --size 256M --device "$DEV1"
for v in alpha beta gamma idle; do make_vol "$POOL" "$v" 64M; done
# Control requests are logged at info level: the map must go through the server.
RUST_LOG=info start_serve "$POOL"

step "three volumes written in distinct regions, a snapshot, overwrites"
check "alpha: 24 MiB" qemu-io -f raw "$(uri alpha)" -c 'write -P 1 0 24M'
check "beta: 8 MiB at 16M" qemu-io -f raw "$(uri beta)" -c 'write -P 2 16M 8M'
gamma_writes=()
for i in $(seq 0 127); do gamma_writes+=(-c "write -P 3 $((i * 64))k 4k"); done
check "gamma: 4 KiB every 64 KiB of 8 MiB" qemu-io -f raw "$(uri gamma)" "${gamma_writes[@]}"
check "snapshot alpha@s1" tarn snap create alpha@s1 -p "$POOL"
check "alpha: overwrite 4 MiB (snapshot keeps the old blocks)" qemu-io -f raw "$(uri alpha)" -c 'write -P 9 0 4M'

# png_props FILE: "WIDTH HEIGHT" from the IHDR chunk
png_props() {
  "$SYSPY" - "$1" <<'PY'
import struct, sys
d = open(sys.argv[1], 'rb').read(32)
assert d[:8] == b'\x89PNG\r\n\x1a\n' and d[12:16] == b'IHDR', 'not a PNG'
print(*struct.unpack('>II', d[16:24]))
PY
}
# colours_in PNG JSON: one line per legend colour found inside the device
# areas, "NAME KIND" (kind: head, snapshot)
colours_in() {
  "$SYSPY" - "$1" "$2" <<'PY'
import json, sys, zlib, struct
png, desc = open(sys.argv[1], 'rb').read(), json.load(open(sys.argv[2]))
pos, idat, w, h = 8, b'', 0, 0
while pos < len(png):
    n, kind = struct.unpack('>I4s', png[pos:pos + 8])
    body = png[pos + 8:pos + 8 + n]
    if kind == b'IHDR':
        w, h, depth, ctype = struct.unpack('>IIBB', body[:10])
        assert (depth, ctype) == (8, 2), 'expected 8-bit RGB'
    elif kind == b'IDAT':
        idat += body
    pos += 12 + n
raw, stride, rows, prev = zlib.decompress(idat), w * 3, [], bytearray(w * 3)
for y in range(h):   # undo the PNG row filters
    f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - 3] if i >= 3 else 0
        b, c = prev[i], prev[i - 3] if i >= 3 else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(line); prev = line
seen = set()
for d in desc['devices']:
    x0, y0, aw, ah = d['area']
    for y in range(y0, y0 + ah):
        for x in range(x0, x0 + aw):
            seen.add('#%02x%02x%02x' % tuple(rows[y][x * 3:x * 3 + 3]))
for v in desc['legend']['volumes']:
    for kind, key in (('head', 'colour'), ('snapshot', 'snapshot_colour')):
        if v[key] in seen:
            print(v['name'], kind)
PY
}

step "tarn map while served (through the control socket): PNG, SVG, the legend"
check "tarn map --png --svg --width 900 --json" sh -c "timeout 120 '$TARN' map -p '$POOL' --png '$T/pool.png' \
  --svg '$T/pool.svg' --width 900 --json >'$T/pool.json'"
grep -q "control request: PoolMap" "$SERVE_LOG" && ok "the request went through the server" || bad "no PoolMap request in the server log"
read -r w h < <(png_props "$T/pool.png")
expect_eq "PNG width as asked" "$w" 900
expect_eq "PNG height as described" "$h" "$(jq .height "$T/pool.json")"
expect_eq "devices drawn" "$(jq '.devices | length' "$T/pool.json")" 2
expect_eq "volumes in the legend" "$(jq -r '[.legend.volumes[].name] | join(",")' "$T/pool.json")" "alpha,beta,gamma,idle"
colours_in "$T/pool.png" "$T/pool.json" >"$T/seen.txt"
for v in alpha beta gamma; do
  grep -qx "$v head" "$T/seen.txt" && ok "$v's colour is in the device grids" || bad "$v's colour missing: $(tr '\n' ' ' <"$T/seen.txt")"
done
grep -qx "alpha snapshot" "$T/seen.txt" && ok "alpha's snapshot-only blocks drawn in its lighter shade" \
  || bad "no snapshot-only shade of alpha: $(tr '\n' ' ' <"$T/seen.txt")"
grep -q "^idle " "$T/seen.txt" && bad "idle (never written) has pixels in the grids" || ok "idle, never written, has no pixels in the grids"
grep -q "^beta snapshot" "$T/seen.txt" && bad "beta has snapshot shade without a snapshot" || ok "beta (no snapshot) has no snapshot shade"
gamma_rpg=$(jq '[.devices[].runs_per_gib] | max' "$T/pool.json")
jq -e '[.devices[].runs_per_gib] | max > 100' "$T/pool.json" >/dev/null \
  && ok "fragmentation shows: gamma's 4 KiB pieces make $gamma_rpg runs per GiB" || bad "runs per GiB $gamma_rpg"
"$SYSPY" - "$T/pool.svg" >"$T/svg.txt" <<'PY' || bad "the SVG does not parse as XML"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
ns = '{http://www.w3.org/2000/svg}'
print(root.get('width'), root.get('height'))
for g in root.iter(ns + 'g'):
    if g.get('class') == 'volume':
        print(g.get('data-name'), len(list(g)))
PY
expect_eq "SVG size as the PNG" "$(head -1 "$T/svg.txt")" "900 $h"
expect_eq "one SVG group per volume" "$(tail -n +2 "$T/svg.txt" | cut -d' ' -f1 | tr '\n' ,)" "alpha,beta,gamma,idle,"
expect_eq "the idle volume's group is empty" "$(grep '^idle ' "$T/svg.txt" | cut -d' ' -f2)" 0

step "tarn vol map --png while served"
check "vol map gamma --png --svg" sh -c "timeout 120 '$TARN' vol map gamma -p '$POOL' --png '$T/gamma.png' \
  --svg '$T/gamma.svg' --width 640 --json >'$T/gamma.json'"
read -r w _ < <(png_props "$T/gamma.png")
expect_eq "vol map PNG width" "$w" 640
expect_eq "vol map runs (gamma's 128 pieces)" "$(jq .runs "$T/gamma.json")" 128
check "vol map SVG parses" "$SYSPY" -c "import xml.etree.ElementTree as E; E.parse('$T/gamma.svg')"
check "vol map of a snapshot" tarn vol map alpha@s1 -p "$POOL" --png "$T/s1.png"

step "bad input"
check_fails "unknown volume" tarn vol map nosuch -p "$POOL" --png "$T/x.png"
case $LAST_OUT in *nosuch*) ok "the error names the volume" ;; *) bad "unknown volume: $LAST_OUT" ;; esac
check_fails "unwritable output path" tarn map -p "$POOL" --png "$T/no/such/dir/p.png"
case $LAST_OUT in *"no/such/dir/p.png"*) ok "the error names the file" ;; *) bad "unwritable: $LAST_OUT" ;; esac
for wd in 0 100000; do
  check_fails "--width $wd" tarn map -p "$POOL" --png "$T/w.png" --width "$wd"
  case $LAST_OUT in *"320 to 8192"*) ok "--width $wd: the error gives the range" ;; *) bad "width $wd: $LAST_OUT" ;; esac
done
[ -e "$T/w.png" ] && bad "a refused width left a file" || ok "a refused width writes nothing"

step "offline: the same picture from the pool itself"
stop_serve
check "tarn map offline" sh -c "timeout 120 '$TARN' map -p '$POOL' --png '$T/off.png' --width 900 --json >'$T/off.json'"
colours_in "$T/off.png" "$T/off.json" >"$T/seen_off.txt"
expect_eq "offline: the same volumes' colours" "$(grep -c head "$T/seen_off.txt")" 3
pool_check "$POOL"
e2e_finish
