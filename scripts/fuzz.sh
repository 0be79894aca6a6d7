#!/usr/bin/env bash
# Build and run the cargo-fuzz targets in fuzz/ one after another.
#   bash scripts/fuzz.sh                      # every target, 15 s each (CI)
#   bash scripts/fuzz.sh 3600                 # long run: an hour per target
#   bash scripts/fuzz.sh 600 engine_open nbd_transmission
# Exits non-zero if any target finds a crash (panic, abort, out-of-memory,
# timeout); prints the input that crashed and how to reproduce it.
# Uses rustup's nightly toolchain (else the default one with RUSTC_BOOTSTRAP=1);
# installs cargo-fuzz if missing.
# Work corpora grow in fuzz/corpus/TARGET (ignored by git) and carry over
# between runs; the committed seeds are fuzz/seeds/TARGET. Logs: fuzz/logs/.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PATH="$HOME/.cargo/bin:$PATH"

secs=${1:-15}
shift || true
case $secs in '' | *[!0-9]*) echo "usage: $0 [SECONDS_PER_TARGET] [TARGET...]" >&2; exit 2 ;; esac

# cargo-fuzz needs a nightly compiler (sanitizer flags). Prefer rustup's
# nightly; where there is none and none can be installed, let the default
# toolchain accept the nightly flags (RUSTC_BOOTSTRAP=1).
fuzz=(cargo +nightly fuzz)
if ! command -v rustup >/dev/null 2>&1 || ! rustup run nightly rustc --version >/dev/null 2>&1; then
  if command -v rustup >/dev/null 2>&1 && timeout 300 rustup toolchain install nightly --profile minimal >/dev/null 2>&1; then
    echo "fuzz.sh: installed the nightly toolchain"
  else
    echo "fuzz.sh: no nightly toolchain: using $(rustc --version) with RUSTC_BOOTSTRAP=1"
    export RUSTC_BOOTSTRAP=1
    fuzz=(cargo fuzz)
  fi
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz.sh: installing cargo-fuzz"
  cargo install cargo-fuzz --locked || exit 1
fi

if [ $# -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <("${fuzz[@]}" list)
fi

# Build (release, debug assertions, AddressSanitizer): all targets at once
# when running all of them.
t=$SECONDS
if [ $# -gt 0 ]; then
  for target in "${targets[@]}"; do
    "${fuzz[@]}" build "$target" || { echo "fuzz.sh: build of $target failed"; exit 1; }
  done
else
  "${fuzz[@]}" build || { echo "fuzz.sh: build failed"; exit 1; }
fi
echo "fuzz.sh: built ${#targets[@]} targets in $((SECONDS - t))s"

mkdir -p fuzz/logs
failed=()
for target in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$target" "fuzz/seeds/$target"
  log="fuzz/logs/$target.log"
  t=$SECONDS
  # -rss_limit_mb: a decoder that allocates gigabytes for a small input is
  # a finding too. -timeout: one input may take at most 10 s.
  # Grace: libFuzzer stops itself after max_total_time; `timeout` only
  # catches a hang of the whole process.
  timeout -k 10 $((secs + 120)) "${fuzz[@]}" run "$target" "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
    -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1
  rc=$?
  execs=$(grep -oE '^stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$')
  rate=$(grep -oE '^stat::average_exec_per_sec: *[0-9]+' "$log" | grep -oE '[0-9]+$')
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9a-zA-Z]+' "$log" | tail -1)
  stats="${execs:-?} execs, ${rate:-?}/s, $cov"
  if [ $rc -eq 0 ]; then
    echo "fuzz.sh: PASS $target ($((SECONDS - t))s): $stats"
  else
    failed+=("$target")
    echo "fuzz.sh: FAIL $target (exit $rc, $((SECONDS - t))s): $stats; log $log"
    grep -E "panicked at|^ERROR: |SUMMARY: " -A2 "$log" | head -20
    artifact=$(grep -oE "Test unit written to [^ ]+" "$log" | tail -1 | sed 's/Test unit written to //')
    if [ -n "$artifact" ]; then
      rel=${artifact#"$PWD/"}
      echo "  crash input: $rel"
      env=${RUSTC_BOOTSTRAP:+RUSTC_BOOTSTRAP=1 }
      echo "  reproduce:   $env${fuzz[*]} run $target $rel"
      echo "  minimize:    $env${fuzz[*]} tmin $target $rel"
    fi
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: ${#failed[@]} of ${#targets[@]} targets failed: ${failed[*]}"
  exit 1
fi
echo "fuzz.sh: ${#targets[@]} targets ran ${secs}s each without a crash"
