#!/usr/bin/env python3
"""Helper for bench/snapshots.sh: take N snapshots through the CLI while a
server runs, with CHURN random 4K writes over NBD before each, and print
one line per snapshot: "<name>\t<wall microseconds of the CLI call>".

  snap_loop.py URI VOLSIZE CHURN N -- CMD... {name}

CMD is run once per snapshot with {name} replaced by the snapshot's name
(s0000, s0001, ...; --prefix changes the "s"); its output is discarded and
a failure stops the loop (exit 1). Writes are synchronous NBD writes and
not flushed: the snapshot's own commit makes them durable, as it would a
guest's."""
import os
import random
import subprocess
import sys
import time

import nbd


def main():
    args = sys.argv[1:]
    prefix = "s"
    if args[:1] == ["--prefix"]:
        prefix, args = args[1], args[2:]
    sep = args.index("--")
    uri, volsize, churn, n = args[0], int(args[1]), int(args[2]), int(args[3])
    cmd = args[sep + 1:]
    h = nbd.NBD()
    h.connect_uri(uri)
    rng = random.Random(0x5eed)
    blocks = volsize // 4096
    buf = os.urandom(4096)
    for i in range(n):
        for _ in range(churn):
            h.pwrite(buf, rng.randrange(blocks) * 4096)
        name = f"{prefix}{i:04d}"
        argv = [a.replace("{name}", name) for a in cmd]
        t = time.perf_counter()
        r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        us = int((time.perf_counter() - t) * 1e6)
        if r.returncode != 0:
            sys.stderr.write(f"snap_loop: {' '.join(argv)} failed: {r.stderr.decode(errors='replace')}\n")
            sys.exit(1)
        print(f"{name}\t{us}", flush=True)
    h.shutdown()


if __name__ == "__main__":
    main()
