#!/usr/bin/env bash
# Per-device layout (issue 11 item 2, Loris): a member carries its own
# default placement (`tarn dev set INDEX --placement`), and a volume names
# the members its new data goes to (`vol create/set --devices`). A pool of
# two members, member 1 `append`: a volume pinned to member 1 follows
# append (a 4 KiB overwrite goes to a new place), one pinned to member 0
# follows the pool's `linear` (the overwrite stays in place); `vol map`
# shows every block on the named member; fio verify over NBD; the settings
# survive a restart; moving a volume's set later sends only new data to the
# new member; bad input is refused by name and changes nothing; `pool
# check` clean.
. "$(dirname "$0")/lib.sh"
need fio qemu-io jq
e2e_init device_placement

POOL=$T/a.img MEMBER=$T/b.img
# vol_field VOL FIELD: that field of `vol list --json`, compact JSON
vol_field() { tarn vol list -p "$POOL" --json | jq -c --arg n "$1" --arg f "$2" '.[] | select(.name == $n) | .[$f]'; }
# devices_of VOL: the distinct members VOL's blocks lie on, sorted
devices_of() { tarn vol map "$1" -p "$POOL" | awk '{print $3}' | sort -u | tr '\n' ' '; }
# block_at VOL LBA: the "device block" holding logical block LBA
block_at() { tarn vol map "$1" -p "$POOL" | awk -v l="$2" '$1 <= l && l < $1 + $2 {print $3, $4 + l - $1}'; }

truncate -s 512M "$MEMBER"
check "pool create a.img + member b.img" tarn pool create "$POOL" --size 512M --device "$MEMBER"
check "dev set 1 --placement append" tarn dev set 1 --placement append -p "$POOL"
check "pool status shows member 1's placement" bash -c "'$TARN' pool status -p '$POOL' | grep -q 'b.img .*placement append'"
check "vol create v --devices 1" tarn vol create v --size 64M --devices 1 -p "$POOL"
check "vol create w --devices 0" tarn vol create w --size 64M --devices 0 -p "$POOL"
expect_eq "v follows member 1's policy" "$(vol_field v placement)" '"append"'
expect_eq "w follows the pool's default" "$(vol_field w placement)" '"linear"'

step "data goes to the named members; overwrites follow each member's policy"
start_serve "$POOL"
check "qemu-io writes v and w" bash -c "qemu-io -f raw -c 'write -P 0x11 0 8M' -c flush '$(uri v)' && qemu-io -f raw -c 'write -P 0x22 0 8M' -c flush '$(uri w)'"
expect_eq "v's blocks all on member 1" "$(devices_of v)" "1 "
expect_eq "w's blocks all on member 0" "$(devices_of w)" "0 "
v0=$(block_at v 100) w0=$(block_at w 100)
check "4 KiB overwrites of v and w" bash -c "qemu-io -f raw -c 'write -P 0x33 400k 4k' -c flush '$(uri v)' && qemu-io -f raw -c 'write -P 0x44 400k 4k' -c flush '$(uri w)'"
v1=$(block_at v 100) w1=$(block_at w 100)
[ -n "$v0" ] && [ "$v0" != "$v1" ] && ok "v's overwrite went to a new place (append): $v0 -> $v1" || bad "v's overwrite stayed at '$v0' -> '$v1'"
[ -n "$w0" ] && [ "$w0" = "$w1" ] && ok "w's overwrite stayed in place (linear): $w0" || bad "w's overwrite moved: '$w0' -> '$w1'"
check "reads back" bash -c "qemu-io -f raw -c 'read -P 0x11 0 400k' -c 'read -P 0x33 400k 4k' '$(uri v)' && qemu-io -f raw -c 'read -P 0x44 400k 4k' -c 'read -P 0x22 404k 1M' '$(uri w)'"

step "fio randwrite + verify on the append member"
rc=0
(cd "$T" && timeout 300 fio --name=v --ioengine=nbd --uri="$(uri v)" --rw=randwrite --bs=4k --iodepth=16 \
  --size=32M --verify=crc32c --verify_fatal=1 --randrepeat=0 --output-format=json --output="$T/fio.json") >"$T/fio.out" 2>&1 || rc=$?
expect_eq "fio exit status" "$rc" 0
expect_eq "fio errors" "$(jq '[.jobs[].error] | add' "$T/fio.json" 2>/dev/null)" 0
expect_eq "v's blocks still all on member 1" "$(devices_of v)" "1 "
stop_serve

step "settings survive a restart; a new set sends only new data to the new member"
start_serve "$POOL"
check "status after restart" bash -c "'$TARN' pool status -p '$POOL' --json | jq -e '.devices[1].placement == \"append\" and .devices[0].placement == null' >/dev/null"
expect_eq "v's members after restart" "$(vol_field v devices)" "[1]"
check "vol set w --devices 1 (online)" tarn vol set w --devices 1 -p "$POOL"
check "write w past its old data" qemu-io -f raw -c "write -P 0x55 16M 4M" -c flush "$(uri w)"
expect_eq "w's blocks now on both members" "$(devices_of w)" "0 1 "
expect_eq "w's new data on member 1" "$(block_at w 4200 | cut -d' ' -f1)" 1
expect_eq "w's old data stayed on member 0" "$(block_at w 0 | cut -d' ' -f1)" 0
check "dev set 1 --placement default" tarn dev set 1 --placement default -p "$POOL"
expect_eq "v follows the pool's default again" "$(vol_field v placement)" '"linear"'
stop_serve

step "bad input: refused by name, nothing changed"
check_fails "dev set of a member that does not exist" tarn dev set 5 --placement append -p "$POOL"
printf '%s' "$LAST_OUT" | grep -q "device 5 is not a member" && ok "  ... names the device" || bad "message: $LAST_OUT"
check_fails "vol create --devices 3" tarn vol create x --size 1M --devices 3 -p "$POOL"
printf '%s' "$LAST_OUT" | grep -q "device 3 is not a member" && ok "  ... names the device" || bad "message: $LAST_OUT"
check_fails "vol list has no x" bash -c "'$TARN' vol list -p '$POOL' --json | jq -e '.[] | select(.name == \"x\")'"
check_fails "vol set --devices 1,y" tarn vol set v --devices 1,y -p "$POOL"
check_fails "dev set --placement fast" tarn dev set 1 --placement fast -p "$POOL"
expect_eq "v's members unchanged" "$(vol_field v devices)" "[1]"
pool_check "$POOL"
e2e_finish
