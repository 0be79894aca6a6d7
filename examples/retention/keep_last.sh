#!/usr/bin/env bash
# Retention over version directories: keep the last KEEP versions of FILE
# (on a mounted tarn file volume), delete the older ones.
#   keep_last.sh MOUNT FILE KEEP
# Versions are volume snapshots: deleting one deletes that snapshot of the
# whole volume (what only it held is freed; the others stay readable).
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 MOUNT FILE KEEP" >&2; exit 2; }
MOUNT=$1 FILE=$2 KEEP=$3
[[ $KEEP =~ ^[0-9]+$ ]] || { echo "KEEP must be a number, got '$KEEP'" >&2; exit 2; }
[ -d "$FILE@" ] || { echo "$FILE@: no version directory (not on a tarn mount?)" >&2; exit 1; }
mapfile -t versions < <(ls "$FILE@" | sort -n)
drop=$((${#versions[@]} - KEEP))
for ((i = 0; i < drop; i++)); do
  setfattr -n user.tarn.version.delete -v "${versions[$i]}" "$MOUNT"
  echo "deleted version ${versions[$i]}"
done
