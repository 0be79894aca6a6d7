#!/usr/bin/env bash
# Prometheus metrics: `tarn serve --metrics ADDR` serves /metrics in the
# text format; after a known qemu-io workload the export's counters equal
# what was sent, promtool accepts the scrape, pool figures and a scrub's
# progress follow, a stalled scraper holds up no I/O, a degraded mirror
# shows as such while fio writes and scrapes answer promptly, and bad or
# busy addresses fail the start with the address named.
. "$(dirname "$0")/lib.sh"
need qemu-io curl promtool nbdinfo fio
e2e_init metrics

POOL=$T/pool.img
make_pool "$POOL" 256M
make_vol "$POOL" disk0 64M
MPORT=$(free_port)
MURL=http://127.0.0.1:$MPORT/metrics
start_serve "$POOL" --metrics "127.0.0.1:$MPORT"
grep -q "metrics on http://127.0.0.1:$MPORT/metrics" "$SERVE_LOG" && ok "the server names its metrics address" \
  || bad "no metrics address in the server log: $(tail -n 3 "$SERVE_LOG" | tr '\n' ' ')"

# metric NAME{LABELS}: the value of one series in the last scrape
metric() { awk -v k="$1" '$1 == k { print $2 }' "$T/scrape.txt"; }
scrape() { curl -sf -m 10 -o "$T/scrape.txt" "$MURL"; }

step "a known workload, counted"
# qemu-io sends each command as one request (1 MiB is under its 32 MiB
# request limit), so the counts are exact.
check "qemu-io: two writes (1 MiB + 64 KiB), a read, a trim" qemu-io -f raw "$(uri disk0)" \
  -c 'write -P 1 0 1M' -c 'write -P 2 2M 64k' -c 'read -P 1 0 1M' -c 'discard 4M 128k' -c 'flush'
check "scrape /metrics" scrape
expect_eq "write requests of disk0" "$(metric 'tarn_export_requests_total{export="disk0",op="write"}')" 2
expect_eq "bytes written to disk0" "$(metric 'tarn_export_bytes_total{export="disk0",op="write"}')" 1114112
expect_eq "read requests of disk0" "$(metric 'tarn_export_requests_total{export="disk0",op="read"}')" 1
expect_eq "bytes read from disk0" "$(metric 'tarn_export_bytes_total{export="disk0",op="read"}')" 1048576
expect_eq "bytes trimmed on disk0" "$(metric 'tarn_export_bytes_total{export="disk0",op="trim"}')" 131072
expect_eq "write errors of disk0" "$(metric 'tarn_export_errors_total{export="disk0",op="write"}')" 0
expect_eq "write latencies observed" "$(metric 'tarn_export_request_duration_seconds_count{export="disk0",op="write"}')" 2
expect_eq "every write under the +Inf bucket" \
  "$(metric 'tarn_export_request_duration_seconds_bucket{export="disk0",op="write",le="+Inf"}')" 2
flushes=$(metric 'tarn_export_requests_total{export="disk0",op="flush"}')
[ "${flushes:-0}" -ge 1 ] && ok "flushes counted ($flushes)" || bad "flushes not counted: '$flushes'"

step "the exposition format"
if promtool check metrics <"$T/scrape.txt" >"$T/promtool.log" 2>&1; then ok "promtool check metrics accepts the scrape"
else bad "promtool check metrics: $(head -5 "$T/promtool.log" | tr '\n' ' ')"; fi
ctype=$(curl -s -m 10 -o /dev/null -w '%{content_type}' "$MURL")
expect_eq "content type" "$ctype" "text/plain; version=0.0.4; charset=utf-8"
expect_eq "another path is 404" "$(curl -s -m 10 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$MPORT/")" 404

step "pool figures"
# The status copy is refreshed every 2 s; the flush above committed.
wait_until 10 sh -c "curl -sf -m 5 '$MURL' | awk '\$1 == \"tarn_pool_used_bytes\" && \$2 >= 1048576 { f = 1 } END { exit !f }'" \
  && ok "pool used bytes cover the data written" || bad "tarn_pool_used_bytes never reached 1 MiB"
check "scrape /metrics again" scrape
commits=$(metric tarn_pool_commits_total)
[ "${commits:-0}" -ge 1 ] && ok "commits counted ($commits)" || bad "commits not counted: '$commits'"
# the flush committed: its duration is observed; every commit counted is
# one observation (a commit running while the scrape reads the two may
# be counted in one and not yet in the other: +-1)
timed=$(metric tarn_pool_commit_duration_seconds_count)
inf=$(metric 'tarn_pool_commit_duration_seconds_bucket{le="+Inf"}')
csum=$(metric tarn_pool_commit_duration_seconds_sum)
if [ "${timed:-0}" -ge 1 ] && [ "$inf" = "$timed" ] && [ "$timed" -ge $((commits - 1)) ] && [ "$timed" -le $((commits + 1)) ] &&
   awk -v s="$csum" 'BEGIN { exit !(s > 0 && s < 60) }'; then
  ok "commit durations observed ($timed commits, $csum s in all)"
else bad "commit duration histogram: count '$timed', +Inf '$inf', sum '$csum', commits $commits"; fi
expect_eq "pool not degraded" "$(metric tarn_pool_degraded)" 0
expect_eq "device 0 online" "$(grep -c '^tarn_device_state{device="0",.*state="ONLINE"} 1$' "$T/scrape.txt")" 1
for m in tarn_pool_free_bytes tarn_pool_reserved_bytes tarn_pool_overcommit_ratio tarn_pool_metadata_cache_hit_ratio \
  tarn_pool_checksum_errors_total tarn_pool_resync_pending_regions; do
  [ -n "$(metric "$m")" ] && ok "$m exported ($(metric "$m"))" || bad "$m missing"
done

step "scrub progress"
check "tarn pool scrub through the server" tarn pool scrub -p "$POOL"
check "scrape after the scrub" scrape
expect_eq "no scrub running" "$(metric 'tarn_operations_running{op="scrub"}')" 0
total=$(metric 'tarn_operation_total_blocks{op="scrub"}')
[ "${total:-0}" -gt 0 ] && ok "scrub total reported ($total blocks)" || bad "no scrub total: '$total'"
expect_eq "scrub done = total" "$(metric 'tarn_operation_done_blocks{op="scrub"}')" "$total"

step "a stalled scraper holds up no I/O"
# A client that connects and sends nothing occupies the (single) metrics
# thread until its read timeout; NBD requests must not wait for it.
exec 3<>"/dev/tcp/127.0.0.1/$MPORT"
check "qemu-io writes while a scrape is stalled" timeout 10 qemu-io -f raw "$(uri disk0)" -c 'write -P 3 8M 256k'
exec 3>&-
check "scrape after the stalled client" scrape
expect_eq "the write while stalled counted" "$(metric 'tarn_export_requests_total{export="disk0",op="write"}')" 3
stop_serve

step "a degraded mirror, scraped while busy"
A=$T/legA.img
B=$T/legB.img
check "tarn pool create A --mirror B" tarn pool create "$A" --mirror "$B" --size 128M
make_vol "$A" v 32M
truncate -s 0 "$B"
MPORT=$(free_port)
MURL=http://127.0.0.1:$MPORT/metrics
start_serve "$A" --metrics "127.0.0.1:$MPORT"
bg fio --name=busy --ioengine=nbd --uri="$(uri v)" --rw=randwrite --bs=4k --iodepth=8 --size=32M \
  --rate_iops=2000 --time_based --runtime=4 --output="$T/fio.log"
FIO_PID=$!
slow=0
for i in $(seq 1 8); do
  # A scrape waits for no commit: each answers well under the timeout.
  curl -sf -m 3 -o "$T/scrape.txt" "$MURL" || slow=$((slow + 1))
  sleep 0.4
done
expect_eq "scrapes during random writes that failed or took over 3 s" "$slow" 0
rc=0; wait "$FIO_PID" || rc=$?
expect_eq "fio random writes during the scrapes (exit)" "$rc" 0
wait_until 10 sh -c "curl -sf -m 5 -o '$T/scrape.txt' '$MURL' && grep -q '^tarn_pool_degraded 1$' '$T/scrape.txt'" \
  && ok "the pool reported degraded" || bad "tarn_pool_degraded never 1: $(grep '^tarn_pool_degraded' "$T/scrape.txt")"
expect_eq "leg 1 reported missing" "$(grep -c '^tarn_mirror_leg_state{device="0",leg="1",state="MISSING"} 1$' "$T/scrape.txt")" 1
writes=$(metric 'tarn_export_requests_total{export="v",op="write"}')
[ "${writes:-0}" -gt 0 ] && ok "writes to the degraded pool counted ($writes)" || bad "no writes counted on v: '$writes'"
if promtool check metrics <"$T/scrape.txt" >"$T/promtool.log" 2>&1; then ok "promtool accepts the degraded pool's scrape"
else bad "promtool check metrics: $(head -5 "$T/promtool.log" | tr '\n' ' ')"; fi
stop_serve

step "bad metrics addresses fail the start, naming the address"
check_fails "an invalid address" tarn serve -p "$POOL" --listen "127.0.0.1:$(free_port)" --metrics 256.0.0.1:1
grep -q "256.0.0.1:1" <<<"$LAST_OUT" && ok "the error names 256.0.0.1:1" || bad "error does not name the address: $LAST_OUT"
BUSY=$(free_port)
bg "$SYSPY" -c "import socket,time;s=socket.socket();s.bind(('127.0.0.1',$BUSY));s.listen();time.sleep(60)"
wait_until 10 "$SYSPY" -c "import socket;socket.create_connection(('127.0.0.1',$BUSY)).close()" || bad "port holder did not start"
check_fails "an address in use" tarn serve -p "$POOL" --listen "127.0.0.1:$(free_port)" --metrics "127.0.0.1:$BUSY"
grep -q "127.0.0.1:$BUSY" <<<"$LAST_OUT" && ok "the error names 127.0.0.1:$BUSY" || bad "error does not name the address: $LAST_OUT"
check "the pool still checks clean" tarn pool check -p "$POOL"

e2e_finish
