#!/usr/bin/env bash
# `tarn pool upgrade` with the real binary on pool images made by formats 1
# and 2 (tests/data/format1, format2: volumes, snapshots, a clone, journal
# records after the checkpoint and an open overwrite region left by kill -9):
# every command of the current release refuses each with a message naming `tarn pool upgrade`
# and leaves the file untouched; the upgrade converts it; every volume and
# snapshot then reads (nbdcopy) exactly what the old format served (sha256 kept
# beside the image); the pool checks clean, serves writes, and a second
# upgrade says there is nothing to do.
. "$(dirname "$0")/lib.sh"
need gzip sha256sum nbdcopy qemu-io cmp
e2e_init upgrade

for F in 1 2; do
  DATA=$REPO/tests/data/format$F
  POOL=$T/pool$F.img
  gzip -dc "$DATA/pool.img.gz" >"$POOL"
  cp --sparse=always "$POOL" "$T/orig$F.img"

  step "format $F is refused, untouched"
  check_fails "pool status refuses format $F" tarn pool status -p "$POOL"
  if printf '%s' "$LAST_OUT" | grep -q "tarn pool upgrade"; then ok "the message names tarn pool upgrade"
  else bad "refusal does not name tarn pool upgrade: $LAST_OUT"; fi
  check_fails "tarn serve refuses format $F" tarn serve -p "$POOL" --no-tcp --socket "$T/x.sock"
  check "the refused commands wrote nothing" cmp "$POOL" "$T/orig$F.img"

  step "upgrade"
  check "tarn pool upgrade" tarn pool upgrade -p "$POOL"
  FMT=$(tarn pool status -p "$POOL" --json | jq -r .format)
  expect_eq "format after the upgrade" "$FMT" 3
  pool_check "$POOL" "after the upgrade"

  step "every view reads what format $F served"
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
done

e2e_finish
