#!/usr/bin/env bash
# The test command: installs test deps, builds, runs the Rust tests (incl. the
# crash simulation) and every end-to-end scenario in tests/e2e/.
# Prints a closing line "N passed, M failed" (cargo = 1 entry, a short run of
# every fuzz target = 1 entry, each e2e script = 1 entry), followed by
# ", K skipped" when K > 0; exits non-zero on any failure.
#   bash scripts/test.sh                 # everything
#   E2E_ONLY=qemu_clients bash scripts/test.sh   # cargo + one scenario
#   SKIP_CARGO=1 bash scripts/test.sh    # e2e only (uses existing build)
#   FUZZ_SECONDS=60 bash scripts/test.sh # fuzz each target longer (default 15)
#   SKIP_FUZZ=1 bash scripts/test.sh     # without the fuzz entry
#   TARN_SKIP=ext4_kernel,snapshots:ext4 bash scripts/test.sh
#                                        # skip e2e scripts (NAME) or parts of
#                                        # them (NAME:PART) on purpose
#                                        # (uring: the file volume scenarios'
#                                        # second pass, over FUSE io_uring)
# Skips: an e2e script that cannot run here (a tool, root, /dev/fuse, a loop
# device missing) FAILS. Only what TARN_SKIP names may skip: the script exits
# 77 and is listed as "SKIPPED name (reason)", counted in K, never as passed.
# Exit 77 from a script TARN_SKIP does not name is a failure; so is a timeout.
# SKIP_CARGO and SKIP_FUZZ are listed as SKIPPED too.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PATH="$HOME/.cargo/bin:$PATH"
E2E_TIMEOUT=${E2E_TIMEOUT:-900}

start=$SECONDS
passed=0; failed=0; skipped=0; results=()
record() { # NAME RC SECS
  if [ "$2" -eq 0 ]; then passed=$((passed + 1)); results+=("PASS  $1 (${3}s)")
  else failed=$((failed + 1)); results+=("FAIL  $1 (exit $2, ${3}s)"); fi
}
record_skip() { # NAME REASON
  skipped=$((skipped + 1)); results+=("SKIPPED $1 ($2)")
}
SKIP_EXIT=77   # tests/e2e/lib.sh E2E_SKIP_EXIT (the automake convention)
skip_requested() { [[ ",${TARN_SKIP:-}," == *",$1,"* ]]; }

# record_e2e NAME RC SECS REPORT [LABEL]: the script's entry (LABEL follows
# its name: the transport of the io_uring pass), plus one per part it
# skipped. REPORT holds "ID<TAB>REASON" lines for what lib.sh skipped; a skip
# counts only if TARN_SKIP names it, so no script can skip silently.
record_e2e() {
  local name=$1 rc=$2 secs=$3 report=$4 label=${5:-} id reason
  if [ "$rc" -eq $SKIP_EXIT ]; then
    reason=$(awk -F '\t' -v n="$name" '$1 == n { print $2; exit }' "$report")
    if ! skip_requested "$name"; then record "e2e $name$label (exit $SKIP_EXIT = skipped, but TARN_SKIP does not name it)" "$rc" "$secs"
    elif [ -z "$reason" ]; then record "e2e $name$label (exit $SKIP_EXIT = skipped, but not through lib.sh: no reason)" "$rc" "$secs"
    else record_skip "e2e $name$label" "$reason"; fi
    return
  fi
  record "e2e $name$label" "$rc" "$secs"
  while IFS=$'\t' read -r id reason; do
    [ "$id" != "$name" ] || continue
    if skip_requested "$id"; then record_skip "e2e $id" "$reason"
    else record "e2e $id (skipped, but TARN_SKIP does not name it)" 1 0; fi
  done <"$report"
}
banner() { printf '\n========== %s ==========\n' "$*"; }

banner "deps"
bash scripts/deps.sh || { echo "scripts/deps.sh failed: e2e tests will likely fail"; }

mapfile -t e2e < <(ls tests/e2e/*.sh 2>/dev/null | grep -v '/lib\.sh$' | sort)
if [ -n "${E2E_ONLY:-}" ]; then
  mapfile -t e2e < <(printf '%s\n' "${e2e[@]}" | grep -E "/(${E2E_ONLY//,/|})\.sh$")
fi

built=1
if [ "${SKIP_CARGO:-0}" != 1 ]; then
  banner "cargo build --release --workspace"
  t=$SECONDS
  if cargo build --release --workspace; then
    banner "cargo test --release --workspace"
    rc=0; cargo test --release --workspace || rc=$?
    record "cargo test --release --workspace" $rc $((SECONDS - t))
    if [ "${SKIP_FUZZ:-0}" != 1 ]; then
      # Build and run every fuzz target briefly (docs/FUZZING.md).
      banner "fuzz (${FUZZ_SECONDS:-15}s per target)"
      t=$SECONDS; rc=0
      timeout -k 30 1200 bash scripts/fuzz.sh "${FUZZ_SECONDS:-15}" </dev/null || rc=$?
      record "fuzz" $rc $((SECONDS - t))
    else
      record_skip "fuzz" "SKIP_FUZZ=1"
    fi
  else
    record "cargo build --release --workspace" 1 $((SECONDS - t))
    built=0
  fi
else
  record_skip "cargo test --release --workspace" "SKIP_CARGO=1"
  record_skip "fuzz" "SKIP_CARGO=1"
fi

# run_e2e SCRIPT [LABEL]: one scenario, bounded by E2E_TIMEOUT.
run_e2e() {
  local s=$1 label=${2:-} name t rc report
  name=$(basename "$s" .sh)
  if [ $built = 0 ]; then
    record "e2e $name$label (not run: build failed)" 1 0; return
  fi
  banner "e2e $name$label"
  t=$SECONDS; rc=0; report=$(mktemp)
  TARN_SKIP_REPORT=$report timeout -k 30 "$E2E_TIMEOUT" bash "$s" </dev/null || rc=$?
  [ $rc -eq 124 ] && echo "e2e $name$label: timed out after ${E2E_TIMEOUT}s"
  record_e2e "$name" $rc $((SECONDS - t)) "$report" "$label"
  rm -f "$report"
}

# `tarn mount` takes FUSE over io_uring when the fuse module allows it
# (enable_uring): the scenarios run with it off (/dev/fuse), then the file
# volume ones again with it on; the module's setting is put back after.
URING=/sys/module/fuse/parameters/enable_uring
URING_WAS=$(cat "$URING" 2>/dev/null || echo -)
set_uring() { [ "$URING_WAS" = - ] || echo "$1" >"$URING" 2>/dev/null; }
set_uring N
for s in "${e2e[@]}"; do run_e2e "$s"; done
ring_e2e=()
for s in "${e2e[@]}"; do
  case $(basename "$s" .sh) in fs|fs_acls|fs_cache|fs_clone|fs_close_versions|fs_layout|fs_readahead|fs_serve|fs_versions|fs_xattrs) ring_e2e+=("$s") ;; esac
done
if [ ${#ring_e2e[@]} -gt 0 ]; then
  if skip_requested uring; then record_skip "e2e file volumes over io_uring" "TARN_SKIP=uring"
  elif ! set_uring Y || [ "$(cat "$URING" 2>/dev/null)" != Y ]; then
    record "e2e file volumes over io_uring (cannot run: $URING not settable; TARN_SKIP=uring skips)" 1 0
  else
    for s in "${ring_e2e[@]}"; do run_e2e "$s" " (io_uring)"; done
  fi
fi
set_uring "$URING_WAS"

banner "summary ($((SECONDS - start))s)"
printf '%s\n' "${results[@]}"
if [ "$skipped" -gt 0 ]; then echo "$passed passed, $failed failed, $skipped skipped"
else echo "$passed passed, $failed failed"; fi
[ "$failed" -eq 0 ]
