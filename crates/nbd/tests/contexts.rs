//! Metadata contexts beyond `base:allocation` (qemu's dirty bitmaps):
//! listing, selection, multi-chunk block status replies, hostile requests.

mod common;

use std::sync::Arc;

use common::*;
use tarn_nbd::memory::{MemoryBackend, MemoryExport, DIRTY_GRANULARITY as G};
use tarn_nbd::protocol::*;
use tarn_nbd::{BlockStatusExtent, ContextExtent, Export, ExportError, Server, ServerConfig};

const BITMAP: &str = "qemu:dirty-bitmap:b";
const HZ: u32 = NBD_STATE_HOLE | NBD_STATE_ZERO;

/// Client with structured replies negotiated, still haggling.
fn structured(t: &TestServer) -> Client {
    let mut c = Client::connect(t.addr);
    c.structured();
    c
}

/// (context id, descriptors) of each chunk of a block status reply, and
/// whether only the last one is flagged DONE.
fn parse_chunks(chunks: &[Chunk]) -> Vec<(u32, Vec<(u32, u32)>)> {
    for (i, ch) in chunks.iter().enumerate() {
        assert_eq!(ch.ctype, NBD_REPLY_TYPE_BLOCK_STATUS, "{ch:?}");
        assert_eq!(ch.flags & NBD_REPLY_FLAG_DONE != 0, i + 1 == chunks.len(), "DONE only on the last chunk");
    }
    chunks.iter().map(|c| parse_block_status(&c.payload)).collect()
}

#[test]
fn list_contexts() {
    let t = start_dirty("b");
    let mut c = structured(&t);
    assert_eq!(c.list_meta("mem", &[]), ["base:allocation", BITMAP]);
    assert_eq!(c.list_meta("", &[]), ["base:allocation", BITMAP], "the default export");
    assert_eq!(c.list_meta("mem", &["qemu:"]), [BITMAP]);
    assert_eq!(c.list_meta("mem", &["qemu:dirty-bitmap:"]), [BITMAP]);
    assert_eq!(c.list_meta("mem", &["base:"]), ["base:allocation"]);
    assert_eq!(c.list_meta("mem", &[BITMAP, "base:allocation"]), ["base:allocation", BITMAP]);
    // Unknown names and namespaces, and prefixes that are not wildcards.
    assert!(c.list_meta("mem", &["qemu:dirty-bitmap:nope", "x-foo:bar", "qemu", "qemu:dirty-bitmap"]).is_empty());
    assert!(c.list_meta("mem", &["qemu:allocation-depth"]).is_empty());
    assert!(c.go("mem", &[]).is_ok());
}

#[test]
fn two_contexts_two_chunks() {
    let t = start_dirty("b");
    let mut c = structured(&t);
    let ids = c.set_meta_ids("mem", &["base:allocation", BITMAP]);
    let names: Vec<&str> = ids.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["base:allocation", BITMAP]);
    let (base, bitmap) = (ids[0].0, ids[1].0);
    assert!(base != 0 && bitmap != 0 && base != bitmap, "{ids:?}");
    c.go("mem", &[]).unwrap();

    c.write(1, 2 * G + 10, &pattern(1, 4096)); // dirties chunk 2, allocates two 4 KiB blocks
    assert_eq!(c.simple(), (0, 1));
    c.request(0, NBD_CMD_TRIM, 2, 16 * G, 4096, &[]); // dirties chunk 16, stays a hole
    assert_eq!(c.simple(), (0, 2));
    c.request(NBD_CMD_FLAG_NO_HOLE, NBD_CMD_WRITE_ZEROES, 3, 48 * G, 100, &[]); // chunk 48
    assert_eq!(c.simple(), (0, 3));

    let r = parse_chunks(&c.block_status(0, 4, 0, 64 * G as u32));
    assert_eq!(r.len(), 2);
    assert_eq!(r[0], (base, vec![(131072, HZ), (8192, 0), (3_006_464, HZ), (4096, 0), (1_044_480, HZ)]));
    let g = G as u32;
    let dirty = vec![(2 * g, 0), (g, 1), (13 * g, 0), (g, 1), (31 * g, 0), (g, 1), (15 * g, 0)];
    assert_eq!(r[1], (bitmap, dirty));

    // REQ_ONE: one descriptor per context, within the request.
    let r = parse_chunks(&c.block_status(NBD_CMD_FLAG_REQ_ONE, 5, 2 * G + 100, 1000));
    assert_eq!(r, [(base, vec![(1000, 0)]), (bitmap, vec![(1000, 1)])]);
    let r = parse_chunks(&c.block_status(NBD_CMD_FLAG_REQ_ONE, 6, 0, 1 << 20));
    assert_eq!(r, [(base, vec![(131072, HZ)]), (bitmap, vec![(2 * g, 0)])]);
    // Never beyond the request, even where the extent goes on.
    let r = parse_chunks(&c.block_status(0, 7, 100, 200));
    assert_eq!(r, [(base, vec![(200, HZ)]), (bitmap, vec![(200, 0)])]);
    // Out of range: one error chunk for the whole request.
    c.request(0, NBD_CMD_BLOCK_STATUS, 8, SIZE - 512, 1024, &[]);
    assert_eq!(c.error_of_next(), (NBD_EINVAL, 8));
}

#[test]
fn chunks_follow_the_selection_order() {
    let t = start_dirty("b");
    let mut c = structured(&t);
    // An earlier SET is replaced; duplicates and wildcards select nothing more.
    c.set_meta_ids("mem", &["base:allocation"]);
    let ids = c.set_meta_ids("mem", &["qemu:", BITMAP, "base:", "base:allocation", BITMAP]);
    let names: Vec<&str> = ids.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, [BITMAP, "base:allocation"]);
    c.go("mem", &[]).unwrap();
    c.write(1, 0, &[1; 512]);
    assert_eq!(c.simple(), (0, 1));
    let r = parse_chunks(&c.block_status(0, 2, 0, 2 * G as u32));
    assert_eq!(r, [(ids[0].0, vec![(G as u32, 1), (G as u32, 0)]), (ids[1].0, vec![(4096, 0), (126_976, HZ)])]);
}

#[test]
fn bitmap_alone() {
    let t = start_dirty("b");
    t.export.write(5 * G, &[1], false).unwrap();
    let mut c = structured(&t);
    let ids = c.set_meta_ids("", &[BITMAP]);
    assert_eq!(ids.len(), 1);
    c.go("mem", &[]).unwrap();
    let r = parse_chunks(&c.block_status(0, 1, 4 * G, 2 * G as u32));
    assert_eq!(r, [(ids[0].0, vec![(G as u32, 0), (G as u32, 1)])]);
}

#[test]
fn unknown_contexts_select_nothing() {
    let t = start_dirty("b");
    let mut c = structured(&t);
    let ids = c.set_meta_ids("mem", &["qemu:dirty-bitmap:nope", "qemu:", "qemu:dirty-bitmap:", "base:", "x-a:b"]);
    assert!(ids.is_empty());
    assert!(c.set_meta_ids("mem", &[]).is_empty(), "an empty SET selects nothing");
    c.go("mem", &[]).unwrap();
    c.request(0, NBD_CMD_BLOCK_STATUS, 1, 0, 4096, &[]);
    assert_eq!(c.error_of_next(), (NBD_EINVAL, 1));
}

#[test]
fn bitmap_on_an_export_without_one() {
    let t = start();
    let mut c = structured(&t);
    assert_eq!(c.list_meta("mem", &[]), ["base:allocation"]);
    assert!(c.list_meta("mem", &["qemu:", "qemu:dirty-bitmap:", BITMAP]).is_empty());
    assert!(c.set_meta_ids("mem", &[BITMAP]).is_empty());
    let ids = c.set_meta_ids("mem", &[BITMAP, "base:allocation"]);
    assert_eq!(ids.len(), 1);
    c.go("mem", &[]).unwrap();
    let r = parse_chunks(&c.block_status(0, 1, 0, 4096));
    assert_eq!(r, [(ids[0].0, vec![(4096, HZ)])]);
}

#[test]
fn selection_is_per_export() {
    let a = Arc::new(MemoryExport::new(1 << 20).with_dirty_bitmap("x"));
    let b = Arc::new(MemoryExport::new(1 << 20).with_dirty_bitmap("y"));
    let backend = MemoryBackend::new().with_export("a", "", a).with_export("b", "", b);
    let server = Server::new(Arc::new(backend), ServerConfig::default());
    let addr = server.listen_tcp("127.0.0.1:0").unwrap();
    let mut c = Client::connect(addr);
    c.structured();
    assert_eq!(c.list_meta("b", &["qemu:"]), ["qemu:dirty-bitmap:y"]);
    assert!(c.set_meta_ids("b", &["qemu:dirty-bitmap:x"]).is_empty());
    assert_eq!(c.set_meta_ids("a", &["qemu:dirty-bitmap:x"]).len(), 1);
    c.go("b", &[]).unwrap();
    c.request(0, NBD_CMD_BLOCK_STATUS, 1, 0, 4096, &[]);
    assert_eq!(c.error_of_next(), (NBD_EINVAL, 1));
    server.shutdown();
}

#[test]
fn hostile_meta_requests() {
    let t = start_dirty("b");
    let mut c = structured(&t);
    let one = |c: &mut Client, opt: u32, data: &[u8]| {
        let r = c.option(opt, data);
        assert_eq!(r.len(), 1, "{r:?}");
        r[0].rtype
    };
    // Too many queries: refused, for LIST and SET.
    let q65: Vec<&str> = vec![BITMAP; 65];
    assert_eq!(one(&mut c, NBD_OPT_LIST_META_CONTEXT, &meta_data("mem", &q65)), NBD_REP_ERR_TOO_BIG);
    assert_eq!(c.list_meta("mem", &q65[..64]), [BITMAP]);
    let q16k: Vec<&str> = vec![""; 16000];
    assert_eq!(one(&mut c, NBD_OPT_LIST_META_CONTEXT, &meta_data("mem", &q16k)), NBD_REP_ERR_TOO_BIG);
    // Malformed: absurd query count, over-long query, query past the end.
    let mut absurd = meta_data("mem", &[]);
    absurd[7..11].copy_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(one(&mut c, NBD_OPT_LIST_META_CONTEXT, &absurd), NBD_REP_ERR_INVALID);
    let long = format!("qemu:dirty-bitmap:{}", "a".repeat(5000));
    assert_eq!(one(&mut c, NBD_OPT_SET_META_CONTEXT, &meta_data("mem", &[&long])), NBD_REP_ERR_INVALID);
    let mut cut = meta_data("mem", &[BITMAP]);
    cut.pop();
    assert_eq!(one(&mut c, NBD_OPT_LIST_META_CONTEXT, &cut), NBD_REP_ERR_INVALID);
    // A refused SET still clears the earlier selection.
    assert_eq!(c.set_meta_ids("mem", &[BITMAP]).len(), 1);
    assert_eq!(one(&mut c, NBD_OPT_SET_META_CONTEXT, &meta_data("mem", &q65)), NBD_REP_ERR_TOO_BIG);
    c.go("mem", &[]).unwrap();
    c.request(0, NBD_CMD_BLOCK_STATUS, 1, 0, 4096, &[]);
    assert_eq!(c.error_of_next(), (NBD_EINVAL, 1));
}

/// An export with odd extra contexts: one failing, one answering nothing,
/// one answering past the request, and a few invalid names.
struct Odd;

impl Export for Odd {
    fn size(&self) -> u64 {
        1 << 20
    }
    fn read_only(&self) -> bool {
        true
    }
    fn read(&self, _: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        buf.fill(0);
        Ok(())
    }
    fn write(&self, _: u64, _: &[u8], _: bool) -> Result<(), ExportError> {
        Err(ExportError::Perm)
    }
    fn flush(&self) -> Result<(), ExportError> {
        Ok(())
    }
    fn trim(&self, _: u64, _: u64, _: bool) -> Result<(), ExportError> {
        Err(ExportError::Perm)
    }
    fn write_zeroes(&self, _: u64, _: u64, _: bool, _: bool, _: bool) -> Result<(), ExportError> {
        Err(ExportError::Perm)
    }
    fn block_status(&self, _: u64, length: u64) -> Result<Vec<BlockStatusExtent>, ExportError> {
        Ok(vec![BlockStatusExtent { length, hole: false, zero: false }])
    }
    fn meta_contexts(&self) -> Vec<String> {
        ["x-t:fail", "bad", "base:more", "x-t:empty", "x-t:long", "x-t:", "x-t:long"].map(String::from).to_vec()
    }
    fn context_status(&self, name: &str, _: u64, _: u64) -> Result<Vec<ContextExtent>, ExportError> {
        match name {
            "x-t:fail" => Err(ExportError::Overflow),
            "x-t:empty" => Ok(vec![ContextExtent { length: 0, flags: 1 }]),
            "x-t:long" => Ok(vec![ContextExtent { length: 0, flags: 9 }, ContextExtent { length: 1 << 40, flags: 5 }]),
            _ => panic!("context {name:?} was never offered"),
        }
    }
}

#[test]
fn export_context_errors() {
    let backend = MemoryBackend::new().with_export("odd", "", Arc::new(Odd));
    let server = Server::new(Arc::new(backend), ServerConfig::default());
    let addr = server.listen_tcp("127.0.0.1:0").unwrap();
    let session = |queries: &[&str]| {
        let mut c = Client::connect(addr);
        c.structured();
        let ids = c.set_meta_ids("odd", queries);
        c.go("odd", &[]).unwrap();
        (c, ids)
    };
    let mut c = Client::connect(addr);
    c.structured();
    assert_eq!(c.list_meta("odd", &[]), ["base:allocation", "x-t:fail", "x-t:empty", "x-t:long"]);
    assert!(c.set_meta_ids("odd", &["bad", "base:more", "x-t:"]).is_empty());

    let (mut c, ids) = session(&["base:allocation", "x-t:long"]);
    let r = parse_chunks(&c.block_status(0, 1, 4096, 8192));
    assert_eq!(r, [(ids[0].0, vec![(8192, 0)]), (ids[1].0, vec![(8192, 5)])]);
    // A failing context fails the whole request, with its error.
    let (mut c, _) = session(&["base:allocation", "x-t:fail"]);
    c.request(0, NBD_CMD_BLOCK_STATUS, 2, 0, 4096, &[]);
    assert_eq!(c.error_of_next(), (NBD_EOVERFLOW, 2));
    // No extent at all is an I/O error; the connection goes on.
    let (mut c, _) = session(&["x-t:empty"]);
    c.request(0, NBD_CMD_BLOCK_STATUS, 3, 0, 4096, &[]);
    assert_eq!(c.error_of_next(), (NBD_EIO, 3));
    c.request(NBD_CMD_FLAG_REQ_ONE, NBD_CMD_BLOCK_STATUS, 4, 0, 4096, &[]);
    assert_eq!(c.error_of_next(), (NBD_EIO, 4));
    c.request(0, NBD_CMD_READ, 5, 0, 8, &[]);
    assert_eq!(c.chunk().payload, [0u8; 16]); // offset 0, then 8 zero bytes
    server.shutdown();
}
