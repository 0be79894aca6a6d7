#!/usr/bin/env bash
# Spare devices (issue "pool elasticity" item 3: "grows a file-backed
# device up to a limit or takes a configured spare"). A pool on a 256 MiB
# file that may not grow (`--expand-max 256M`) with a 512 MiB spare added
# online (`dev add --spare`): a full-speed sequential fio writer with
# crc32c verify writes 600 MiB past the pool's size; the spare is taken
# (logged, expansion alert), no error; kill -9 and reopen: the member is
# there, the data verifies, the checker is clean. A missing spare leaves
# the pool opening (MISSING, never taken). `dev remove` of a spare drops
# it and wipes its label. Bad input (a device of another pool, too small,
# already a member or spare) is refused by name and changes nothing.
. "$(dirname "$0")/lib.sh"
need fio qemu-io jq
e2e_init spare

M=$((1 << 20))
POOL=$T/pool.img
SPARE=$T/spare.img
make_pool "$POOL" 256M
make_vol "$POOL" v 2G
status() { tarn pool status -p "$POOL" --json; }

fio_job() { # NAME SIZE [fio options...]: sequential 1M QD8 writes of SIZE with crc32c verify
  local name=$1 size=$2; shift 2
  (cd "$T" && timeout 300 fio --name="$name" --ioengine=nbd --uri="$(uri v)" --rw=write --bs=1M --iodepth=8 \
    --size="$size" --verify=crc32c --output-format=json --output="$T/$name.json" "$@") >"$T/$name.out" 2>&1
}

step "a spare added online is listed, holds no data, and is not counted in the pool's size"
ALERTS=$T/alerts.jsonl
start_serve "$POOL" --expand-at 70 --expand-step 64M --expand-max 256M --alert-exec "cat >>$ALERTS"
size0=$(status | jq .size)
check "dev add --spare (online, through the server)" "$TARN" dev add --spare "$SPARE" --size 512M -p "$POOL"
expect_eq "pool status --json: device 1 state, data bytes" "$(status | jq -r '.devices[1] | "\(.state) \(.data)"')" "SPARE 0"
expect_eq "the pool's size is unchanged by a spare" "$(status | jq .size)" "$size0"
check "pool status (text) lists it as SPARE" bash -c "\"$TARN\" pool status -p \"$POOL\" | grep -q 'device 1  SPARE  $SPARE'"
expect_eq "pool state with a spare" "$(status | jq -r .state)" ONLINE

step "bad input: refused by name, nothing changed"
check_fails "dev add --spare of the same file again" "$TARN" dev add --spare "$SPARE" -p "$POOL"
case $LAST_OUT in *"already a spare"*) ok "the error says it is a spare already" ;; *) bad "error: $LAST_OUT" ;; esac
check_fails "dev add (as a member) of the spare" "$TARN" dev add "$SPARE" -p "$POOL"
check_fails "dev add --spare of the primary" "$TARN" dev add --spare "$POOL" -p "$POOL"
case $LAST_OUT in *"already a member"*) ok "the error says it is a member already" ;; *) bad "error: $LAST_OUT" ;; esac
OTHER=$T/other.img
make_pool "$OTHER" 64M
check_fails "dev add --spare of another pool's device" "$TARN" dev add --spare "$OTHER" -p "$POOL"
case $LAST_OUT in *"belongs to another pool"*) ok "the error names the other pool" ;; *) bad "error: $LAST_OUT" ;; esac
check_fails "dev add --spare of a 1 MiB file" "$TARN" dev add --spare "$T/small.img" --size 1M -p "$POOL"
case $LAST_OUT in *"too small"*) ok "the error says too small" ;; *) bad "error: $LAST_OUT" ;; esac
expect_eq "still two slots, device 1 a spare" "$(status | jq -r '[.devices[].state] | join(",")')" "ONLINE,SPARE"
check_fails "dev grow of a spare" "$TARN" dev grow 1 --size 1G -p "$POOL"
case $LAST_OUT in *"is a spare"*) ok "the error says it is a spare" ;; *) bad "error: $LAST_OUT" ;; esac

step "a full-speed writer past the pool's size: the spare is taken, no error"
# --end_fsync: NBD FLUSH at the end, so the kill -9 below may lose nothing.
rc=0; fio_job stream 600M --end_fsync=1 || rc=$?
expect_eq "fio write + verify of 600 MiB on a 256 MiB pool: exit, errors" "$rc $(jq '[.jobs[].error] | add' "$T/stream.json")" "0 0"
expect_eq "device 1 is a member now" "$(status | jq -r '.devices[1].state')" ONLINE
expect_between "device 1's data area (MiB)" "$(($(status | jq '.devices[1].data') / M))" 500 512
expect_eq "expansions counted" "$(status | jq '.expansion.expansions')" 1
check "the take is logged" grep -q "spare 1 ($SPARE) taken as a member" "$SERVE_LOG"
wait_until 10 grep -q '"kind":"expansion"' "$ALERTS" && ok "the take raised an expansion alert" ||
  bad "no expansion alert in $ALERTS: $(head -c 300 "$ALERTS" 2>/dev/null)"
expect_eq "no expansion alert for the spare's add (one alert in all)" "$(grep -c '"kind":"expansion"' "$ALERTS")" 1

step "kill -9 and reopen: the member stays, the data verifies"
kill9_serve
expect_eq "offline: device states" "$(status | jq -r '[.devices[].state] | join(",")')" "ONLINE,ONLINE"
pool_check "$POOL" "after kill -9"
start_serve "$POOL"
rc=0; fio_job reread 600M --verify_only=1 || rc=$?
expect_eq "fio verify-only after the restart" "$rc" 0
stop_serve

step "a missing spare: the pool opens without it and never takes it"
S2=$T/spare2.img
check "dev add --spare offline" "$TARN" dev add --spare "$S2" --size 128M -p "$POOL"
mv "$S2" "$S2.away"
expect_eq "status with the spare's file gone: state, device 2" "$(status | jq -r '"\(.state) \(.devices[2].state)"')" "ONLINE MISSING"
start_serve "$POOL" --expand-at 70 --expand-step 64M --expand-max 256M
rc=0; fio_job full 1200M --do_verify=0 || rc=$?
case $(jq -r '[.jobs[].error] | add' "$T/full.json" 2>/dev/null) in
  28) ok "with only a missing spare, writing past the end fails with ENOSPC (28)" ;;
  *) bad "past the end with a missing spare: exit $rc, $(grep -m1 -o 'error=[^,]*' "$T/full.out")" ;;
esac
expect_eq "the missing spare was not taken" "$(status | jq -r '.devices[2].state')" MISSING
stop_serve
pool_check "$POOL" "full, with a missing spare"

step "dev remove of a spare drops it and wipes its label"
mv "$S2.away" "$S2"
expect_eq "the spare is back: state" "$(status | jq -r '.devices[2].state')" SPARE
out=$(tarn dev remove 2 -p "$POOL" 2>&1) && ok "dev remove 2 (a spare)" || bad "dev remove 2: $out"
case $out in *"spare device 2"*dropped*"label is wiped"*) ok "it says the spare was dropped and wiped" ;; *) bad "answer: $out" ;; esac
expect_eq "slot 2 is REMOVED" "$(status | jq -r '.devices[2].state')" REMOVED
check_fails "pool status of the dropped spare's file: no pool" "$TARN" pool status -p "$S2"
check "the dropped file can be added as a spare again" "$TARN" dev add --spare "$S2" -p "$POOL"
expect_eq "as slot 3" "$(status | jq -r '.devices[3].state')" SPARE
pool_check "$POOL" "after the drop"
e2e_finish
