#!/usr/bin/env python3
"""Helper for bench/snapshots.sh: a guest stand-in that, until it receives
SIGTERM (or after SECONDS), writes one 4K block and then FLUSHes, every
INTERVAL seconds, and prints the longest flush and write latency it saw
(microseconds) as "<max flush us>\t<max write us>\t<flushes>".

  flush_probe.py URI SECONDS [INTERVAL]"""
import os
import signal
import sys
import time

import nbd

stop = False


def on_term(*_):
    global stop
    stop = True


def main():
    uri, secs = sys.argv[1], float(sys.argv[2])
    interval = float(sys.argv[3]) if len(sys.argv) > 3 else 0.1
    signal.signal(signal.SIGTERM, on_term)
    h = nbd.NBD()
    h.connect_uri(uri)
    buf = os.urandom(4096)
    size = h.get_size()
    worst_f = worst_w = 0.0
    n = 0
    end = time.monotonic() + secs
    print("ready", file=sys.stderr, flush=True)
    while not stop and time.monotonic() < end:
        t = time.perf_counter()
        h.pwrite(buf, (n * 7919 * 4096) % size)
        worst_w = max(worst_w, time.perf_counter() - t)
        t = time.perf_counter()
        h.flush()
        worst_f = max(worst_f, time.perf_counter() - t)
        n += 1
        time.sleep(interval)
    print(f"{int(worst_f * 1e6)}\t{int(worst_w * 1e6)}\t{n}", flush=True)
    h.shutdown()


if __name__ == "__main__":
    main()
