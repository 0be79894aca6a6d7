//! Drive the NBD server over a Unix socket pair: the fuzz input is what the
//! client sends (after the server's greeting); the replies are read and
//! dropped. The input ends with EOF, which ends the connection.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Once};

use tarn_nbd::memory::{MemoryBackend, MemoryExport};
use tarn_nbd::protocol::*;
use tarn_nbd::{Server, ServerConfig};

/// Size of each export (small: READs and block status stay cheap).
pub const EXPORT_SIZE: u64 = 1 << 20;
/// Largest READ/WRITE payload the server accepts here.
pub const MAX_REQUEST: u32 = 256 << 10;
/// Exports: "mem" (writable, dirty bitmap "snap") and "ro" (read-only).
pub const EXPORTS: [&str; 2] = ["mem", "ro"];
pub const DIRTY_BITMAP: &str = "snap";

/// How the server is set up for one run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Setup {
    /// Worker threads per connection (0: every request on the reading thread).
    pub workers: usize,
}

fn ignore_sigpipe() {
    static ONCE: Once = Once::new();
    // libFuzzer's main is not Rust's: SIGPIPE is not ignored by default, and
    // the client side may write after the server closed.
    // SAFETY: setting a signal disposition to SIG_IGN has no preconditions.
    ONCE.call_once(|| unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    });
}

/// Run one connection: `client` is everything the client sends after the
/// server's greeting.
pub fn run(client: &[u8], setup: Setup) {
    ignore_sigpipe();
    let backend = MemoryBackend::new()
        .with_export(
            EXPORTS[0],
            "fuzz export",
            Arc::new(MemoryExport::new(EXPORT_SIZE).with_dirty_bitmap(DIRTY_BITMAP)),
        )
        .with_export(EXPORTS[1], "", Arc::new(MemoryExport::new_read_only(EXPORT_SIZE)));
    let config = ServerConfig {
        max_in_flight_per_conn: 8,
        workers_per_conn: setup.workers,
        max_request_bytes: MAX_REQUEST,
        max_connections: 1,
        tls: None,
    };
    let server = Server::new(Arc::new(backend), config);
    let (ours, theirs) = UnixStream::pair().expect("socketpair");
    let mut sender = ours.try_clone().expect("clone socket");
    let input = client.to_vec();
    let send = std::thread::spawn(move || {
        // Fails once the server has closed: that is fine.
        let _ = sender.write_all(&input);
        let _ = sender.shutdown(Shutdown::Write);
    });
    let mut receiver = ours;
    let drain = std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        while let Ok(n) = receiver.read(&mut buf) {
            if n == 0 {
                break;
            }
        }
    });
    server.serve_unix_stream(theirs);
    let _ = send.join();
    let _ = drain.join();
}

fn option(out: &mut Vec<u8>, option: u32, data: &[u8]) {
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

/// NBD_OPT_GO / NBD_OPT_INFO data: export name, then info requests.
pub fn info_data(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    infos.iter().for_each(|i| d.extend_from_slice(&i.to_be_bytes()));
    d
}

/// The client's side of a complete handshake, chosen by `mode`:
/// bit 0 structured replies, bit 1 metadata contexts (base:allocation and
/// the dirty bitmap), bit 2 the read-only export, bit 3 the old
/// NBD_OPT_EXPORT_NAME instead of NBD_OPT_GO.
pub fn handshake(mode: u8) -> Vec<u8> {
    let name = EXPORTS[usize::from(mode >> 2 & 1)];
    let mut out = (NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES).to_be_bytes().to_vec();
    if mode & 1 != 0 {
        option(&mut out, NBD_OPT_STRUCTURED_REPLY, &[]);
    }
    if mode & 2 != 0 {
        let bitmap = format!("qemu:dirty-bitmap:{DIRTY_BITMAP}");
        option(&mut out, NBD_OPT_SET_META_CONTEXT, &encode_meta_context_request(name, &["base:allocation", &bitmap]));
    }
    if mode & 8 != 0 {
        option(&mut out, NBD_OPT_EXPORT_NAME, name.as_bytes());
    } else {
        option(&mut out, NBD_OPT_GO, &info_data(name, &[NBD_INFO_BLOCK_SIZE, NBD_INFO_NAME]));
    }
    out
}

/// Every option once, valid, before a GO (a handshake seed).
pub fn every_option() -> Vec<u8> {
    let mut out = (NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES).to_be_bytes().to_vec();
    option(&mut out, NBD_OPT_LIST, &[]);
    option(&mut out, NBD_OPT_INFO, &info_data("", &[NBD_INFO_DESCRIPTION, NBD_INFO_BLOCK_SIZE]));
    option(&mut out, NBD_OPT_STARTTLS, &[]);
    option(&mut out, NBD_OPT_EXTENDED_HEADERS, &[]);
    option(&mut out, NBD_OPT_STRUCTURED_REPLY, &[]);
    option(&mut out, NBD_OPT_LIST_META_CONTEXT, &encode_meta_context_request("mem", &[]));
    option(&mut out, NBD_OPT_LIST_META_CONTEXT, &encode_meta_context_request("mem", &["qemu:"]));
    option(&mut out, NBD_OPT_SET_META_CONTEXT, &encode_meta_context_request("mem", &["base:allocation"]));
    option(&mut out, NBD_OPT_GO, &info_data("mem", &[NBD_INFO_EXPORT, NBD_INFO_NAME]));
    out
}

/// One request header (and WRITE payload).
pub fn request(out: &mut Vec<u8>, flags: u16, command: u16, offset: u64, length: u32) {
    let h = RequestHeader { flags, command, handle: out.len() as u64, offset, length };
    out.extend_from_slice(&encode_request_header(&h));
    if command == NBD_CMD_WRITE {
        out.extend((0..length).map(|i| i as u8));
    }
}

/// A transmission seed: every command once, then DISC.
pub fn every_command(read_only: bool) -> Vec<u8> {
    let mut out = Vec::new();
    if !read_only {
        request(&mut out, NBD_CMD_FLAG_FUA, NBD_CMD_WRITE, 4096, 8192);
        request(&mut out, 0, NBD_CMD_WRITE, 100, 1000);
        request(&mut out, NBD_CMD_FLAG_NO_HOLE, NBD_CMD_WRITE_ZEROES, 65536, 4096);
        request(&mut out, 0, NBD_CMD_WRITE_ZEROES, 131072, 65536);
        request(&mut out, 0, NBD_CMD_TRIM, 4096, 4096);
    }
    request(&mut out, 0, NBD_CMD_READ, 0, 16384);
    request(&mut out, NBD_CMD_FLAG_DF, NBD_CMD_READ, 0, 4096);
    request(&mut out, 0, NBD_CMD_CACHE, 0, 4096);
    request(&mut out, 0, NBD_CMD_BLOCK_STATUS, 0, 1 << 20);
    request(&mut out, NBD_CMD_FLAG_REQ_ONE, NBD_CMD_BLOCK_STATUS, 4096, 8192);
    request(&mut out, 0, NBD_CMD_FLUSH, 0, 0);
    request(&mut out, 0, NBD_CMD_READ, EXPORT_SIZE - 512, 1024);
    request(&mut out, 0, NBD_CMD_DISC, 0, 0);
    out
}
