#!/usr/bin/env bash
# Retention over version directories: delete the COUNT versions of FILE
# that differ least from the version before them (bytes that differ, as
# `cmp -l` counts them, plus the size change), never the first or the
# last. One at a time, recomputed after each delete (a neighbour changes).
#   drop_least_changed.sh MOUNT FILE [COUNT]
# Versions are volume snapshots (see keep_last.sh).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 MOUNT FILE [COUNT]" >&2; exit 2; }
MOUNT=$1 FILE=$2 COUNT=${3:-1}
[[ $COUNT =~ ^[0-9]+$ ]] || { echo "COUNT must be a number, got '$COUNT'" >&2; exit 2; }
[ -d "$FILE@" ] || { echo "$FILE@: no version directory (not on a tarn mount?)" >&2; exit 1; }
distance() {
  local a=$1 b=$2 bytes sa sb
  bytes=$(cmp -l "$a" "$b" 2>/dev/null | wc -l || true)
  sa=$(stat -c %s "$a"); sb=$(stat -c %s "$b")
  echo $((bytes + (sa > sb ? sa - sb : sb - sa)))
}
for ((round = 0; round < COUNT; round++)); do
  mapfile -t v < <(ls "$FILE@" | sort -n)
  [ ${#v[@]} -gt 2 ] || { echo "only ${#v[@]} versions left: the first and last stay"; break; }
  best= best_d=
  for ((i = 1; i < ${#v[@]} - 1; i++)); do
    d=$(distance "$FILE@/${v[$((i - 1))]}" "$FILE@/${v[$i]}")
    if [ -z "$best_d" ] || [ "$d" -lt "$best_d" ]; then best=${v[$i]} best_d=$d; fi
  done
  setfattr -n user.tarn.version.delete -v "$best" "$MOUNT"
  echo "deleted version $best ($best_d bytes from the one before)"
done
