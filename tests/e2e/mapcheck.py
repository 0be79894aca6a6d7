#!/usr/bin/env python3
"""Check `nbdinfo --map --json` output against expectations.

usage: mapcheck.py MAP.json SPEC...
  SPEC is KIND:OFFSET:LENGTH with KIND one of
    data  every byte of the range is reported allocated and not zero
    zero  every byte reads as zero per the map (NBD_STATE_ZERO set)
    hole  every byte is unallocated (NBD_STATE_HOLE set)
    zeroalloc  every byte is allocated and reads as zero (ZERO set, HOLE clear)
Prints one line per spec; exits 1 if any does not hold.
"""
import json
import sys

HOLE, ZERO = 1, 2


def main():
    ext = json.load(open(sys.argv[1]))
    bad = 0
    for spec in sys.argv[2:]:
        kind, off, ln = spec.split(":")
        off, ln = int(off, 0), int(ln, 0)
        end = off + ln
        covered = off
        wrong = []
        for e in ext:
            eo, el, t = e["offset"], e["length"], e["type"]
            if eo + el <= off or eo >= end:
                continue
            lo, hi = max(eo, off), min(eo + el, end)
            if lo > covered:
                wrong.append(f"gap {covered}..{lo}")
            covered = max(covered, hi)
            good = {
                "data": (t & (HOLE | ZERO)) == 0,
                "zero": (t & ZERO) != 0,
                "hole": (t & HOLE) != 0,
                "zeroalloc": (t & (HOLE | ZERO)) == ZERO,
            }[kind]
            if not good:
                wrong.append(f"{lo}..{hi} type={t}({e.get('description', '')})")
        if covered < end:
            wrong.append(f"not covered {covered}..{end}")
        if wrong:
            bad += 1
            print(f"  map {kind:4} {off}+{ln}: WRONG: " + "; ".join(wrong[:5]))
        else:
            print(f"  map {kind:4} {off}+{ln}: ok")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
