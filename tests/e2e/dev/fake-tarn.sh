#!/usr/bin/env bash
# DEVELOPMENT ONLY: a stand-in for the tarn CLI built from nbdkit, used to
# exercise the e2e scripts before the real binary exists:
#   TARN=tests/e2e/dev/fake-tarn.sh bash tests/e2e/qemu_clients.sh
# Volumes are sparse files in POOL.d/ served by `nbdkit file dir=`. It does
# not detect pool corruption, crash consistency, or anything tarn-specific.
set -euo pipefail
sz() { python3 -c 'import sys;s=sys.argv[1];m={"K":1<<10,"M":1<<20,"G":1<<30,"T":1<<40};print(int(s[:-1])*m[s[-1].upper()] if s[-1].upper() in m else int(s))' "$1"; }
pool=${TARN_POOL:-}; size=; listen=127.0.0.1:10809; sock=; json=0; args=()
a1=${1:-}; a2=${2:-}; shift 2 || { echo "usage: tarn pool|vol|serve ..." >&2; exit 2; }
[ "$a1" = serve ] && { set -- "$a2" "$@"; a2=; }
while [ $# -gt 0 ]; do
  case $1 in
    -p) pool=$2; shift 2;; --size) size=$2; shift 2;; --listen) listen=$2; shift 2;;
    --socket) sock=$2; shift 2;; --json) json=1; shift;; --allow-shrink|--strict) shift;;
    -*) echo "error: unknown option $1" >&2; exit 2;;
    *) args+=("$1"); shift;;
  esac
done
[ -n "$pool" ] || { [ "$a1 $a2" = "pool create" ] && pool=${args[0]:-}; }
[ -n "$pool" ] || { echo "error: no pool given" >&2; exit 2; }
d=$pool.d
case "$a1 $a2" in
  "pool create") [ -n "$size" ] && truncate -s "$(sz "$size")" "$pool"; mkdir -p "$d";;
  "pool check") [ -d "$d" ] || { echo "error: cannot open pool $pool" >&2; exit 2; };;
  "pool status") [ -d "$d" ] || { echo "error: cannot open pool $pool" >&2; exit 2; }
     python3 - "$pool" <<'PY'
import os,sys,json
p=sys.argv[1];d=p+".d";s=os.path.getsize(p)
u=sum(os.stat(os.path.join(d,f)).st_blocks*512 for f in os.listdir(d))
print(json.dumps({"size":s,"used":u,"free":s-u,"metadata":0,"volumes":len(os.listdir(d)),"overcommit_ratio":0,"devices":[]}))
PY
  ;;
  "vol create") [ -d "$d" ] || { echo "error: cannot open pool $pool" >&2; exit 2; }
     truncate -s "$(sz "$size")" "$d/${args[0]}";;
  "vol resize") truncate -s "$(sz "$size")" "$d/${args[0]}";;
  "vol delete") rm "$d/${args[0]}";;
  "vol list") [ -d "$d" ] || { echo "error: cannot open pool $pool" >&2; exit 2; }
     python3 - "$d" <<'PY'
import os,sys,json
d=sys.argv[1]
print(json.dumps([{"name":f,"size":os.path.getsize(os.path.join(d,f)),"allocated":os.stat(os.path.join(d,f)).st_blocks*512} for f in sorted(os.listdir(d))]))
PY
  ;;
  "serve ")
     [ -d "$d" ] || { echo "error: cannot open pool $pool: No such file or directory" >&2; exit 2; }
     pids=()
     nbdkit -f --exit-with-parent -i "${listen%:*}" -p "${listen##*:}" file dir="$d" & pids+=($!)
     [ -n "$sock" ] && { nbdkit -f --exit-with-parent -U "$sock" file dir="$d" & pids+=($!); }
     trap 'kill -TERM "${pids[@]}" 2>/dev/null; wait; exit 0' TERM INT
     wait;;
  *) echo "error: unknown command $a1 $a2" >&2; exit 2;;
esac
