#!/usr/bin/env bash
# fio's nbd engine against tarn: 4 jobs = 4 concurrent connections doing 4k
# random writes with crc32c verification, a mixed randrw verify run, and a
# verify-only pass after a clean server restart (data persisted).
. "$(dirname "$0")/lib.sh"
need fio jq
e2e_init fio_verify

POOL=$T/pool.img
make_pool "$POOL" 2G
make_vol "$POOL" fio 256M
start_serve "$POOL"

# run_fio NAME JOBFILE: run, print summary, record pass/fail (fio exits
# non-zero on verification errors; also check the JSON error fields)
run_fio() {
  local name=$1 job=$2 rc=0
  # jobs name their target as @URI@ / @UNIX@: filled in for the current server
  sed -e "s|@URI@|$(uri fio)|" -e "s|@UNIX@|$(uri_unix fio)|" "$job" >"$T/$name.run.fio"
  job=$T/$name.run.fio
  # in $T: fio writes its verify state files (local-*-verify.state) to the cwd
  (cd "$T" && timeout 600 fio --output-format=json --output="$T/$name.json" "$job") >"$T/$name.out" 2>&1 || rc=$?
  if [ $rc -ne 0 ]; then
    bad "fio $name exit $rc"
    sed 's/^/       | /' "$T/$name.out" | grep -v '^\s*|\s*$' | tail -n 15
    grep -iE 'verify|error' "$T/$name.json" 2>/dev/null | head -5 | sed 's/^/       | /'
    return 0
  fi
  local errs w r
  errs=$(jq '[.jobs[].error] | add' "$T/$name.json" 2>/dev/null || echo parse-error)
  w=$(jq '[.jobs[].write.io_bytes] | add' "$T/$name.json")
  r=$(jq '[.jobs[].read.io_bytes] | add' "$T/$name.json")
  if [ "$errs" = 0 ]; then
    ok "fio $name: no errors (wrote $(mib "$w"), read+verified $(mib "$r"))"
  else
    bad "fio $name: job errors $errs"
  fi
}

step "4 jobs (4 connections) randwrite 4k QD16 each on its own 64M slice, verify=crc32c"
cat >"$T/randwrite.fio" <<JOB
[global]
ioengine=nbd
uri=@URI@
rw=randwrite
bs=4k
iodepth=16
size=64M
offset_increment=64M
numjobs=4
verify=crc32c
verify_fatal=1
verify_dump=1
do_verify=1
randseed=4242
group_reporting=0
[slices]
JOB
run_fio randwrite "$T/randwrite.fio"
jobs=$(jq '.jobs | length' "$T/randwrite.json" 2>/dev/null || echo 0)
expect_eq "fio ran 4 jobs" "$jobs" 4

step "mixed randrw (70% write) 8k QD32 x2 jobs with verify_backlog, 30s max"
cat >"$T/randrw.fio" <<JOB
[global]
ioengine=nbd
uri=@URI@
rw=randrw
rwmixwrite=70
bs=8k
iodepth=32
size=128M
offset_increment=128M
numjobs=2
verify=crc32c
verify_fatal=1
verify_backlog=2048
do_verify=1
randseed=777
runtime=30
[mixed]
JOB
run_fio randrw "$T/randrw.fio"

step "sequential 1M writes with verify, 2 jobs"
cat >"$T/seq.fio" <<JOB
[global]
ioengine=nbd
uri=@UNIX@
rw=write
bs=1M
iodepth=8
size=128M
offset_increment=128M
numjobs=2
verify=crc32c
verify_fatal=1
do_verify=1
[seq]
JOB
run_fio seq "$T/seq.fio"

step "restart server, verify-only pass of the 4k randwrite data"
# the randrw/seq runs overwrote the slices; rewrite them, flush via clean stop,
# then verify only, on a fresh server process
run_fio randwrite2 "$T/randwrite.fio"
stop_serve
pool_check "$POOL" "after fio + SIGTERM"
start_serve "$POOL"
sed 's/^do_verify=1$/verify_only=1/' "$T/randwrite.fio" >"$T/verifyonly.fio"
run_fio verifyonly "$T/verifyonly.fio"
r=$(jq '[.jobs[].read.io_bytes] | add' "$T/verifyonly.json" 2>/dev/null || echo 0)
expect_eq "verify-only pass read back all 256M" "$r" $((256 << 20))

step "a volume per placement policy (created through the running server): 4k random then 1M sequential overwrites, verified"
for p in inplace append contiguous; do
  out=$(tarn vol create "pl_$p" --size 64M --placement "$p" -p "$POOL" 2>&1) || bad "vol create --placement $p: $out"
done
# One job per policy, each on its own volume (its own connection).
placement_job() { # NAME RW BS
  printf '[global]\nioengine=nbd\nrw=%s\nbs=%s\niodepth=16\nsize=64M\nverify=crc32c\nverify_fatal=1\ndo_verify=1\nrandseed=99\n' "$2" "$3"
  for p in inplace append contiguous; do printf '[%s]\nuri=%s\n' "$p" "$(uri "pl_$p")"; done
}
placement_job placerand randwrite 4k >"$T/placerand.fio"
run_fio placerand "$T/placerand.fio"
placement_job placeseq write 1M >"$T/placeseq.fio"
run_fio placeseq "$T/placeseq.fio"
shown=$(tarn vol list -p "$POOL" --json | jq -r '[.[] | select(.name | startswith("pl_")) | .placement] | sort | join(",")')
expect_eq "vol list shows each volume's placement" "$shown" "append,contiguous,inplace"
out=$(tarn vol set pl_inplace --placement append -p "$POOL" 2>&1) || bad "vol set --placement append: $out"
shown=$(tarn vol list -p "$POOL" --json | jq -r '.[] | select(.name == "pl_inplace") | .placement')
expect_eq "vol set changes the placement of a served volume" "$shown" append
sed 's/^randseed=99$/randseed=98/' "$T/placerand.fio" >"$T/placerand2.fio"
run_fio placerand2 "$T/placerand2.fio"
out=$(tarn vol set pl_inplace --placement sideways -p "$POOL" 2>&1) && bad "vol set accepted an unknown placement"
case $out in *"unknown placement"*) ok "an unknown placement is refused by name" ;; *) bad "unknown placement: $out" ;; esac
step "pool compact after snapshots (sharing kept), and while fio writes and verifies"
for p in inplace append contiguous; do
  check "snapshot pl_$p@s1" "$TARN" snap create "pl_$p@s1" -p "$POOL"
done
snaps() { tarn snap list -p "$POOL" --json | jq -c '[.[] | select(.volume | startswith("pl_")) | [.volume, .exclusive, .referenced]] | sort'; }
before=$(snaps)
out=$(tarn pool compact -p "$POOL" --json 2>"$T/compact.err") || bad "pool compact failed: $out $(grep -v "%" "$T/compact.err" | tail -3)"
moved=$(jq '[.volumes[] | select(.volume | startswith("pl_")) | .windows_moved] | add' <<<"$out")
expect_between "compaction moved windows the snapshots share" "$moved" 1 1000000
expect_eq "no snapshot's exclusive or referenced bytes changed" "$(snaps)" "$before"
sed 's/^do_verify=1$/verify_only=1/' "$T/placerand2.fio" >"$T/placeverify.fio"
run_fio placeverify "$T/placeverify.fio"
sed 's/^randseed=99$/randseed=97/' "$T/placerand.fio" >"$T/placerand3.fio"
(cd "$T" && timeout 600 fio --output-format=json --output="$T/placerand3.json" "$T/placerand3.fio" >"$T/placerand3.out" 2>&1; echo $? >"$T/placerand3.rc") &
fio_pid=$!
rounds=0
while kill -0 $fio_pid 2>/dev/null && [ $rounds -lt 50 ]; do
  tarn pool compact -p "$POOL" >/dev/null 2>&1 || bad "pool compact during fio failed"
  rounds=$((rounds + 1))
done
wait $fio_pid
expect_eq "fio verify while compactions ran ($rounds compactions)" "$(cat "$T/placerand3.rc") $(jq '[.jobs[].error] | add' "$T/placerand3.json")" "0 0"

stop_serve
pool_check "$POOL" "after every placement policy and compactions"
shown=$(tarn vol list -p "$POOL" --json | jq -r '.[] | select(.name == "pl_append") | .placement')
expect_eq "a volume's placement survives a restart" "$shown" append

step "pool compact cleans regions behind an append head (idle compactor off): each 4 MiB keeps 1 MiB"
# A server of its own with the idle compactor off, so that only `pool
# compact` cleans. The volume is written in long runs (each 1 MiB window one
# run, which the compaction of volumes leaves alone) and flushed (data no
# commit has taken is rewritten in place even by `append`), then 3 MiB of
# every 4 MiB overwritten: `append` puts the new data at the head, and
# each old region keeps a quarter.
start_serve "$POOL" --compact-idle 0
out=$(tarn vol create clean --size 64M --placement append -p "$POOL" 2>&1) || bad "vol create clean: $out"
printf '[fill]\nioengine=nbd\nuri=%s\nrw=write\nbs=1M\niodepth=8\nsize=64M\nend_fsync=1\n' "$(uri clean)" >"$T/cleanfill.fio"
run_fio cleanfill "$T/cleanfill.fio"
printf '[over]\nioengine=nbd\nuri=%s\nrw=write:1M\nbs=3M\niodepth=4\noffset=1M\nsize=63M\n' "$(uri clean)" >"$T/cleanover.fio"
run_fio cleanover "$T/cleanover.fio"
check "nbdcopy of the volume before cleaning" nbdcopy "$(uri clean)" "$T/clean.before"
out=$(tarn pool compact -p "$POOL" --json 2>"$T/clean.err") || bad "pool compact: $out $(tail -2 "$T/clean.err")"
freed=$(jq '.regions.freed // -1' <<<"$out")
gained=$(jq '.regions.free_regions_after - .regions.free_regions_before' <<<"$out")
expect_between "cleaning freed partly used regions ($(jq -c .regions <<<"$out"))" "$freed" 8 100000
expect_between "whole free 4 MiB regions gained" "$gained" 4 100000
check "the volume reads the same after cleaning (qemu-img compare)" \
  qemu-img compare -f raw -F raw "$T/clean.before" "$(uri clean)"
stop_serve
pool_check "$POOL" "after cleaning"

step "pool create --start middle: linear allocation starts mid-device and wraps to the front"
head -c $((8 << 20)) /dev/urandom >"$T/img8m"
check "pool create --start middle" "$TARN" pool create "$T/mid.img" --size 64M --start middle
check "vol import into it" "$TARN" vol import "$T/img8m" mid -p "$T/mid.img"
first=$(tarn vol map mid -p "$T/mid.img" --json | jq '.[0][3]')
expect_between "the first block written lies mid-device (of 16384)" "$first" 6000 8200
check "a second image fills the rest" "$TARN" vol import "$T/img8m" mid2 -p "$T/mid.img"
head -c $((36 << 20)) /dev/urandom >"$T/img36m"
check "a third one reaches the end and wraps" "$TARN" vol import "$T/img36m" mid3 -p "$T/mid.img"
low=$(tarn vol map mid3 -p "$T/mid.img" --json | jq '[.[] | .[3]] | min')
expect_between "after the end, allocation went on at the front" "$low" 0 4000
check "mid3 exports" "$TARN" vol export mid3 "$T/mid3.raw" -p "$T/mid.img"
check "mid3 reads back what was imported" cmp "$T/mid3.raw" "$T/img36m"
pool_check "$T/mid.img" "after a middle start and a wrap"
check_fails "an unknown start is refused" "$TARN" pool create "$T/bad.img" --size 64M --start sideways
e2e_finish
