#!/usr/bin/env bash
# The test command: installs test deps, builds, runs the Rust tests (incl. the
# crash simulation) and every end-to-end scenario in tests/e2e/.
# Prints a closing line "N passed, M failed" (cargo = 1 entry, a short run of
# every fuzz target = 1 entry, each e2e script = 1 entry); exits non-zero on
# any failure.
#   bash scripts/test.sh                 # everything
#   E2E_ONLY=qemu_clients bash scripts/test.sh   # cargo + one scenario
#   SKIP_CARGO=1 bash scripts/test.sh    # e2e only (uses existing build)
#   FUZZ_SECONDS=60 bash scripts/test.sh # fuzz each target longer (default 15)
#   SKIP_FUZZ=1 bash scripts/test.sh     # without the fuzz entry
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PATH="$HOME/.cargo/bin:$PATH"
E2E_TIMEOUT=${E2E_TIMEOUT:-900}

start=$SECONDS
passed=0; failed=0; results=()
record() { # NAME RC SECS
  if [ "$2" -eq 0 ]; then passed=$((passed + 1)); results+=("PASS  $1 (${3}s)")
  else failed=$((failed + 1)); results+=("FAIL  $1 (exit $2, ${3}s)"); fi
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
    fi
  else
    record "cargo build --release --workspace" 1 $((SECONDS - t))
    built=0
  fi
fi

for s in "${e2e[@]}"; do
  name=$(basename "$s" .sh)
  if [ $built = 0 ]; then
    record "e2e $name (not run: build failed)" 1 0; continue
  fi
  banner "e2e $name"
  t=$SECONDS; rc=0
  timeout -k 30 "$E2E_TIMEOUT" bash "$s" </dev/null || rc=$?
  [ $rc -eq 124 ] && echo "e2e $name: timed out after ${E2E_TIMEOUT}s"
  record "e2e $name" $rc $((SECONDS - t))
done

banner "summary ($((SECONDS - start))s)"
printf '%s\n' "${results[@]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
