#!/usr/bin/env bash
# A throwaway single-node Ceph cluster for tests and benchmarks: one monitor
# and one OSD on memstore (data in RAM), no manager, no authentication,
# replication 1, everything under DIR. Needs the packages scripts/deps.sh
# installs (ceph-mon, ceph-osd).
#   bash scripts/ceph.sh start DIR [POOL...]   # prints the ceph.conf path
#   bash scripts/ceph.sh stop DIR              # kills the daemons, removes DIR
# Env: CEPH_MEMSTORE_BYTES (default 3 GiB: the OSD's RAM budget);
#   CEPH_BLUESTORE_BYTES: an OSD on bluestore over a sparse file of that size
#   under DIR instead (for data larger than RAM; memstore holds about twice
#   its data in RAM).
# Exit non-zero, with the daemon log tail, when the cluster does not come up
# within a bounded wait (tests that need it must fail, not pass).
set -euo pipefail

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: ceph.sh start|stop DIR [POOL...]" >&2; exit 2; }
shift 2

stop() {
  # The cluster is thrown away: SIGKILL at once (a memstore OSD would
  # otherwise write all its data to disk on the way out). The pids are read
  # before the signal, since a daemon removes its pid file as it exits.
  local pids=() f
  for f in "$dir"/run/*.pid; do
    [ -f "$f" ] && pids+=("$(cat "$f")")
  done
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  done
  rm -rf "$dir"
}

fail() {
  echo "ceph.sh: $*" >&2
  for l in "$dir"/log/*.log; do
    [ -f "$l" ] && { echo "--- $l" >&2; tail -n 15 "$l" >&2; }
  done
  [ -n "${CEPH_KEEP:-}" ] || stop
  exit 1
}

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# The OSD's object store lines of ceph.conf.
objectstore_conf() {
  if [ -n "${CEPH_BLUESTORE_BYTES:-}" ]; then
    printf '%s\n' "osd_objectstore = bluestore" "bluestore_block_path = $dir/osd/block" \
      "bluestore_block_size = $CEPH_BLUESTORE_BYTES" "bluestore_block_create = true" \
      "bluestore_block_db_create = false" "bluestore_block_wal_create = false"
  else
    printf '%s\n' "osd_objectstore = memstore" "memstore_device_bytes = ${CEPH_MEMSTORE_BYTES:-3221225472}"
  fi
}

start() {
  for t in ceph-mon ceph-osd monmaptool ceph uuidgen; do
    command -v "$t" >/dev/null || { echo "ceph.sh: $t not found (bash scripts/deps.sh installs it)" >&2; exit 1; }
  done
  mkdir -p "$dir"/{mon,osd,run,log}
  dir=$(cd "$dir" && pwd)
  local fsid port conf osd_uuid
  fsid=$(uuidgen); osd_uuid=$(uuidgen); port=$(free_port)
  conf=$dir/ceph.conf
  cat >"$conf" <<EOF
[global]
fsid = $fsid
mon_host = v1:127.0.0.1:$port
public_addr = 127.0.0.1
ms_bind_msgr2 = false
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
osd_pool_default_size = 1
osd_pool_default_min_size = 1
mon_allow_pool_size_one = true
mon_allow_pool_delete = true
mon_warn_on_pool_no_redundancy = false
osd_pool_default_pg_autoscale_mode = off
osd_crush_chooseleaf_type = 0
paxos_propose_interval = 0.01
run_dir = $dir/run
log_file = $dir/log/\$name.log
crash_dir = $dir/log
keyring = /dev/null
# only the daemons: clients (tarn, rados) make neither pid files (which
# "stop" kills by) nor admin sockets (which would clash between clients)
[client]
admin_socket =
log_file = $dir/log/client.log
[mon]
pid_file = $dir/run/\$name.pid
admin_socket = $dir/run/\$name.asok
mon_data = $dir/mon/\$id
[osd]
pid_file = $dir/run/\$name.pid
admin_socket = $dir/run/\$name.asok
osd_data = $dir/osd/\$id
$(objectstore_conf)
osd_op_num_shards = 1
osd_op_num_threads_per_shard = 2
EOF
  monmaptool --create --fsid "$fsid" --addv a "[v1:127.0.0.1:$port]" "$dir/monmap" >/dev/null
  ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" >/dev/null 2>&1 || fail "ceph-mon --mkfs failed"
  ceph-mon -c "$conf" -i a 2>>"$dir/log/daemons.stderr" || fail "ceph-mon did not start"
  local osd
  # A command can reach a just-started monitor before its monmap settles
  # ("handle_command on fsid 0000..."): retry a bounded number of times.
  osd=
  for _ in 1 2 3 4 5; do
    osd=$(timeout 20 ceph -c "$conf" --connect-timeout 10 osd new "$osd_uuid" 2>/dev/null) && break
    osd=; sleep 0.5
  done
  [ -n "$osd" ] || fail "ceph osd new: no monitor answer"
  mkdir -p "$dir/osd/$osd"
  ceph-osd -c "$conf" -i "$osd" --mkfs --osd-uuid "$osd_uuid" >/dev/null 2>&1 || fail "ceph-osd --mkfs failed"
  # The OSD's first monitor command can race its monmap ("wrong fsid",
  # seen about 1 start in 5 here): retry a bounded number of times.
  local started=0
  for _ in 1 2 3 4 5; do
    if ceph-osd -c "$conf" -i "$osd" 2>>"$dir/log/daemons.stderr"; then started=1; break; fi
    sleep 0.2
  done
  [ $started = 1 ] || fail "ceph-osd did not start"
  local up=0
  for _ in $(seq 1 300); do
    if timeout 10 ceph -c "$conf" --connect-timeout 5 osd dump 2>/dev/null | grep -q "^osd.$osd up"; then up=1; break; fi
    sleep 0.1
  done
  [ $up = 1 ] || fail "osd.$osd not up after 30 s"
  for pool in "$@"; do
    timeout 30 ceph -c "$conf" osd pool create "$pool" 8 8 >/dev/null 2>&1 || fail "ceph osd pool create $pool failed"
    # the PGs are active once a write goes through
    timeout 60 rados -c "$conf" -p "$pool" put ceph.sh.probe "$conf" || fail "pool $pool: first write did not complete"
    rados -c "$conf" -p "$pool" rm ceph.sh.probe
  done
  echo "$conf"
}

case "$cmd" in
  start) start "$@" ;;
  stop) stop ;;
  *) echo "usage: ceph.sh start|stop DIR [POOL...]" >&2; exit 2 ;;
esac
