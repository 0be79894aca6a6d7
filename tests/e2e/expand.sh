#!/usr/bin/env bash
# Expansion ahead of the writer (issue "pool elasticity" item 3): a pool
# on a 256 MiB file with `serve --expand-at 70 --expand-step 256M
# --expand-max`, written by fio sequentially at full speed (QD8) with
# crc32c verify past its first size: no error, the file and the pool
# grew, a restart opens the grown pool and the data verifies. At the
# limit: ENOSPC on holes only (an overwrite still works), the checker
# clean. Bad expansion options are refused by name.
. "$(dirname "$0")/lib.sh"
need fio qemu-io jq
e2e_init expand

M=$((1 << 20))
POOL=$T/pool.img
make_pool "$POOL" 256M
make_vol "$POOL" v 3G

fio_job() { # NAME SIZE [fio options...]: sequential 1M QD8 writes of SIZE with crc32c verify
  local name=$1 size=$2; shift 2
  (cd "$T" && timeout 300 fio --name="$name" --ioengine=nbd --uri="$(uri v)" --rw=write --bs=1M --iodepth=8 \
    --size="$size" --verify=crc32c --output-format=json --output="$T/$name.json" "$@") >"$T/$name.out" 2>&1
}

step "a full-speed sequential writer past the pool's size: it grows ahead, no error"
ALERTS=$T/alerts.jsonl
start_serve "$POOL" --expand-at 70 --expand-step 256M --expand-max 1536M --alert-exec "cat >>$ALERTS"
rc=0; fio_job stream 1200M || rc=$?
expect_eq "fio write + verify of 1200 MiB on a 256 MiB pool: exit, errors" "$rc $(jq '[.jobs[].error] | add' "$T/stream.json")" "0 0"
grew=$(tarn pool status -p "$POOL" --json | jq '.expansion.expansions')
expect_between "expansions done (256 MiB each)" "$grew" 4 5
expect_between "the pool file grew (MiB)" "$(($(stat -c %s "$POOL") / M))" 1280 1536
check "the growth is logged" grep -q "pool expanded: device 0 grew" "$SERVE_LOG"
wait_until 10 grep -q '"kind":"expansion"' "$ALERTS" && ok "the growth raised an expansion alert (--alert-exec)" ||
  bad "no expansion alert in $ALERTS: $(head -c 300 "$ALERTS" 2>/dev/null)"
stop_serve
pool_check "$POOL" "after expansion"

step "restart: the grown pool opens and the data verifies"
start_serve "$POOL"
rc=0; fio_job reread 1200M --verify_only=1 || rc=$?
expect_eq "fio verify-only after the restart" "$rc" 0
stop_serve

step "at the limit: ENOSPC on holes only, overwrites work"
start_serve "$POOL" --expand-at 70 --expand-step 256M --expand-max 1536M
rc=0; fio_job beyond 2000M --do_verify=0 || rc=$?
case $(jq -r '[.jobs[].error] | add' "$T/beyond.json" 2>/dev/null) in
  28) ok "writing past the limit fails with ENOSPC (28)" ;;
  *) bad "writing past the limit: exit $rc, $(grep -m1 -o 'error=[^,]*' "$T/beyond.out")" ;;
esac
expect_eq "the pool file stopped at the limit" "$(stat -c %s "$POOL")" $((1536 * M))
check "an overwrite at the full limit still works" qemu-io -f raw -c "write -P 7 0 1M" "$(uri v)"
check "and reads back" qemu-io -f raw -c "read -P 7 0 1M" "$(uri v)"
stop_serve
pool_check "$POOL" "at the limit"

step "tarn dev grow by hand: offline, then online while fio writes and verifies"
G2=$T/grow.img
make_pool "$G2" 256M
check "dev grow 0 --size 512M offline" "$TARN" dev grow 0 --size 512M -p "$G2"
expect_eq "the pool file is 512 MiB" "$(stat -c %s "$G2")" $((512 * M))
check_fails "a smaller size is refused" "$TARN" dev grow 0 --size 128M -p "$G2"
check_fails "an unknown member is refused" "$TARN" dev grow 5 --size 1G -p "$G2"
make_vol "$G2" g 1G
start_serve "$G2"
gfio() { # NAME OFFSET SIZE [fio options...]: 1M sequential writes with crc32c verify
  local name=$1 off=$2 size=$3; shift 3
  (cd "$T" && timeout 300 fio --name="$name" --ioengine=nbd --uri="$(uri g)" --rw=write --bs=1M --iodepth=8 \
    --offset="$off" --size="$size" --verify=crc32c --output-format=json --output="$T/$name.json" "$@" \
    >"$T/$name.out" 2>&1; echo $? >"$T/$name.rc")
}
# The first 300 MiB (room enough before the growth) while the member grows;
# then 400 MiB past the old end.
gfio g1 0 300M --rate=100m &
fio_pid=$!
sleep 1
check "dev grow 0 --size 1G online, while fio writes" "$TARN" dev grow 0 --size 1G -p "$G2"
wait $fio_pid
expect_eq "fio during the growth, verified (exit, errors)" "$(cat "$T/g1.rc") $(jq '[.jobs[].error] | add' "$T/g1.json")" "0 0"
gfio g2 300M 400M
expect_eq "fio past the old size, verified (exit, errors)" "$(cat "$T/g2.rc") $(jq '[.jobs[].error] | add' "$T/g2.json")" "0 0"
stop_serve
pool_check "$G2" "after dev grow"

step "bad expansion options are refused by name"
for args in "--expand-at 0 --expand-max 2G" "--expand-at 100 --expand-max 2G" "--expand-at 70" \
  "--expand-at 70 --expand-max 2G --expand-step 4K" "--expand-max 2G"; do
  # shellcheck disable=SC2086 # the words of args on purpose
  check_fails "tarn serve $args" "$TARN" serve -p "$POOL" --listen "127.0.0.1:$(free_port)" $args
  case $LAST_OUT in *expan*) ok "the error names the expansion option" ;; *) bad "error for $args: $LAST_OUT" ;; esac
done
e2e_finish
