#!/usr/bin/env python3
"""fio v2 iolog: N random 4k writes over SIZE bytes with a sync after every
EVERY writes. fio 3.x's --fsync=N with iodepth>1 issues far more than one
flush per N writes (measured with fio 3.33 at QD32: one per ~8 writes for
--fsync=256), so bench/run.sh and bench/aging.sh replay this instead.
Written as it is generated (aging.sh asks for ~100 M writes).
usage: gen_iolog.py FILENAME SIZE N EVERY OUT"""
import random
import sys

name, size, n, every, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
r = random.Random(32)
blocks = size // 4096
w = f"{name} write "
s = f"{name} sync 0 0\n"
with open(out, "w") as f:
    f.write(f"fio version 2 iolog\n{name} add\n{name} open\n")
    lines = []
    for i in range(n):
        lines.append(f"{w}{r.randrange(blocks) * 4096} 4096\n")
        if i % every == every - 1:
            lines.append(s)
        if len(lines) >= 65536:
            f.write("".join(lines))
            lines = []
    lines.append(f"{name} close\n")
    f.write("".join(lines))
