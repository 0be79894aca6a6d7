#!/usr/bin/env bash
# Idempotent install of everything the tarn tests and benchmark need on a
# fresh Debian machine. Quiet; does nothing when all tools are present.
#   bash scripts/deps.sh           # test + bench tools
#   bash scripts/deps.sh --bench   # the same, matplotlib (the benchmarks' plots) and mdadm (bench/stripe.sh)
#   bash scripts/deps.sh --serve   # only what `tarn run` needs (cargo)
set -euo pipefail

mode=${1:-all}

# command -> Debian package
declare -A NEED=(
  [qemu-img]=qemu-utils [qemu-io]=qemu-utils [qemu-nbd]=qemu-utils
  [nbdinfo]=libnbd-bin [nbdcopy]=libnbd-bin [nbdsh]=python3-libnbd
  [nbdfuse]=nbdfuse [fusermount3]=fuse3 [fio]=fio
  [mkfs.ext4]=e2fsprogs [e2fsck]=e2fsprogs [nbdkit]=nbdkit
  [losetup]=util-linux [fstrim]=util-linux [pgrep]=procps
  [sqlite3]=sqlite3 [git]=git [setfattr]=attr [setfacl]=acl [getfacl]=acl
  [jq]=jq [promtool]=prometheus [python3]=python3 [timeout]=coreutils [openssl]=openssl [stat]=coreutils
  [systemd-analyze]=systemd [man]=man-db [postmark]=postmark
  # a throwaway Ceph cluster for the RADOS tests (scripts/ceph.sh)
  [ceph-mon]=ceph-mon [ceph-osd]=ceph-osd [ceph]=ceph-common [rados]=ceph-common
)

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
if [ "$mode" != "--serve" ]; then
  for cmd in "${!NEED[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("${NEED[$cmd]}")
  done
  # the libnbd python binding lives in the system python (the tests call
  # /usr/bin/python3 explicitly since a pyenv python3 may shadow it)
  if ! /usr/bin/python3 -c 'import nbd' >/dev/null 2>&1; then
    missing+=(python3-libnbd)
  fi
  # librados, loaded at run time by crates/rados (no build-time link)
  if ! ldconfig -p 2>/dev/null | grep -q 'librados\.so\.2 '; then
    missing+=(librados2)
  fi
  # the benchmarks' plots (bench/plots.py); the tests need no plotting
  if [ "$mode" = "--bench" ] && ! /usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1; then
    missing+=(python3-matplotlib)
  fi
  # Linux md RAID-0, the striping peer of bench/stripe.sh
  if [ "$mode" = "--bench" ] && ! command -v mdadm >/dev/null 2>&1; then
    missing+=(mdadm)
  fi
  # the nbdkit plugins used by the benchmark
  if command -v nbdkit >/dev/null 2>&1 && ! nbdkit file --version >/dev/null 2>&1; then
    missing+=(nbdkit)
  fi
fi

if [ ${#missing[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "deps.sh: missing packages ${missing[*]} and no apt-get; install them by hand" >&2
    exit 1
  fi
  mapfile -t pkgs < <(printf '%s\n' "${missing[@]}" | sort -u)
  echo "deps.sh: installing ${pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # wait (bounded) for any other apt/dpkg run holding the lock
  for _ in $(seq 1 120); do
    if command -v fuser >/dev/null 2>&1 && fuser /var/lib/dpkg/lock-frontend >/dev/null 2>&1; then
      sleep 5
    else
      break
    fi
  done
  if ! as_root apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/tmp/tarn-deps-apt.log 2>&1; then
    as_root apt-get update -qq >>/tmp/tarn-deps-apt.log 2>&1
    as_root apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >>/tmp/tarn-deps-apt.log 2>&1 || {
      echo "deps.sh: apt-get install failed, see /tmp/tarn-deps-apt.log" >&2
      tail -20 /tmp/tarn-deps-apt.log >&2
      exit 1
    }
  fi
fi

if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    :
  else
    echo "deps.sh: cargo not found; install a Rust toolchain (rustup or apt-get install cargo)" >&2
    exit 1
  fi
fi
exit 0
