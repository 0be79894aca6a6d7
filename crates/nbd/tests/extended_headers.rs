//! NBD_OPT_EXTENDED_HEADERS (proto.md, extension-ext-header): 32-byte
//! requests with 64-bit lengths, 32-byte extended replies echoing the
//! request's offset, NBD_REPLY_TYPE_BLOCK_STATUS_EXT, bounded lengths.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use tarn_nbd::memory::{MemoryBackend, MemoryExport};
use tarn_nbd::protocol::*;
use tarn_nbd::{BlockStatusExtent, Export, ExportError, Server, ServerConfig};

const K: u64 = 4096;
const PL: u16 = NBD_CMD_FLAG_PAYLOAD_LEN;

/// Extended headers, base:allocation, GO "mem"; the transmission flags.
fn open_extended(c: &mut Client) -> u16 {
    let r = c.option(NBD_OPT_EXTENDED_HEADERS, &[]);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].rtype, NBD_REP_ACK);
    // Extended headers take precedence over structured replies.
    let r = c.option(NBD_OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(r[0].rtype, NBD_REP_ERR_EXT_HEADER_REQD);
    // Meta contexts need no structured replies once extended headers are on.
    let ids = c.set_meta_ids("mem", &["base:allocation"]);
    assert_eq!(ids.len(), 1);
    c.go("mem", &[NBD_INFO_BLOCK_SIZE]).expect("GO").1
}

fn ext_client(t: &TestServer) -> Client {
    let mut c = Client::connect(t.addr);
    let flags = open_extended(&mut c);
    assert_ne!(flags & NBD_FLAG_SEND_DF, 0);
    c
}

#[test]
fn io_with_extended_headers() {
    let t = start();
    let mut c = ext_client(&t);
    let data = pattern(5, 8 * K as usize);
    // WRITE carries PAYLOAD_LEN; success is a NONE chunk (no simple replies).
    c.ext_request(PL, NBD_CMD_WRITE, 1, 16 * K, data.len() as u64, &data);
    let r = c.ext_chunk();
    assert_eq!((r.flags, r.ctype, r.handle, r.offset), (NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, 1, 16 * K));
    assert!(r.payload.is_empty());
    // A fully allocated read: one OFFSET_DATA chunk whose header echoes the
    // request's offset and whose payload starts with the data's offset.
    c.ext_request(0, NBD_CMD_READ, 2, 16 * K, 8 * K, &[]);
    let r = c.ext_chunk();
    assert_eq!((r.flags, r.ctype, r.handle, r.offset), (NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_OFFSET_DATA, 2, 16 * K));
    assert_eq!(&r.payload[..8], &(16 * K).to_be_bytes());
    assert_eq!(&r.payload[8..], &data[..]);
    // A sparse read: hole, data, hole; every header echoes offset 8K.
    c.ext_request(0, NBD_CMD_READ, 3, 8 * K, 24 * K, &[]);
    let ch = c.ext_chunks(3);
    let kinds: Vec<(u16, u64)> =
        ch.iter().map(|r| (r.ctype, u64::from_be_bytes(r.payload[0..8].try_into().unwrap()))).collect();
    let (d, h) = (NBD_REPLY_TYPE_OFFSET_DATA, NBD_REPLY_TYPE_OFFSET_HOLE);
    assert_eq!(kinds, vec![(h, 8 * K), (d, 16 * K), (h, 24 * K)]);
    assert!(ch.iter().all(|r| r.offset == 8 * K));
    assert_eq!(parse_hole(&ch[0].payload), (8 * K, 8 * K as u32));
    assert_eq!(&ch[1].payload[8..], &data[..]);
    // Flush, trim, write zeroes, cache: NONE chunks.
    for (handle, cmd, flags, len) in [
        (4u64, NBD_CMD_FLUSH, 0u16, 0u64),
        (5, NBD_CMD_TRIM, 0, 4 * K),
        (6, NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_NO_HOLE, 4 * K),
        (7, NBD_CMD_CACHE, 0, 4 * K),
    ] {
        let offset = if cmd == NBD_CMD_FLUSH { 0 } else { 20 * K };
        c.ext_request(flags, cmd, handle, offset, len, &[]);
        let r = c.ext_chunk();
        assert_eq!((r.flags, r.ctype, r.handle, r.offset), (NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, handle, offset));
    }
    // Block status: BLOCK_STATUS_EXT, descriptor count, 64-bit fields.
    c.ext_request(0, NBD_CMD_BLOCK_STATUS, 8, 0, 1 << 20, &[]);
    let r = c.ext_chunk();
    assert_eq!((r.flags, r.ctype, r.offset), (NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_BLOCK_STATUS_EXT, 0));
    assert_eq!(r.payload.len() % 16, 8);
    let n = u32::from_be_bytes(r.payload[4..8].try_into().unwrap()) as usize;
    assert_eq!(r.payload.len(), 8 + 16 * n);
    let desc: Vec<(u64, u64)> = r.payload[8..]
        .chunks(16)
        .map(|x| (u64::from_be_bytes(x[0..8].try_into().unwrap()), u64::from_be_bytes(x[8..16].try_into().unwrap())))
        .collect();
    let hz = (NBD_STATE_HOLE | NBD_STATE_ZERO) as u64;
    // Data at [16K, 24K) (in 4 KiB units), trimmed then zeroed with
    // NO_HOLE at 20K (allocated again); the rest holes.
    assert_eq!(desc, vec![(16 * K, hz), (8 * K, 0), ((1 << 20) - 24 * K, hz)]);
    c.ext_request(0, NBD_CMD_DISC, 9, 0, 0, &[]);
    assert!(c.closed_by_server());
}

#[test]
fn extended_errors_keep_the_stream_in_sync() {
    let cfg = ServerConfig { max_request_bytes: 64 * 1024, ..Default::default() };
    let t = start_with(MemoryExport::new(SIZE), cfg);
    let mut c = ext_client(&t);
    // A WRITE without PAYLOAD_LEN (as qemu 10.0 sends them): its length is
    // still its payload.
    c.ext_request(0, NBD_CMD_WRITE, 1, 8192, 512, &pattern(1, 512));
    let r = c.ext_chunk();
    assert_eq!((r.handle, r.offset, r.ctype), (1, 8192, NBD_REPLY_TYPE_NONE));
    c.ext_request(PL, NBD_CMD_TRIM, 10, 8192, 16, &[0xaa; 16]);
    assert_eq!(c.ext_chunk().error(), NBD_EINVAL, "PAYLOAD_LEN on TRIM");
    c.ext_request(0, NBD_CMD_TRIM, 11, 8192, 4096, &[]);
    assert_eq!(c.ext_chunk().ctype, NBD_REPLY_TYPE_NONE);
    // A READ with a payload: the payload is consumed, EINVAL.
    c.ext_request(PL, NBD_CMD_READ, 2, 4096, 16, &[0xaa; 16]);
    let r = c.ext_chunk();
    assert_eq!((r.handle, r.offset, r.error()), (2, 4096, NBD_EINVAL));
    // 64-bit read lengths beyond the maximum payload: EOVERFLOW (nothing
    // allocated); beyond the export: EINVAL.
    c.ext_request(0, NBD_CMD_READ, 3, 0, 128 * 1024, &[]);
    assert_eq!(c.ext_chunk().error(), NBD_EOVERFLOW);
    c.ext_request(0, NBD_CMD_READ, 4, 0, 1 << 40, &[]);
    assert_eq!(c.ext_chunk().error(), NBD_EINVAL);
    // A WRITE past the end: ENOSPC, payload consumed.
    c.ext_request(PL, NBD_CMD_WRITE, 5, SIZE - 10, 100, &[0xee; 100]);
    assert_eq!(c.ext_chunk().error(), NBD_ENOSPC);
    // Still in sync: a read of what was never written.
    c.ext_request(0, NBD_CMD_READ, 6, 0, 4096, &[]);
    let r = c.ext_chunk();
    assert_eq!((r.handle, r.ctype), (6, NBD_REPLY_TYPE_OFFSET_HOLE));
    assert_eq!(t.export.allocated_blocks(), 0);
    // A payload beyond the maximum: hard disconnect (proto.md SHOULD).
    c.ext_request(PL, NBD_CMD_WRITE, 7, 0, 128 * 1024, &[]);
    assert!(c.closed_by_server());
}

#[test]
fn wrong_header_form_disconnects() {
    let t = start();
    // Compact request after negotiating extended headers.
    // (The server reads 32 bytes per header: the next request's first
    // bytes complete it.)
    let mut c = ext_client(&t);
    c.request(0, NBD_CMD_READ, 1, 0, 512, &[0; 4]);
    assert!(c.closed_by_server());
    // Extended request without negotiating them.
    let (mut c, _, _) = Client::open(t.addr, true);
    c.ext_request(0, NBD_CMD_READ, 1, 0, 512, &[]);
    assert!(c.closed_by_server());
    // NBD_OPT_EXPORT_NAME after extended headers (the client MUST NOT).
    let mut c = Client::connect(t.addr);
    assert_eq!(c.option(NBD_OPT_EXTENDED_HEADERS, &[])[0].rtype, NBD_REP_ACK);
    c.send_option(NBD_OPT_EXPORT_NAME, b"mem");
    assert!(c.closed_by_server());
}

/// A huge export that records the ranges it is asked about.
struct Recorder {
    calls: Mutex<Vec<(&'static str, u64, u64)>>,
}

const HUGE: u64 = 1 << 44;

impl Recorder {
    fn note(&self, what: &'static str, offset: u64, length: u64) {
        self.calls.lock().unwrap().push((what, offset, length));
    }
}

impl Export for Recorder {
    fn size(&self) -> u64 {
        HUGE
    }
    fn read_only(&self) -> bool {
        false
    }
    fn read(&self, o: u64, b: &mut [u8]) -> Result<(), ExportError> {
        self.note("read", o, b.len() as u64);
        b.fill(0x11);
        Ok(())
    }
    fn write(&self, o: u64, d: &[u8], _: bool) -> Result<(), ExportError> {
        self.note("write", o, d.len() as u64);
        Ok(())
    }
    fn flush(&self) -> Result<(), ExportError> {
        Ok(())
    }
    fn trim(&self, o: u64, l: u64, _: bool) -> Result<(), ExportError> {
        self.note("trim", o, l);
        Ok(())
    }
    fn write_zeroes(&self, o: u64, l: u64, _: bool, _: bool, _: bool) -> Result<(), ExportError> {
        self.note("zero", o, l);
        Ok(())
    }
    fn cache(&self, o: u64, l: u64) -> Result<(), ExportError> {
        self.note("cache", o, l);
        Ok(())
    }
    fn block_status(&self, o: u64, l: u64) -> Result<Vec<BlockStatusExtent>, ExportError> {
        self.note("status", o, l);
        Ok(vec![BlockStatusExtent { length: l, hole: false, zero: false }])
    }
}

#[test]
fn sixty_four_bit_effect_lengths() {
    let rec = Arc::new(Recorder { calls: Mutex::new(Vec::new()) });
    let backend = MemoryBackend::new().with_export("mem", "", rec.clone());
    let server = Server::new(Arc::new(backend), ServerConfig::default());
    let addr = server.listen_tcp("127.0.0.1:0").unwrap();
    let mut c = Client::connect(addr);
    open_extended(&mut c);
    let big = 5u64 << 40; // 5 TiB: more than 32 bits
    for (h, cmd) in [(1u64, NBD_CMD_TRIM), (2, NBD_CMD_WRITE_ZEROES), (3, NBD_CMD_CACHE)] {
        c.ext_request(0, cmd, h, K, big, &[]);
        let r = c.ext_chunk();
        assert_eq!((r.handle, r.ctype, r.offset), (h, NBD_REPLY_TYPE_NONE, K));
    }
    c.ext_request(0, NBD_CMD_BLOCK_STATUS, 4, K, big, &[]);
    let r = c.ext_chunk();
    assert_eq!(r.ctype, NBD_REPLY_TYPE_BLOCK_STATUS_EXT);
    let first_len = u64::from_be_bytes(r.payload[8..16].try_into().unwrap());
    assert!(first_len > 0 && first_len <= big, "{first_len}");
    let calls = rec.calls.lock().unwrap().clone();
    assert_eq!(calls, vec![("trim", K, big), ("zero", K, big), ("cache", K, big), ("status", K, big)]);
    server.shutdown();
}
