//! Structured reads of a sparse export: the ranges that read as zeroes come
//! as NBD_REPLY_TYPE_OFFSET_HOLE chunks, the rest as OFFSET_DATA.

mod common;

use std::sync::Arc;

use common::*;
use tarn_nbd::memory::{MemoryBackend, MemoryExport};
use tarn_nbd::protocol::*;
use tarn_nbd::{BlockStatusExtent, Export, ExportError, Server, ServerConfig};

const K: u64 = 4096;

/// The content chunks as (type, offset, length); the data they carry put
/// together (holes as zeroes), checking that they tile [offset, offset+len).
fn assemble(chunks: &[Chunk], offset: u64, len: usize) -> (Vec<(u16, u64, u64)>, Vec<u8>) {
    let mut kinds = Vec::new();
    let mut out = vec![0xeeu8; len];
    let mut covered = vec![false; len];
    for ch in chunks {
        let at = u64::from_be_bytes(ch.payload[0..8].try_into().unwrap());
        let (n, data) = match ch.ctype {
            NBD_REPLY_TYPE_OFFSET_DATA => (ch.payload.len() as u64 - 8, Some(&ch.payload[8..])),
            NBD_REPLY_TYPE_OFFSET_HOLE => (parse_hole(&ch.payload).1 as u64, None),
            other => panic!("unexpected chunk type {other}"),
        };
        assert!(n > 0 && at >= offset && at + n <= offset + len as u64, "chunk {at}+{n} outside the request");
        let s = (at - offset) as usize;
        for i in s..s + n as usize {
            assert!(!covered[i], "chunks overlap at {}", offset + i as u64);
            covered[i] = true;
            out[i] = data.map_or(0, |d| d[i - s]);
        }
        kinds.push((ch.ctype, at, n));
    }
    assert!(covered.iter().all(|&c| c), "chunks do not cover the request");
    (kinds, out)
}

/// Data at [16K, 32K) and [64K, 68K) of a fresh export, the rest unwritten.
fn sparse_server() -> (TestServer, Client, Vec<u8>) {
    let t = start();
    let (mut c, _, _) = Client::open(t.addr, true);
    let mut want = vec![0u8; 128 * K as usize];
    for (h, at, len) in [(1u64, 4 * K, 4 * K), (2, 16 * K, K)] {
        let d = pattern(h as u8, len as usize);
        c.write(h, at, &d);
        assert_eq!(c.simple(), (0, h));
        want[at as usize..(at + len) as usize].copy_from_slice(&d);
    }
    (t, c, want)
}

#[test]
fn sparse_read_sends_holes_as_hole_chunks() {
    let (_t, mut c, want) = sparse_server();
    c.request(0, NBD_CMD_READ, 10, 0, 128 * K as u32, &[]);
    let ch = c.chunks(10);
    assert!(ch[..ch.len() - 1].iter().all(|c| c.flags & NBD_REPLY_FLAG_DONE == 0), "DONE only on the last chunk");
    let (kinds, data) = assemble(&ch, 0, 128 * K as usize);
    let (d, h) = (NBD_REPLY_TYPE_OFFSET_DATA, NBD_REPLY_TYPE_OFFSET_HOLE);
    assert_eq!(kinds, vec![(h, 0, 4 * K), (d, 4 * K, 4 * K), (h, 8 * K, 8 * K), (d, 16 * K, K), (h, 17 * K, 111 * K)]);
    assert_eq!(data, want);

    // An unaligned range that starts and ends inside data.
    c.request(0, NBD_CMD_READ, 11, 5 * K + 7, (12 * K) as u32, &[]);
    let ch = c.chunks(11);
    let (kinds, data) = assemble(&ch, 5 * K + 7, 12 * K as usize);
    assert_eq!(kinds.iter().map(|k| k.0).collect::<Vec<_>>(), vec![d, h, d]);
    assert_eq!(data, want[(5 * K + 7) as usize..(17 * K + 7) as usize]);
}

#[test]
fn allocated_read_is_one_data_chunk_and_unwritten_read_one_hole() {
    let (_t, mut c, want) = sparse_server();
    c.request(0, NBD_CMD_READ, 20, 4 * K, 4 * K as u32, &[]);
    let ch = c.chunk();
    assert_eq!((ch.handle, ch.ctype, ch.flags), (20, NBD_REPLY_TYPE_OFFSET_DATA, NBD_REPLY_FLAG_DONE));
    assert_eq!(&ch.payload[8..], &want[4 * K as usize..8 * K as usize]);

    c.request(0, NBD_CMD_READ, 21, 32 * K, (64 * K) as u32, &[]);
    let ch = c.chunk();
    assert_eq!((ch.handle, ch.ctype, ch.flags), (21, NBD_REPLY_TYPE_OFFSET_HOLE, NBD_REPLY_FLAG_DONE));
    assert_eq!(parse_hole(&ch.payload), (32 * K, 64 * K as u32));
}

#[test]
fn df_and_simple_reads_carry_the_zeroes() {
    let (t, mut c, want) = sparse_server();
    // DF: one OFFSET_DATA chunk with the zeroes in it.
    c.request(NBD_CMD_FLAG_DF, NBD_CMD_READ, 30, 0, 32 * K as u32, &[]);
    let ch = c.chunk();
    assert_eq!((ch.ctype, ch.flags), (NBD_REPLY_TYPE_OFFSET_DATA, NBD_REPLY_FLAG_DONE));
    assert_eq!(&ch.payload[8..], &want[..32 * K as usize]);
    // Simple replies: the data, zeroes included.
    let (mut s, _, _) = Client::open(t.addr, false);
    assert_eq!(s.read_simple(31, 0, 32 * K as u32), want[..32 * K as usize]);
}

/// A memory export whose block status always fails.
struct NoStatus(MemoryExport);

impl Export for NoStatus {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read_only(&self) -> bool {
        false
    }
    fn read(&self, o: u64, b: &mut [u8]) -> Result<(), ExportError> {
        self.0.read(o, b)
    }
    fn write(&self, o: u64, d: &[u8], f: bool) -> Result<(), ExportError> {
        self.0.write(o, d, f)
    }
    fn flush(&self) -> Result<(), ExportError> {
        Ok(())
    }
    fn trim(&self, o: u64, l: u64, f: bool) -> Result<(), ExportError> {
        self.0.trim(o, l, f)
    }
    fn write_zeroes(&self, o: u64, l: u64, n: bool, fa: bool, fu: bool) -> Result<(), ExportError> {
        self.0.write_zeroes(o, l, n, fa, fu)
    }
    fn block_status(&self, _: u64, _: u64) -> Result<Vec<BlockStatusExtent>, ExportError> {
        Err(ExportError::Io)
    }
}

#[test]
fn read_without_block_status_is_plain_data() {
    let backend = MemoryBackend::new().with_export("mem", "", Arc::new(NoStatus(MemoryExport::new(SIZE))));
    let server = Server::new(Arc::new(backend), ServerConfig::default());
    let addr = server.listen_tcp("127.0.0.1:0").unwrap();
    let mut c = Client::connect(addr);
    c.structured();
    c.go("mem", &[]).unwrap();
    c.request(0, NBD_CMD_READ, 40, 0, 8 * K as u32, &[]);
    let ch = c.chunk();
    assert_eq!((ch.ctype, ch.flags), (NBD_REPLY_TYPE_OFFSET_DATA, NBD_REPLY_FLAG_DONE));
    assert_eq!(&ch.payload[8..], &[0u8; 8 * K as usize][..]);
    server.shutdown();
}
