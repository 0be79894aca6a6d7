#!/usr/bin/env bash
# `tarn pool upgrade` with the real binary on a pool image made by format 1
# (tests/data/format1: volumes, snapshots, a clone, journal records after the
# checkpoint and an open overwrite region left by kill -9): every command of
# the current release refuses it with a message naming `tarn pool upgrade`
# and leaves the file untouched; the upgrade converts it; every volume and
# snapshot then reads (nbdcopy) exactly what format 1 served (sha256 kept
# beside the image); the pool checks clean, serves writes, and a second
# upgrade says there is nothing to do.
. "$(dirname "$0")/lib.sh"
need gzip sha256sum nbdcopy qemu-io cmp
e2e_init upgrade

DATA=$REPO/tests/data/format1
POOL=$T/pool.img
gzip -dc "$DATA/pool.img.gz" >"$POOL"
cp --sparse=always "$POOL" "$T/orig.img"

step "format 1 is refused, untouched"
check_fails "pool status refuses format 1" tarn pool status -p "$POOL"
if printf '%s' "$LAST_OUT" | grep -q "tarn pool upgrade"; then ok "the message names tarn pool upgrade"
else bad "refusal does not name tarn pool upgrade: $LAST_OUT"; fi
check_fails "tarn serve refuses format 1" tarn serve -p "$POOL" --no-tcp --socket "$T/x.sock"
check "the refused commands wrote nothing" cmp "$POOL" "$T/orig.img"

step "upgrade"
check "tarn pool upgrade" tarn pool upgrade -p "$POOL"
FMT=$(tarn pool status -p "$POOL" --json | jq -r .format)
expect_eq "format after the upgrade" "$FMT" 2
pool_check "$POOL" "after the upgrade"

step "every view reads what format 1 served"
start_serve "$POOL"
while read -r view want; do
  got=$(timeout 120 nbdcopy "$(uri_unix "$view")" - | sha256sum | cut -d' ' -f1)
  expect_eq "sha256 of $view" "$got" "$want"
done <"$DATA/sha256"

step "writable after the upgrade"
check "write to b" timeout 60 qemu-io -f raw -c 'write -P 0xa5 0 1M' -c flush "$(uri_unix b)"
stop_serve
start_serve "$POOL"
check "b reads the new data after a restart" timeout 60 qemu-io -f raw -c 'read -P 0xa5 0 1M' "$(uri_unix b)"
stop_serve
pool_check "$POOL" "after writes"
check "a second upgrade has nothing to do" tarn pool upgrade -p "$POOL"

e2e_finish
