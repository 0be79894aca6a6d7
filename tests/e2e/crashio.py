#!/usr/bin/python3
"""I/O driver for crash_restart.sh (needs the libnbd python binding).

  crashio.py flushed URI EXP SEED ROUNDS
      Rounds of random writes (aligned and unaligned), trims and write-zeroes,
      each round ended by a flush. EXP (a file the size of the export) is kept
      equal to what the export must contain once the flush returned.
  crashio.py stream URI LOG SEED SECONDS
      Streams async writes (16 in flight) and every 64 writes a flush; appends
      to LOG "W idx off len seed" before submitting a write and "F idx" once a
      flush covering writes 0..idx completed. Runs until the connection dies
      (the server is killed) or SECONDS pass.
  crashio.py verify GOT EXP LOG
      GOT is the export read back after the crash. Per 512-byte sector: a
      sector no logged write touched must equal EXP; a touched sector must
      equal the last write durable by a completed flush (or EXP if none), or
      any write issued after that flush. Prints a summary; exit 1 on mismatch.
"""
import mmap
import os
import random
import sys
import time

SECTOR = 512
# CRASHIO_ALIGNED=1: the stream only issues 4k-aligned writes (for narrowing
# down failures)
ALIGNED = os.environ.get("CRASHIO_ALIGNED") == "1"


def data_for(seed, length):
    return random.Random(seed).randbytes(length)


def connect(uri):
    import nbd
    h = nbd.NBD()
    h.connect_uri(uri)
    return h


def cmd_flushed(uri, exp_path, seed, rounds):
    h = connect(uri)
    size = h.get_size()
    r = random.Random(seed)
    fd = os.open(exp_path, os.O_RDWR)
    if os.fstat(fd).st_size != size:
        os.ftruncate(fd, size)
    exp = mmap.mmap(fd, size)
    ops = open(exp_path + ".ops", "a", buffering=1)
    ops.write(f"# seed {seed}\n")
    can_trim = h.can_trim()
    can_zero = h.can_zero()
    nw = nt = nz = 0
    for rnd in range(rounds):
        for _ in range(r.randint(40, 80)):
            kind = r.random()
            if kind < 0.15 and can_trim:
                # trims only at 64k granularity/alignment: what a thin volume
                # must turn into zeroes (tarn semantics: trimmed reads zero)
                off = r.randrange(0, size // 65536) * 65536
                ln = min(r.choice([65536, 131072, 1 << 20]), size - off)
                h.trim(ln, off)
                ops.write(f"{seed} {rnd} trim {off} {ln}\n")
                exp[off:off + ln] = bytes(ln)
                nt += 1
            elif kind < 0.3 and can_zero:
                off = r.randrange(0, size - 4096) & ~511
                ln = min(r.choice([512, 4096, 65536, 300 * 1024]), size - off)
                h.zero(ln, off)
                ops.write(f"{seed} {rnd} zero {off} {ln}\n")
                exp[off:off + ln] = bytes(ln)
                nz += 1
            else:
                if r.random() < 0.5:
                    off = r.randrange(0, size // 4096) * 4096
                    ln = r.choice([4096, 8192, 65536, 262144])
                else:
                    off = r.randrange(0, size - 70000)
                    ln = r.randint(1, 70000)
                ln = min(ln, size - off)
                buf = data_for(r.getrandbits(64), ln)
                h.pwrite(buf, off)
                ops.write(f"{seed} {rnd} write {off} {ln}\n")
                exp[off:off + ln] = buf
                nw += 1
        h.flush()
        ops.write(f"{seed} {rnd} flush\n")
    exp.flush()
    h.shutdown()
    print(f"flushed: {rounds} rounds, {nw} writes, {nt} trims, {nz} zeroes, all flushed")


def cmd_stream(uri, log_path, seed, seconds):
    import nbd
    h = connect(uri)
    size = h.get_size()
    r = random.Random(seed)
    log = open(log_path, "a", buffering=1)
    deadline = time.time() + seconds
    idx = 0
    inflight = []  # (cookie, off, len, buffer): never two overlapping in flight
    flushes = []  # (cookie, idx_upto)

    def retire():
        for it in [it for it in inflight if h.aio_command_completed(it[0])]:
            inflight.remove(it)
        for fc, upto in list(flushes):
            if h.aio_command_completed(fc):
                flushes.remove((fc, upto))
                log.write(f"F {upto}\n")

    try:
        while time.time() < deadline:
            if inflight or flushes:
                h.poll(0)
            retire()
            if len(inflight) >= 16:
                h.poll(1000)
                continue
            if idx % 64 == 63 and not flushes:
                # a flush covers every write completed before it is issued:
                # drain first, so it surely covers writes 0..idx-1
                while inflight:
                    h.poll(1000)
                    retire()
                flushes.append((h.aio_flush(), idx - 1))
            for _ in range(20):
                if ALIGNED or r.random() < 0.5:
                    off = r.randrange(0, size // 4096) * 4096
                    ln = r.choice([4096, 16384, 65536])
                else:
                    off = r.randrange(0, size - 70000)
                    ln = r.randint(1, 70000)
                ln = min(ln, size - off)
                if not any(off < o + l and o < off + ln for (_, o, l, _) in inflight):
                    break
            else:
                h.poll(1000)
                continue
            s = r.getrandbits(64)
            log.write(f"W {idx} {off} {ln} {s}\n")
            buf = nbd.Buffer.from_bytearray(bytearray(data_for(s, ln)))
            inflight.append((h.aio_pwrite(buf, off), off, ln, buf))
            idx += 1
    except nbd.Error as e:
        print(f"stream: connection ended after {idx} writes: {e}")
        return
    print(f"stream: {idx} writes issued, time limit reached (server was not killed?)")


def cmd_verify(got_path, exp_path, log_path):
    writes = []
    durable_upto = -1
    for line in open(log_path):
        p = line.split()
        if not p:
            continue
        if p[0] == "W" and len(p) == 5:
            writes.append((int(p[1]), int(p[2]), int(p[3]), int(p[4])))
        elif p[0] == "F" and len(p) == 2:
            durable_upto = max(durable_upto, int(p[1]))
    got = open(got_path, "rb")
    exp = open(exp_path, "rb")
    gm = mmap.mmap(got.fileno(), 0, access=mmap.ACCESS_READ)
    em = mmap.mmap(exp.fileno(), 0, access=mmap.ACCESS_READ)
    if len(gm) != len(em):
        print(f"verify: size mismatch got {len(gm)} exp {len(em)}")
        sys.exit(1)
    # sectors touched by logged writes: baseline + candidates per sector
    touched = {}  # sector -> [baseline bytes, [candidate bytes...]]
    for (i, off, ln, s) in writes:
        buf = data_for(s, ln)
        first, last = off // SECTOR, (off + ln - 1) // SECTOR
        for sec in range(first, last + 1):
            st = touched.get(sec)
            if st is None:
                base = bytes(em[sec * SECTOR:(sec + 1) * SECTOR])
                st = touched[sec] = [base, []]
            lo = max(off, sec * SECTOR)
            hi = min(off + ln, (sec + 1) * SECTOR)
            if i <= durable_upto:
                # durable: becomes the baseline; earlier candidates drop out
                b = bytearray(st[0])
                b[lo - sec * SECTOR:hi - sec * SECTOR] = buf[lo - off:hi - off]
                st[0] = bytes(b)
                st[1] = []
            else:
                # not durable: any mix of old and new content per sector is
                # legal; record the sector as it would be with this write
                # applied on top of the baseline or any earlier candidate
                news = []
                for prev in [st[0]] + st[1]:
                    b = bytearray(prev)
                    b[lo - sec * SECTOR:hi - sec * SECTOR] = buf[lo - off:hi - off]
                    news.append(bytes(b))
                st[1] = (st[1] + news)[-64:]
    bad = []
    n_durable_checked = 0
    n_sectors = len(em) // SECTOR
    # untouched sectors: compare in big chunks, then drill into mismatches
    CH = 1 << 20
    for coff in range(0, len(em), CH):
        if gm[coff:coff + CH] == em[coff:coff + CH]:
            continue
        for sec in range(coff // SECTOR, min(n_sectors, (coff + CH) // SECTOR)):
            if sec in touched:
                continue
            if gm[sec * SECTOR:(sec + 1) * SECTOR] != em[sec * SECTOR:(sec + 1) * SECTOR]:
                bad.append((sec, "flushed data (untouched by the crashed stream) differs"))
    for sec, (base, cands) in touched.items():
        g = bytes(gm[sec * SECTOR:(sec + 1) * SECTOR])
        if g == base:
            n_durable_checked += 1
            continue
        if g in cands:
            continue
        bad.append((sec, "sector is neither the durable content nor any unflushed write"))
    print(f"verify: {len(writes)} streamed writes, durable up to #{durable_upto}, "
          f"{len(touched)} sectors touched by the stream, {n_sectors - len(touched)} untouched sectors compared")
    if bad:
        bad.sort()
        runs = []  # [first_sector, n, why]
        for sec, why in bad:
            if runs and runs[-1][0] + runs[-1][1] == sec and runs[-1][2] == why:
                runs[-1][1] += 1
            else:
                runs.append([sec, 1, why])
        print(f"verify: {len(bad)} bad sectors in {len(runs)} runs; first runs:")
        ops = []
        if os.path.exists(exp_path + ".ops"):
            for line in open(exp_path + ".ops"):
                p = line.split()
                if len(p) == 5:
                    ops.append((p[0], p[1], p[2], int(p[3]), int(p[4])))
        for sec, n, why in runs[:8]:
            lo, hi = sec * SECTOR, (sec + n) * SECTOR
            g, e = gm[lo:hi], em[lo:hi]
            desc = "reads zeros" if g.count(0) == len(g) else "reads non-zero data"
            desc += ", expected zeros" if e.count(0) == len(e) else ", expected data"
            last = [o for o in ops if o[3] < hi and lo < o[3] + o[4]]
            hist = "; ".join(f"{o[2]} {o[3]}+{o[4]} (seed {o[0]} round {o[1]})" for o in last[-3:])
            print(f"  offset {lo} len {hi - lo}: {why}; {desc}; last flushed ops there: {hist or 'none'}")
        sys.exit(1)
    print("verify: all flushed data intact")


def main():
    c = sys.argv[1]
    if c == "flushed":
        cmd_flushed(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    elif c == "stream":
        cmd_stream(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
    elif c == "verify":
        cmd_verify(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
