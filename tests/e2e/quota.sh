#!/usr/bin/env bash
# Quotas and the overcommit guard (issue 12 item 6). A volume with a quota
# written over NBD by fio and qemu-io: writes to holes past the quota fail
# with ENOSPC (nbd error 28), overwrites in place, TRIM and WRITE_ZEROES
# still work, snapshot bytes count, and the writer resumes when space is
# freed (TRIM, snapshot delete) or the quota is raised online (`vol set`
# over the control socket). With `serve --expand-at` a quota refusal does
# not grow the pool. The overcommit ratio refuses creating and growing
# past it unless --force. Bad inputs are refused by name and change
# nothing; the quota and the ratio survive a restart; `pool check` clean.
. "$(dirname "$0")/lib.sh"
need fio qemu-io jq
e2e_init quota

M=$((1 << 20))
POOL=$T/pool.img
make_pool "$POOL" 256M
check "vol create q --size 64M --quota 8M" tarn vol create q --size 64M --quota 8M -p "$POOL"

qio() { timeout 60 qemu-io -f raw "$(uri q)" "$@"; }
# enospc DESC qemu-io-args...: the command must fail with ENOSPC
enospc() {
  local desc=$1; shift
  check_fails "$desc" qio "$@"
  case $LAST_OUT in *"No space left on device"*) ok "  ... with ENOSPC" ;; *) bad "$desc: not ENOSPC: $LAST_OUT" ;; esac
}
used_is() { # WANT_MIB DESC
  vol_get "$POOL" q used
  expect_eq "$2: used" "$VAL" $(($1 * M))
}

step "fio writes up to the quota: ENOSPC (28), used stops exactly at the quota"
start_serve "$POOL"
rc=0
(cd "$T" && timeout 120 fio --name=fill --ioengine=nbd --uri="$(uri q)" --rw=write --bs=1M --iodepth=4 \
  --size=16M --output-format=json --output="$T/fill.json") >"$T/fill.out" 2>&1 || rc=$?
expect_eq "fio past an 8 MiB quota: error" "$(jq -r '[.jobs[].error] | add' "$T/fill.json" 2>/dev/null)" 28
used_is 8 "after the fill"
vol_get "$POOL" q quota
expect_eq "vol list --json quota" "$VAL" $((8 * M))
check "vol list text shows the quota" sh -c "'$TARN' vol list -p '$POOL' | grep -E '^q .*8.00 MiB'"
# Which 8 of fio's 16 writes got in depends on their order at QD4: start
# the rest from a known layout, 0-8M written.
check "TRIM of everything fio wrote" qio -c "discard 0 16M"
used_is 0 "after the TRIM"
check "qemu-io fills 0-8M to the quota, one write at a time" qio -c "write -P 6 0 8M"
used_is 8 "after the refill"

step "at the quota: holes refused, overwrites, TRIM and WRITE_ZEROES work"
check "an overwrite in place works" qio -c "write -P 7 0 1M" -c "read -P 7 0 1M"
enospc "a write to a hole is refused" -c "write -P 8 $((8 * M)) 4k"
check "TRIM works at the quota" qio -c "discard 0 1M"
used_is 7 "after TRIM"
check "the writer resumes in the freed space" qio -c "write -P 9 $((8 * M)) 1M" -c "read -P 9 $((8 * M)) 1M"
check "WRITE_ZEROES (no hole: in place) works at the quota" qio -c "write -z $((1 * M)) 1M" -c "read -P 0 $((1 * M)) 1M"
used_is 8 "after WRITE_ZEROES in place"
check "WRITE_ZEROES that may unmap works at the quota" qio -c "write -z -u $((1 * M)) 1M" -c "read -P 0 $((1 * M)) 1M"
used_is 7 "after WRITE_ZEROES with unmap"
check "a hole again takes the freed 1 MiB" qio -c "write -P 10 $((9 * M)) 1M"
used_is 8 "full again"

step "snapshot bytes count; raising the quota or deleting the snapshot lets the writer resume"
check "snap create q@s1 (online)" tarn snap create q@s1 -p "$POOL"
enospc "overwriting a block the snapshot keeps is refused" -c "write -P 11 $((2 * M)) 1M"
check "the snapshot's data is intact" qio -c "read -P 0 $((1 * M)) 1M"
check "vol set q --quota 9M (online, over the control socket)" tarn vol set q --quota 9M -p "$POOL"
check "the overwrite now works" qio -c "write -P 11 $((2 * M)) 1M" -c "read -P 11 $((2 * M)) 1M"
used_is 9 "head + snapshot"
vol_get "$POOL" q snapshot_bytes
expect_eq "the snapshot holds 1 MiB" "$VAL" $((1 * M))
enospc "at the raised quota, a hole is refused again" -c "write -P 12 $((10 * M)) 1M"
check "snap delete q@s1" tarn snap delete q@s1 -p "$POOL"
check "the writer resumes after the snapshot delete" qio -c "write -P 12 $((10 * M)) 1M" -c "read -P 12 $((10 * M)) 1M"
used_is 9 "after the delete and the write"

step "bad inputs are refused by name, nothing changed"
before=$(tarn vol list -p "$POOL" --json)
check_fails "a quota below use (4M < 9M)" tarn vol set q --quota 4M -p "$POOL"
case $LAST_OUT in *"below its current use"*) ok "  ... names the cause" ;; *) bad "quota below use: $LAST_OUT" ;; esac
for bad_q in 0 abc -1 1Q; do
  check_fails "vol set --quota $bad_q" tarn vol set q --quota "$bad_q" -p "$POOL"
  case $LAST_OUT in *quota*|*size*) ok "  ... names the quota" ;; *) bad "--quota $bad_q: $LAST_OUT" ;; esac
done
check_fails "vol create x --quota 0" tarn vol create x --size 1G --quota 0 -p "$POOL"
check_fails "vol set without a setting" tarn vol set q -p "$POOL"
check_fails "vol set on a missing volume" tarn vol set nosuch --quota 1G -p "$POOL"
expect_eq "vol list unchanged" "$(tarn vol list -p "$POOL" --json)" "$before"

step "a clone's own writes count to the clone"
check "snap create q@s2" tarn snap create q@s2 -p "$POOL"
check "vol clone q@s2 c" tarn vol clone q@s2 c -p "$POOL"
check "vol set c --quota 1M" tarn vol set c --quota 1M -p "$POOL"
check "1 MiB over the origin's data fits" timeout 60 qemu-io -f raw "$(uri c)" -c "write -P 13 0 1M"
check_fails "a second MiB is refused" timeout 60 qemu-io -f raw "$(uri c)" -c "write -P 13 $((1 * M)) 1M"
case $LAST_OUT in *"No space left on device"*) ok "  ... with ENOSPC" ;; *) bad "clone: $LAST_OUT" ;; esac
vol_get "$POOL" c used
expect_eq "the clone's used" "$VAL" $((1 * M))
vol_get "$POOL" c shared
expect_eq "the clone still reads the rest of its 64 MiB from its origin (MiB)" $((VAL / M)) 63
vol_get "$POOL" q used
expect_eq "the origin's used is unchanged (its snapshot s2 adds nothing yet)" "$VAL" $((9 * M))
stop_serve
pool_check "$POOL" "after the quota writes"

step "the quota survives a restart (journal replay and checkpoint)"
start_serve "$POOL"
vol_get "$POOL" q quota
expect_eq "q's quota after the restart" "$VAL" $((9 * M))
enospc "still enforced" -c "write -P 14 $((20 * M)) 1M"
check "vol set q --quota none" tarn vol set q --quota none -p "$POOL"
check "without a quota the write goes" qio -c "write -P 14 $((20 * M)) 1M"
stop_serve

step "with --expand-at on, a quota refusal does not grow the pool"
EP=$T/expand.img
make_pool "$EP" 64M
check "vol create e --quota 4M" tarn vol create e --size 1G --quota 4M -p "$EP"
size0=$(stat -c %s "$EP")
start_serve "$EP" --expand-at 50 --expand-step 64M --expand-max 512M
rc=0
(cd "$T" && timeout 120 fio --name=efill --ioengine=nbd --uri="$(uri e)" --rw=write --bs=1M --iodepth=4 \
  --size=64M --output-format=json --output="$T/efill.json") >"$T/efill.out" 2>&1 || rc=$?
expect_eq "fio past the quota with expansion on: error" "$(jq -r '[.jobs[].error] | add' "$T/efill.json" 2>/dev/null)" 28
expect_eq "expansions" "$(tarn pool status -p "$EP" --json | jq '.expansion.expansions')" 0
expect_eq "the pool file did not grow" "$(stat -c %s "$EP")" "$size0"
stop_serve
pool_check "$EP" "expansion pool"

step "the overcommit guard: pool set --overcommit, refusals, --force"
OP=$T/over.img
make_pool "$OP" 128M
check "a pool without a ratio takes any size (default: none)" tarn vol create big --size 1T -p "$OP"
check "pool set --overcommit 2.0 (below today's ratio: existing volumes stay)" tarn pool set --overcommit 2.0 -p "$OP"
expect_eq "pool status --json overcommit_limit" "$(tarn pool status -p "$OP" --json | jq .overcommit_limit)" 2
check "pool status text shows the limit" sh -c "'$TARN' pool status -p '$OP' | grep -q 'limit 2.000x'"
check_fails "vol create past the ratio" tarn vol create v2 --size 64M -p "$OP"
case $LAST_OUT in *overcommit*) ok "  ... names the overcommit ratio" ;; *) bad "overcommit: $LAST_OUT" ;; esac
check "vol create --force goes past it" tarn vol create v2 --size 64M --force -p "$OP"
check_fails "vol resize past the ratio" tarn vol resize v2 --size 128M -p "$OP"
check "vol resize --force" tarn vol resize v2 --size 128M --force -p "$OP"
check "snap create v2@s" tarn snap create v2@s -p "$OP"
check_fails "vol clone past the ratio" tarn vol clone v2@s v2c -p "$OP"
case $LAST_OUT in *overcommit*) ok "  ... names the overcommit ratio" ;; *) bad "clone overcommit: $LAST_OUT" ;; esac
check "vol clone --force" tarn vol clone v2@s v2c --force -p "$OP"
check "shrinking is never refused by the ratio" tarn vol resize v2 --size 64M --allow-shrink -p "$OP"
check "pool set --overcommit none" tarn pool set --overcommit none -p "$OP"
check "then any size is taken" tarn vol create v3 --size 1T -p "$OP"
before=$(tarn pool status -p "$OP" --json | jq -c '[.overcommit_limit, .volumes, .virtual_size]')
for r in 0 -1 -0.5 abc 1001 nan; do
  check_fails "pool set --overcommit $r" tarn pool set --overcommit "$r" -p "$OP"
  case $LAST_OUT in *"overcommit ratio"*) ok "  ... names the ratio" ;; *) bad "--overcommit $r: $LAST_OUT" ;; esac
done
expect_eq "nothing changed" "$(tarn pool status -p "$OP" --json | jq -c '[.overcommit_limit, .volumes, .virtual_size]')" "$before"
start_serve "$OP"
check "pool set --overcommit 1.5 online" tarn pool set --overcommit 1.5 -p "$OP"
check_fails "vol create refused online" tarn vol create v4 --size 1G -p "$OP"
stop_serve
expect_eq "the ratio survives a restart" "$(tarn pool status -p "$OP" --json | jq .overcommit_limit)" 1.5
pool_check "$OP" "overcommit pool"
e2e_finish
