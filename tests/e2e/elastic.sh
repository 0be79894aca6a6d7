#!/usr/bin/env bash
# Pool elasticity (issue 12, `tarn dev add`): fio verify=crc32c over NBD
# while a device is added to the served pool through the control socket,
# then writes that only fit with the new device's space (they land there),
# a verify-only pass after a server restart, the checker clean; an offline
# add; a full pool (ENOSPC on holes only; WRITE_ZEROES, TRIM, vol delete
# and dev add at 100%; the writer resumes) with usage and expansion alerts
# through --alert-exec and tarn_alerts_total; every bad input refused with
# a clear error and the pool unchanged.
. "$(dirname "$0")/lib.sh"
need fio jq losetup qemu-io curl
need_root "a read-only loop device for the bad-input case"
need_loop
e2e_init elastic

POOL=$T/pool.img
make_pool "$POOL" 64M
make_vol "$POOL" v 512M
start_serve "$POOL"

devices() { tarn pool status -p "$POOL" --json | jq '.devices | length'; }
dev_free() { tarn pool status -p "$POOL" --json | jq ".devices[$1].free"; }
clean() { tarn pool check -p "$POOL" --json | jq -e '.clean' >/dev/null; }

# fio_job NAME RW BS OFFSET SIZE [extra lines]: a verify=crc32c job file
fio_job() {
  cat >"$T/$1.fio" <<JOB
[global]
ioengine=nbd
uri=@URI@
rw=$2
bs=$3
offset=$4
size=$5
iodepth=16
verify=crc32c
verify_fatal=1
do_verify=1
randseed=12
[$1]
${6:-}
JOB
}

# fio_run_file NAME: the job for the server running now (its port changes)
fio_run_file() { sed "s|@URI@|$(uri v)|" "$T/$1.fio" >"$T/$1.run.fio"; echo "$T/$1.run.fio"; }

# run_fio NAME: fio exits non-zero on a verify error; the JSON says how much
run_fio() {
  local rc=0 job
  job=$(fio_run_file "$1")
  (cd "$T" && timeout 600 fio --output-format=json --output="$T/$1.json" "$job") >"$T/$1.out" 2>&1 || rc=$?
  if [ $rc -ne 0 ]; then bad "fio $1 exit $rc"; tail -n 8 "$T/$1.out" | sed 's/^/       | /'; return 0; fi
  local errs w r
  errs=$(jq '[.jobs[].error] | add' "$T/$1.json")
  w=$(jq '[.jobs[].write.io_bytes] | add' "$T/$1.json")
  r=$(jq '[.jobs[].read.io_bytes] | add' "$T/$1.json")
  expect_eq "fio $1: no errors (wrote $(mib "$w"), verified $(mib "$r"))" "$errs" 0
}

step "fio randwrite 4k verify on 40M while dev add runs (online, control socket)"
fio_job during randwrite 4k 0 40M "loops=4"
job=$(fio_run_file during)
(cd "$T" && timeout 600 fio --output-format=json --output="$T/during.json" "$job") >"$T/during.out" 2>&1 &
FIO=$!
E2E_PIDS+=("$FIO")
check "tarn dev add d1.img --size 128M (served pool)" tarn dev add "$T/d1.img" --size 128M -p "$POOL"
if kill -0 "$FIO" 2>/dev/null; then say "  (fio was still writing when the add returned)"; else say "  (fio ended before the add returned)"; fi
rc=0; wait "$FIO" || rc=$?
expect_eq "fio during the add exited 0" "$rc" 0
expect_eq "fio during the add: no job errors" "$(jq '[.jobs[].error] | add' "$T/during.json")" 0
expect_eq "the served pool has 2 devices" "$(devices)" 2
grep -q "added as member 1" "$SERVE_LOG" && ok "the server logged the add" || bad "no 'added as member 1' in the server log"

step "write 120M more than device 0 holds: it lands on the new device"
d1_before=$(dev_free 1)
fio_job after write 1M 64M 120M
run_fio after
d1_after=$(dev_free 1)
if [ "$d1_after" -lt $((d1_before - 50 * 1048576)) ]; then ok "device 1 took the data ($(mib $((d1_before - d1_after))))"
else bad "device 1 free went from $d1_before to $d1_after"; fi

step "restart the server: a verify-only pass reads everything back"
stop_serve
check "pool check clean after the online add" clean
start_serve "$POOL"
for j in during after; do
  sed -i 's/^do_verify=1/do_verify=1\nverify_only=1/' "$T/$j.fio"
  run_fio "$j"
done
stop_serve

step "offline add (pool not served)"
check "tarn dev add d2.img --size 64M (offline)" tarn dev add "$T/d2.img" --size 64M -p "$POOL"
expect_eq "the pool has 3 devices" "$(devices)" 3
check "pool check clean after the offline add" clean

step "a full pool: ENOSPC on holes only; WRITE_ZEROES, TRIM, vol delete and dev add at 100%; writers resume"
M=$((1 << 20))
FULL=$T/full.img
make_pool "$FULL" 64M
make_vol "$FULL" f 1G
make_vol "$FULL" g 64M
MPORT=$(free_port)
ALERTS=$T/alerts.jsonl
start_serve "$FULL" --alert-at 50,75 --alert-exec "cat >>$ALERTS" --metrics "127.0.0.1:$MPORT"
qio() { timeout 120 qemu-io -f raw "$@"; }
check "g holds 4M" qio "$(uri g)" -c "write -P 0x33 0 4M" -c flush
# fill_enospc START PATTERN: 4M, then 64k, then 4k writes into f's holes
# from START until the pool refuses; sets FILLED and ENOSPC_MSG
fill_enospc() {
  local at=$1 pat=$2 chunk out
  FILLED=0; ENOSPC_MSG=
  for chunk in $((4 * M)) 65536 4096; do
    while [ $FILLED -lt $((1 << 30)) ]; do
      if out=$(qio "$(uri f)" -c "write -P $pat $at $chunk" -c flush 2>&1) && ! grep -qi 'error\|failed' <<<"$out"; then
        at=$((at + chunk)); FILLED=$((FILLED + chunk))
      else
        ENOSPC_MSG=$out; break
      fi
    done
  done
}
fill_enospc 0 0x5e
say "  wrote $(mib $FILLED) into f before the pool refused"
grep -qi 'no space left' <<<"$ENOSPC_MSG" && ok "the first refused write is ENOSPC" || bad "filling failed, not with ENOSPC: $(tr '\n' ' ' <<<"$ENOSPC_MSG" | cut -c1-200)"
check_fails "a 4k write into a hole fails at 100%" qio "$(uri f)" -c "write -P 1 $((900 * M)) 4k"
grep -qi 'no space left' <<<"$LAST_OUT" && ok "  with ENOSPC" || bad "  not ENOSPC: $LAST_OUT"
check "overwriting allocated blocks works at 100%" qio "$(uri f)" -c "write -P 0x61 0 1M" -c flush -c "read -P 0x61 0 1M"
check "WRITE_ZEROES works at 100%" qio "$(uri f)" -c "write -z 1M 1M" -c flush -c "read -P 0 1M 1M"
check "TRIM works at 100%" qio "$(uri f)" -c "discard 2M 2M" -c flush
check "vol delete g works at 100% (served)" tarn vol delete g -p "$FULL"
fill_enospc $((900 * M)) 0x62
say "  refilled $(mib $FILLED) of holes to 100% again"
check_fails "full again: a hole write fails" qio "$(uri f)" -c "write -P 1 $((950 * M)) 4k"
alert_seen() { [ -s "$ALERTS" ] && jq -e "select($1)" "$ALERTS" >/dev/null; }
wait_until 30 alert_seen '.kind == "usage" and .threshold_percent == 75' &&
  ok "--alert-exec got the 75% usage alert: $(jq -c 'select(.kind == "usage")' "$ALERTS" | tail -1 | cut -c1-160)" ||
  bad "no 75% usage alert in $ALERTS: $(cat "$ALERTS" 2>/dev/null | cut -c1-300)"
check "dev add works at 100% (served)" tarn dev add "$T/full2.img" --size 64M -p "$FULL"
wait_until 30 alert_seen '.kind == "expansion" and .devices == 2' &&
  ok "--alert-exec got the expansion alert" || bad "no expansion alert in $ALERTS"
metric() { curl -s "http://127.0.0.1:$MPORT/metrics" | awk -v k="$1" '$1 == k { print $2 }'; }
n=$(metric 'tarn_alerts_total{kind="usage"}')
[ "${n:-0}" -ge 1 ] && ok "tarn_alerts_total{kind=\"usage\"} = $n" || bad "tarn_alerts_total{kind=\"usage\"} is '${n}'"
expect_eq 'tarn_alerts_total{kind="expansion"}' "$(metric 'tarn_alerts_total{kind="expansion"}')" 1
grep -q 'alert: .*kind.*usage' "$SERVE_LOG" && ok "the usage alert is logged" || bad "no usage alert in the server log"
check "the writer resumes on the new space: 32M into holes" qio "$(uri f)" -c "write -P 0x63 $((960 * M)) 32M" -c flush -c "read -P 0x63 $((960 * M)) 32M"
check "earlier data intact" qio "$(uri f)" -c "read -P 0x61 0 1M" -c "read -P 0 1M 1M" -c "read -P 0x5e 4M 4M"
stop_serve
pool_check "$FULL" "full pool after ENOSPC, zeroes, trim, delete and add"

step "bad input: a clear error, the pool unchanged (served)"
start_serve "$POOL"
tarn pool create "$T/other.img" --size 64M >/dev/null
truncate -s 64M "$T/ro.img"
RO=$(losetup -r -f --show "$T/ro.img")
E2E_LOOPS+=("$RO")
refuse() { # refuse DESC PATTERN ARGS...
  local desc=$1 pat=$2; shift 2
  check_fails "dev add refuses $desc" tarn dev add "$@" -p "$POOL"
  if grep -q -- "$pat" <<<"$LAST_OUT"; then ok "  the error names it: $pat"; else bad "  error for $desc lacks '$pat': $LAST_OUT"; fi
}
refuse "a device of another pool" "belongs to another pool" "$T/other.img"
refuse "a device already in this pool" "already a member" "$T/d1.img"
refuse "the primary" "already a member" "$POOL"
refuse "a too small device" "too small" "$T/tiny.img" --size 1M
[ -e "$T/tiny.img" ] && bad "the refused file dev add created was left behind" || ok "the refused file dev add created is gone"
refuse "a read-only device" "read-only" "$RO"
refuse "a missing file without --size" "does not exist" "$T/nothing.img"
expect_eq "still 3 devices" "$(devices)" 3
stop_serve
for a in 0 100 90,80 x; do
  check_fails "serve refuses --alert-at $a" timeout 30 "$TARN" serve -p "$POOL" --socket "$T/bad.sock" --no-tcp --alert-at "$a"
  grep -q -- "--alert-at" <<<"$LAST_OUT" && ok "  the error names --alert-at: $(tail -1 <<<"$LAST_OUT" | cut -c1-120)" || bad "  error lacks --alert-at: $LAST_OUT"
done
check "pool check clean after the refusals" clean
e2e_finish
