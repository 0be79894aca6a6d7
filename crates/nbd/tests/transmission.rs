//! Transmission phase over a real socket: I/O, validation, structured
//! replies, block status, errors.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;

use common::*;
use tarn_nbd::memory::{MemoryBackend, MemoryExport};
use tarn_nbd::protocol::*;
use tarn_nbd::{BlockStatusExtent, Export, ExportError, Server, ServerConfig};

#[test]
fn write_then_read_back() {
    let t = start();
    let (mut c, size, _) = Client::open(t.addr, false);
    assert_eq!(size, SIZE);
    let a = pattern(1, 4096);
    let b = pattern(2, 100_000);
    c.write(1, 0, &a);
    assert_eq!(c.simple(), (0, 1));
    c.write(2, 12345, &b);
    assert_eq!(c.simple(), (0, 2));
    assert_eq!(c.read_simple(3, 0, 4096), a);
    assert_eq!(c.read_simple(4, 12345, 100_000), b);
    // Last byte of the export.
    c.write(5, SIZE - 1, &[0x5a]);
    assert_eq!(c.simple(), (0, 5));
    assert_eq!(c.read_simple(6, SIZE - 2, 2), vec![0, 0x5a]);
    // FUA write, flush, cache, write zeroes.
    c.request(NBD_CMD_FLAG_FUA, NBD_CMD_WRITE, 7, 8192, 4, &[1, 2, 3, 4]);
    assert_eq!(c.simple(), (0, 7));
    c.request(0, NBD_CMD_FLUSH, 8, 0, 0, &[]);
    assert_eq!(c.simple(), (0, 8));
    c.request(0, NBD_CMD_CACHE, 9, 0, 65536, &[]);
    assert_eq!(c.simple(), (0, 9));
    c.request(NBD_CMD_FLAG_NO_HOLE, NBD_CMD_WRITE_ZEROES, 10, 0, 2048, &[]);
    assert_eq!(c.simple(), (0, 10));
    let r = c.read_simple(11, 0, 4096);
    assert_eq!(&r[..2048], &[0u8; 2048][..]);
    assert_eq!(&r[2048..], &a[2048..]);
    c.disc();
    assert!(c.closed_by_server());
}

#[test]
fn many_in_flight_out_of_order() {
    let t = start();
    let (mut c, _, _) = Client::open(t.addr, false);
    // Pipeline 200 writes without reading replies, then 200 reads.
    let n = 200u64;
    let mut batch = Vec::new();
    for i in 0..n {
        let h = RequestHeader { flags: 0, command: NBD_CMD_WRITE, handle: i, offset: i * 8192, length: 8192 };
        batch.extend_from_slice(&encode_request_header(&h));
        batch.extend_from_slice(&pattern(i as u8, 8192));
    }
    let mut s = c.s.try_clone().unwrap();
    let w = std::thread::spawn(move || s.write_all(&batch).unwrap());
    let mut seen = HashMap::new();
    for _ in 0..n {
        let (err, h) = c.simple();
        assert_eq!(err, 0);
        assert!(seen.insert(h, ()).is_none(), "duplicate handle {h}");
    }
    w.join().unwrap();
    for i in 0..n {
        c.request(0, NBD_CMD_READ, 1000 + i, i * 8192, 8192, &[]);
    }
    for _ in 0..n {
        let (r, data) = c.reply(|_| 8192);
        let Reply::Simple { error: 0, handle } = r else { panic!("{r:?}") };
        assert_eq!(data, pattern((handle - 1000) as u8, 8192));
    }
}

#[test]
fn invalid_requests_get_errors_and_the_connection_survives() {
    let t = start();
    let (mut c, _, _) = Client::open(t.addr, false);
    // Out of range read (simple reply: error, no payload).
    c.request(0, NBD_CMD_READ, 1, SIZE - 100, 200, &[]);
    assert_eq!(c.simple(), (NBD_EINVAL, 1));
    // Offset + length overflowing 2^64.
    c.request(0, NBD_CMD_READ, 2, u64::MAX - 10, 4096, &[]);
    assert_eq!(c.simple(), (NBD_EINVAL, 2));
    // Zero-length read and write.
    c.request(0, NBD_CMD_READ, 3, 0, 0, &[]);
    assert_eq!(c.simple(), (NBD_EINVAL, 3));
    c.request(0, NBD_CMD_WRITE, 4, 0, 0, &[]);
    assert_eq!(c.simple(), (NBD_EINVAL, 4));
    // Unknown command and unknown / misplaced flags.
    c.request(0, 42, 5, 0, 512, &[]);
    assert_eq!(c.simple(), (NBD_EINVAL, 5));
    c.request(1 << 12, NBD_CMD_READ, 6, 0, 512, &[]);
    assert_eq!(c.simple(), (NBD_EINVAL, 6));
    c.request(NBD_CMD_FLAG_DF, NBD_CMD_READ, 7, 0, 512, &[]); // DF needs structured replies
    assert_eq!(c.simple(), (NBD_EINVAL, 7));
    // Write past the end: ENOSPC, and the payload is consumed (stream in sync).
    c.write(8, SIZE - 10, &[0xee; 100]);
    assert_eq!(c.simple(), (NBD_ENOSPC, 8));
    // Overflowing write with a payload: EINVAL, payload consumed.
    c.write(9, u64::MAX - 1, &[0xee; 64]);
    assert_eq!(c.simple(), (NBD_EINVAL, 9));
    // Block status without a negotiated context.
    c.request(0, NBD_CMD_BLOCK_STATUS, 10, 0, 4096, &[]);
    assert_eq!(c.simple(), (NBD_EINVAL, 10));
    // Flush with a nonzero length.
    c.request(0, NBD_CMD_FLUSH, 11, 0, 1, &[]);
    assert_eq!(c.simple(), (NBD_EINVAL, 11));
    // The stream is still in sync and nothing was written.
    assert_eq!(c.read_simple(12, SIZE - 10, 10), vec![0u8; 10]);
    assert_eq!(t.export.allocated_blocks(), 0);
}

#[test]
fn oversized_write_payload_is_discarded_or_disconnected() {
    let cfg = ServerConfig { max_request_bytes: 64 * 1024, ..Default::default() };
    let t = start_with(MemoryExport::new(SIZE), cfg);
    let (mut c, _, _) = Client::open(t.addr, false);
    // Over the maximum but below the discard cap: EINVAL, stream stays usable.
    let big = vec![0xab; 1 << 20];
    c.write(1, 0, &big);
    assert_eq!(c.simple(), (NBD_EINVAL, 1));
    c.request(0, NBD_CMD_READ, 2, 0, 128 * 1024, &[]);
    assert_eq!(c.simple(), (NBD_EINVAL, 2));
    assert_eq!(c.read_simple(3, 0, 64 * 1024), vec![0u8; 64 * 1024]);
    assert_eq!(t.export.allocated_blocks(), 0);
    // An absurd payload length: the server hangs up rather than read 4 GiB.
    c.request(0, NBD_CMD_WRITE, 4, 0, u32::MAX, &[]);
    assert!(c.closed_by_server());
}

/// Requests beyond the maximum payload (proto.md "Size constraints"): a
/// structured READ gets NBD_EOVERFLOW, a WRITE NBD_EINVAL; commands without
/// payload are served whole; the connection stays usable.
#[test]
fn oversized_structured_requests() {
    let cfg = ServerConfig { max_request_bytes: 64 * 1024, ..Default::default() };
    let t = start_with(MemoryExport::new(SIZE), cfg);
    let (mut c, _, _) = Client::open(t.addr, true);
    c.request(0, NBD_CMD_READ, 1, 0, 128 * 1024, &[]);
    assert_eq!(c.error_of_next(), (NBD_EOVERFLOW, 1));
    c.request(NBD_CMD_FLAG_DF, NBD_CMD_READ, 2, 0, 128 * 1024, &[]);
    assert_eq!(c.error_of_next(), (NBD_EOVERFLOW, 2));
    c.write(3, 0, &vec![0xab; 128 * 1024]);
    assert_eq!(c.error_of_next(), (NBD_EINVAL, 3));
    assert_eq!(t.export.allocated_blocks(), 0);
    // Effect lengths beyond the maximum payload are fine.
    c.write(4, 1 << 20, &pattern(4, 4096));
    assert_eq!(c.simple(), (0, 4));
    c.request(NBD_CMD_FLAG_NO_HOLE, NBD_CMD_WRITE_ZEROES, 5, 0, 4 << 20, &[]);
    assert_eq!(c.simple(), (0, 5));
    c.request(0, NBD_CMD_TRIM, 6, 0, 4 << 20, &[]);
    assert_eq!(c.simple(), (0, 6));
    c.request(0, NBD_CMD_CACHE, 7, 0, 4 << 20, &[]);
    assert_eq!(c.simple(), (0, 7));
    let (_, d) = parse_block_status(&c.block_status(0, 8, 0, 4 << 20)[0].payload);
    assert_eq!(d, vec![(4 << 20, NBD_STATE_HOLE | NBD_STATE_ZERO)]);
    // The largest read allowed still works.
    c.request(0, NBD_CMD_READ, 9, 0, 64 * 1024, &[]);
    assert_eq!(c.chunk().ctype, NBD_REPLY_TYPE_OFFSET_HOLE);
}

#[test]
fn bad_magic_disconnects() {
    let t = start();
    let (mut c, _, _) = Client::open(t.addr, false);
    let mut h =
        encode_request_header(&RequestHeader { flags: 0, command: NBD_CMD_READ, handle: 1, offset: 0, length: 512 });
    h[0] ^= 0xff;
    c.s.write_all(&h).unwrap();
    assert!(c.closed_by_server());
    // The server is unaffected.
    let (mut c, _, _) = Client::open(t.addr, false);
    assert_eq!(c.read_simple(1, 0, 8), vec![0u8; 8]);
}

#[test]
fn structured_read_and_errors() {
    let t = start();
    let (mut c, _, flags) = Client::open(t.addr, true);
    assert_ne!(flags & NBD_FLAG_SEND_DF, 0);
    let data = pattern(9, 65536);
    c.write(1, 4096, &data);
    assert_eq!(c.simple(), (0, 1));
    for (handle, flags) in [(2u64, 0u16), (3, NBD_CMD_FLAG_DF)] {
        c.request(flags, NBD_CMD_READ, handle, 4096, 65536, &[]);
        let ch = c.chunk();
        assert_eq!(ch.handle, handle);
        assert_eq!(ch.ctype, NBD_REPLY_TYPE_OFFSET_DATA);
        assert_ne!(ch.flags & NBD_REPLY_FLAG_DONE, 0);
        assert_eq!(u64::from_be_bytes(ch.payload[0..8].try_into().unwrap()), 4096);
        assert_eq!(&ch.payload[8..], &data[..]);
    }
    // Errors of reads are structured error chunks.
    c.request(0, NBD_CMD_READ, 4, SIZE, 1, &[]);
    let ch = c.chunk();
    assert_eq!((ch.handle, ch.ctype, ch.flags), (4, NBD_REPLY_TYPE_ERROR, NBD_REPLY_FLAG_DONE));
    assert_eq!(u32::from_be_bytes(ch.payload[0..4].try_into().unwrap()), NBD_EINVAL);
    let mlen = u16::from_be_bytes([ch.payload[4], ch.payload[5]]) as usize;
    assert_eq!(ch.payload.len(), 6 + mlen);
    assert!(std::str::from_utf8(&ch.payload[6..]).is_ok());
    // Other errors too.
    c.request(0, 200, 5, 0, 1, &[]);
    assert_eq!(c.error_of_next(), (NBD_EINVAL, 5));
}

#[test]
fn block_status_after_trim() {
    let t = start();
    let (mut c, _, _) = Client::open(t.addr, true);
    c.write(1, 0, &pattern(3, 65536));
    assert_eq!(c.simple(), (0, 1));
    c.request(0, NBD_CMD_TRIM, 2, 16384, 16384, &[]);
    assert_eq!(c.simple(), (0, 2));
    assert!(!t.export.is_allocated(16384));
    let hz = NBD_STATE_HOLE | NBD_STATE_ZERO;

    c.request(0, NBD_CMD_BLOCK_STATUS, 3, 0, 1 << 20, &[]);
    let ch = c.chunk();
    assert_eq!((ch.handle, ch.ctype), (3, NBD_REPLY_TYPE_BLOCK_STATUS));
    assert_ne!(ch.flags & NBD_REPLY_FLAG_DONE, 0);
    let (id, d) = parse_block_status(&ch.payload);
    assert_ne!(id, 0);
    assert_eq!(d, vec![(16384, 0), (16384, hz), (32768, 0), ((1 << 20) - 65536, hz)]);

    // REQ_ONE: a single descriptor not longer than the request.
    c.request(NBD_CMD_FLAG_REQ_ONE, NBD_CMD_BLOCK_STATUS, 4, 16384, 4096, &[]);
    let (_, d) = parse_block_status(&c.chunk().payload);
    assert_eq!(d, vec![(4096, hz)]);
    // Unaligned start within data.
    c.request(0, NBD_CMD_BLOCK_STATUS, 5, 100, 200, &[]);
    let (_, d) = parse_block_status(&c.chunk().payload);
    assert_eq!(d, vec![(200, 0)]);
    // Reads of the trimmed range are one hole; beyond the end is EINVAL.
    c.request(0, NBD_CMD_READ, 6, 16384, 16384, &[]);
    let ch = c.chunk();
    assert_eq!((ch.ctype, ch.flags), (NBD_REPLY_TYPE_OFFSET_HOLE, NBD_REPLY_FLAG_DONE));
    assert_eq!(parse_hole(&ch.payload), (16384, 16384));
    c.request(0, NBD_CMD_BLOCK_STATUS, 7, SIZE - 512, 1024, &[]);
    assert_eq!(c.error_of_next(), (NBD_EINVAL, 7));
    // Write zeroes without NO_HOLE punches a hole.
    c.request(0, NBD_CMD_WRITE_ZEROES, 8, 0, 16384, &[]);
    assert_eq!(c.simple(), (0, 8));
    c.request(NBD_CMD_FLAG_REQ_ONE, NBD_CMD_BLOCK_STATUS, 9, 0, 1 << 20, &[]);
    let (_, d) = parse_block_status(&c.chunk().payload);
    assert_eq!(d, vec![(32768, hz)]);
}

/// An export failing every call with the error chosen by the offset.
struct Failing;

const ERRS: [ExportError; 7] = [
    ExportError::Io,
    ExportError::Perm,
    ExportError::NoSpace,
    ExportError::Invalid,
    ExportError::NotSupported,
    ExportError::Overflow,
    ExportError::Shutdown,
];

impl Export for Failing {
    fn size(&self) -> u64 {
        1 << 20
    }
    fn read_only(&self) -> bool {
        false
    }
    fn read(&self, offset: u64, _: &mut [u8]) -> Result<(), ExportError> {
        Err(ERRS[offset as usize % 7])
    }
    fn write(&self, offset: u64, _: &[u8], _: bool) -> Result<(), ExportError> {
        Err(ERRS[offset as usize % 7])
    }
    fn flush(&self) -> Result<(), ExportError> {
        Err(ExportError::Io)
    }
    fn trim(&self, offset: u64, _: u64, _: bool) -> Result<(), ExportError> {
        Err(ERRS[offset as usize % 7])
    }
    fn write_zeroes(&self, _: u64, _: u64, _: bool, fast: bool, _: bool) -> Result<(), ExportError> {
        if fast {
            Err(ExportError::NotSupported)
        } else {
            panic!("export bug")
        }
    }
    fn block_status(&self, _: u64, _: u64) -> Result<Vec<BlockStatusExtent>, ExportError> {
        Ok(vec![])
    }
}

#[test]
fn errno_mapping_and_export_panics() {
    let backend = MemoryBackend::new().with_export("mem", "", Arc::new(Failing));
    let server = Server::new(Arc::new(backend), ServerConfig::default());
    let addr = server.listen_tcp("127.0.0.1:0").unwrap();
    let (mut c, _, _) = Client::open(addr, false);
    let expect = [5u32, 1, 28, 22, 95, 75, 108];
    for (i, want) in expect.iter().enumerate() {
        c.request(0, NBD_CMD_READ, i as u64, i as u64, 1, &[]);
        assert_eq!(c.simple(), (*want, i as u64));
        c.write(100 + i as u64, i as u64, &[1]);
        assert_eq!(c.simple(), (*want, 100 + i as u64));
    }
    c.request(0, NBD_CMD_FLUSH, 200, 0, 0, &[]);
    assert_eq!(c.simple(), (NBD_EIO, 200));
    c.request(NBD_CMD_FLAG_FAST_ZERO, NBD_CMD_WRITE_ZEROES, 201, 0, 4096, &[]);
    assert_eq!(c.simple(), (NBD_ENOTSUP, 201));
    // A panicking export call becomes EIO; the connection keeps working.
    c.request(0, NBD_CMD_WRITE_ZEROES, 202, 0, 4096, &[]);
    assert_eq!(c.simple(), (NBD_EIO, 202));
    c.request(0, NBD_CMD_READ, 203, 0, 1, &[]);
    assert_eq!(c.simple(), (NBD_EIO, 203));

    // Block status with an empty extent list still yields one descriptor.
    let mut c = Client::connect(addr);
    c.structured();
    c.set_meta("mem", &["base:allocation"]);
    c.go("mem", &[]).unwrap();
    c.request(0, NBD_CMD_BLOCK_STATUS, 1, 0, 4096, &[]);
    let (_, d) = parse_block_status(&c.chunk().payload);
    assert_eq!(d, vec![(4096, 0)]);
    server.shutdown();
}
