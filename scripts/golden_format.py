#!/usr/bin/env python3
"""Expected bytes for the golden-bytes tests in crates/format, built from
docs/FORMAT.md alone (field tables, little-endian integers, LEB128 varints,
CRC-32C with a per-type salt as the initial value as the crc32c crate's
crc32c_append computes it), not from the Rust encoders. Run it and compare
with the hex pinned in superblock.rs, journal.rs and checkpoint.rs tests:

    python3 scripts/golden_format.py
"""
import struct

POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected
TABLE = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ POLY if c & 1 else c >> 1
    TABLE.append(c)


def crc32c_append(crc, data):
    """crc32c crate semantics: continue from a finished crc value."""
    c = crc ^ 0xFFFFFFFF
    for b in data:
        c = TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


assert crc32c_append(0, bytes(4096)) == 0x98F94189  # FORMAT.md, Data checksums

SUPB, JHDR, JPLD, SHDR = 0x53555042, 0x4A484452, 0x4A504C44, 0x53484452


def u8(v): return struct.pack("<B", v)
def u16(v): return struct.pack("<H", v)
def u32(v): return struct.pack("<I", v)
def u64(v): return struct.pack("<Q", v)


def varint(v):
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def name(s): return u8(len(s)) + s.encode()


def hexs(b): return " ".join(f"{x:02x}" for x in b)


def superblock():
    """FORMAT.md §Superblock, copy 16, pool with SNAPSHOTS | DATA_CHECKSUMS."""
    b = b"TARNPOOL" + u32(3) + u32(4096)
    b += u64(0b11) + u64(0) + u64(0)                  # incompat, ro_compat, compat
    b += bytes([0x11] * 16) + bytes([0x22] * 16)      # pool_uuid, device_uuid
    b += u16(0) + u16(1) + u32(0)                     # device_index, device_count, flags
    b += u64(9) + u64(16)                             # txid, self_block
    b += u64(0x40000) + u64(96) + u64(32) + u64(64)   # device_blocks, data_start, journal_start, journal_blocks
    b += u64(5)                                       # journal_generation
    b += u64(700) + u64(5000) + u32(0xDEADBEEF) + u32(2)  # checkpoint pba, len, crc, segments
    b += u64(41) + u64(1_700_000_000)                 # checkpoint_seq, created_unix
    assert len(b) == 176
    b += bytes([0x22] * 16) + u64(0x40000) + u16(9) + b"/dev/sdb1"  # device table entry 0
    table_end = len(b)
    b += bytes(4092 - len(b))
    b += u32(crc32c_append(SUPB, b))
    assert len(b) == 4096
    return b, table_end


def journal_payload():
    """FORMAT.md §Journal payload: ops, one of several kinds."""
    p = varint(6)
    p += u8(3) + u32(1) + u64(1 << 20) + name("vol")                       # VolCreate
    p += u8(1) + u32(1) + varint(300) + varint(2) + u64((1 << 48) | 0x1234) + varint(5)  # Map
    p += u8(12) + u32(0) + u64((1 << 48) | 0x1234) + varint(2) + u32(0x98F94189) + u32(0x12345678)  # Sums
    p += u8(2) + u32(1) + varint(7) + varint(200)                          # Unmap
    p += u8(6) + u32(1) + u64(1_700_000_000) + name("s1")                  # SnapCreate
    p += u8(13) + u32(0) + varint(2) + varint(0) + varint(70000)           # RegionsOpen
    return p


def journal_record():
    """FORMAT.md §Journal, record header: generation 3, seq 42, block 37, epoch 5."""
    p = journal_payload()
    blocks = (64 + len(p) + 4095) // 4096
    h = b"TARNJRNL" + u64(3) + u64(42) + u64(37) + u32(len(p)) + u32(blocks) + u64(5)
    h += u32(crc32c_append(JPLD, p)) + u64(0)
    assert len(h) == 60
    h += u32(crc32c_append(JHDR, h))
    rec = h + p
    return rec + bytes(blocks * 4096 - len(rec)), len(p)


def segment_header():
    """FORMAT.md §Segment: seq 41, index 1, 3 blocks at 5000, next on device 1."""
    h = b"TARNSEGM" + u64(41) + u32(1) + u32(3) + u64(5000) + u64((1 << 48) | 77) + u32(9000)
    h += bytes(16)
    assert len(h) == 60
    return h + u32(crc32c_append(SHDR, h))


if __name__ == "__main__":
    sb, end = superblock()
    print(f"superblock bytes 0..{end}:\n{hexs(sb[:end])}\ncrc: {hexs(sb[4092:])}")
    rec, n = journal_record()
    print(f"journal header:\n{hexs(rec[:64])}\npayload ({n} bytes):\n{hexs(rec[64:64 + n])}")
    print(f"segment header:\n{hexs(segment_header())}")
