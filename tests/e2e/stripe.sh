#!/usr/bin/env bash
# Striping per volume (issue "pool elasticity" item 7, RAID-0): a pool of
# four 512 MiB files, volumes striped over 2 (128 KiB units) and 4
# members (64 KiB, the default): fio sequential and random writes with
# crc32c verify over NBD, qemu-img compare against the source image, the
# data spread evenly over the stripe set's members (and nothing on the
# others), a snapshot of a striped volume read back after overwrites,
# the layout in `vol list` (text and --json) and after a restart, `pool
# check` clean; bad layouts (more members than usable, a unit that is no
# power of two, one member, a unit past 64 MiB) refused by name with
# nothing created.
. "$(dirname "$0")/lib.sh"
need fio qemu-img qemu-io jq
e2e_init stripe

M=$((1 << 20))
POOL=$T/pool.img
for i in 1 2 3; do truncate -s 512M "$T/m$i.img"; done
check "tarn pool create on 4 members" tarn pool create "$POOL" --size 512M --device "$T/m1.img" --device "$T/m2.img" --device "$T/m3.img"
used() { tarn pool status -p "$POOL" --json | jq -r '[.devices[] | .data - .free] | join(" ")'; }

step "bad layouts are refused by name, nothing created"
for args in "5:4 usable" "2:96K:power of two" "1:give 2 or more" "2:128M:power of two" "x:member count"; do
  IFS=: read -r n u why <<<"$args"
  [ "$why" ] || { why=$u; u=; }
  check_fails "vol create --stripe $n${u:+:$u}" "$TARN" vol create bad --size 1G --stripe "$n${u:+:$u}" -p "$POOL"
  case $LAST_OUT in *"${why%% *}"*) ok "the error names the cause ($why)" ;; *) bad "error for --stripe $n${u:+:$u}: $LAST_OUT" ;; esac
done
check_fails "--stripe 3 --devices 0,1 (more than the set)" "$TARN" vol create bad --size 1G --stripe 3 --devices 0,1 -p "$POOL"
expect_eq "no volume was created" "$(tarn vol list -p "$POOL" --json | jq length)" 0

step "striped volumes: the layout is recorded and shown"
check "vol create s2 --stripe 2:128K --devices 1,2" tarn vol create s2 --size 1G --stripe 2:128K --devices 1,2 -p "$POOL"
check "vol create s4 --stripe 4" tarn vol create s4 --size 1G --stripe 4 -p "$POOL"
check "vol create plain" tarn vol create plain --size 256M -p "$POOL"
expect_eq "vol list --json: s2's stripe" "$(tarn vol list -p "$POOL" --json | jq -c '.[] | select(.name=="s2") | .stripe')" \
  '{"members":[1,2],"unit":131072,"width":2}'
expect_eq "vol list --json: s4's stripe" "$(tarn vol list -p "$POOL" --json | jq -c '.[] | select(.name=="s4") | .stripe')" \
  '{"members":[0,1,2,3],"unit":65536,"width":4}'
expect_eq "vol list --json: plain is not striped" "$(tarn vol list -p "$POOL" --json | jq -c '.[] | select(.name=="plain") | .stripe')" null
check "vol list (text) shows 4x64.00 KiB on 0,1,2,3" bash -c "\"$TARN\" vol list -p \"$POOL\" | grep -q '^s4 .*4x64.00 KiB on 0,1,2,3'"

start_serve "$POOL"
fio_job() { # NAME VOL RW SIZE [fio options...]: 1M (or --bs) writes with crc32c verify
  local name=$1 vol=$2 rw=$3 size=$4; shift 4
  (cd "$T" && timeout 300 fio --name="$name" --ioengine=nbd --uri="$(uri "$vol")" --rw="$rw" --bs=1M --iodepth=8 \
    --size="$size" --verify=crc32c --output-format=json --output="$T/$name.json" "$@") >"$T/$name.out" 2>&1
}

step "s4: 256 MiB sequential, verified; a quarter on each member"
read -r -a before <<<"$(used)"
rc=0; fio_job seq4 s4 write 256M || rc=$?
expect_eq "fio write + verify on s4 (exit, errors)" "$rc $(jq '[.jobs[].error] | add' "$T/seq4.json")" "0 0"
read -r -a after <<<"$(used)"
for i in 0 1 2 3; do
  expect_between "member $i gained (MiB) of 256 MiB striped over 4" "$(((after[i] - before[i]) / M))" 60 70
done

step "s2: 256 MiB sequential and 4K random writes, verified; only members 1 and 2"
read -r -a before <<<"$(used)"
rc=0; fio_job seq2 s2 write 256M || rc=$?
expect_eq "fio write + verify on s2 (exit, errors)" "$rc $(jq '[.jobs[].error] | add' "$T/seq2.json")" "0 0"
rc=0; fio_job rand2 s2 randwrite 64M --bs=4k --iodepth=32 --offset=512M || rc=$?
expect_eq "fio 4K randwrite + verify on s2 (exit, errors)" "$rc $(jq '[.jobs[].error] | add' "$T/rand2.json")" "0 0"
read -r -a after <<<"$(used)"
for i in 1 2; do
  expect_between "member $i gained (MiB) of 320 MiB striped over 2" "$(((after[i] - before[i]) / M))" 155 170
done
expect_between "member 3 gained (MiB): not in s2's set" "$(((after[3] - before[3]) / M))" 0 2

step "qemu-img compare against the source, and a snapshot of a striped volume"
head -c $((96 * M)) /dev/urandom >"$T/src.raw"
check "qemu-img convert the source into s4 at offset 0" qemu-img convert -n -f raw -O raw "$T/src.raw" "$(uri s4)"
check "s4's first 96 MiB compare equal to the source" qemu-img compare -f raw -F raw "$T/src.raw" \
  "json:{\"driver\":\"raw\",\"size\":$((96 * M)),\"file\":{\"driver\":\"nbd\",\"server\":{\"type\":\"inet\",\"host\":\"127.0.0.1\",\"port\":\"$SERVE_PORT\"},\"export\":\"s4\"}}"
check "qemu-img convert the source into s2 at offset 0" qemu-img convert -n -f raw -O raw "$T/src.raw" "$(uri s2)"
check "s2's first 96 MiB compare equal to the source" qemu-img compare -f raw -F raw "$T/src.raw" \
  "json:{\"driver\":\"raw\",\"size\":$((96 * M)),\"file\":{\"driver\":\"nbd\",\"server\":{\"type\":\"inet\",\"host\":\"127.0.0.1\",\"port\":\"$SERVE_PORT\"},\"export\":\"s2\"}}"
check "snapshot s4@s1" tarn snap create s4@s1 -p "$POOL"
check "overwrite s4's first 8 MiB" qemu-io -f raw -c "write -P 0x5a 0 8M" "$(uri s4)"
check "s4 reads the overwrite" qemu-io -f raw -c "read -P 0x5a 0 8M" "$(uri s4)"
check "s4@s1 still compares equal to the source" qemu-img compare -f raw -F raw "$T/src.raw" \
  "json:{\"driver\":\"raw\",\"size\":$((96 * M)),\"file\":{\"driver\":\"nbd\",\"server\":{\"type\":\"inet\",\"host\":\"127.0.0.1\",\"port\":\"$SERVE_PORT\"},\"export\":\"s4@s1\"}}"
stop_serve
pool_check "$POOL" "after striped writes"

step "restart: the layout stays, everything verifies"
expect_eq "s2's stripe after a restart" "$(tarn vol list -p "$POOL" --json | jq -c '.[] | select(.name=="s2") | .stripe.members')" '[1,2]'
start_serve "$POOL"
rc=0; fio_job seq2v s2 write 160M --offset=96M --verify_only=1 || rc=$?
expect_eq "fio verify-only of s2 after the restart (past the 96 MiB the source overwrote)" "$rc" 0
rc=0; fio_job rand2v s2 randwrite 64M --bs=4k --iodepth=32 --offset=512M --verify_only=1 || rc=$?
expect_eq "fio verify-only of s2's random writes after the restart" "$rc" 0
stop_serve
pool_check "$POOL" "at the end"
e2e_finish
