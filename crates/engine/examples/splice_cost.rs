//! What a 1 MiB write payload costs a server between the socket and the
//! page cache, three ways (issue 10's 1M sequential write, lead 3: one
//! copy fewer). A client thread streams 1 MiB messages over TCP loopback;
//! the server thread lands each one in a 2 GiB file, overwriting it in a
//! loop as `bench/warm_read.sh`'s sw1m job does:
//!
//! - `recv`: read into a buffer, crc32c per 64 KiB, `pwrite` (tarn today);
//! - `splice`: socket -> pipe -> file with `splice` (no copy into user
//!   memory), then crc32c per 64 KiB read through a read-only shared
//!   mapping of the file (the page-cache pages just written);
//! - `nocrc`: read into a buffer and `pwrite` (nbdkit's file plugin).
//!
//! Prints per mode MiB/s and the CPU per MiB of the server thread and of
//! the whole process (the client's share is the same in every mode, and
//! loopback's receive work lands on either thread), measured after one
//! warm-up pass over the file, so every page is in the page cache.
//!
//!   cargo run --release -p tarn-engine --example splice_cost -- FILE [SECS] [ROUNDS]

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tarn_format::checksum::crc32c;

const MIB: usize = 1 << 20;
const FILE_MIB: usize = 2048;
const GROUP: usize = 64 << 10;

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "/var/tmp/tarn-splice-cost.img".into());
    let secs: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(4);
    let rounds: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(3);
    for round in 1..=rounds {
        for mode in ["recv", "splice", "nocrc"] {
            let (mibs, server, both) = run(mode, &path, Duration::from_secs(secs));
            println!("round {round} {mode}: {mibs:.0} MiB/s, CPU per MiB: server thread {server:.0} us, with the client {both:.0} us");
        }
    }
    std::fs::remove_file(&path).expect("remove the scratch file");
}

/// CPU time of the calling thread (`RUSAGE_THREAD`) or of the whole
/// process, client included (`RUSAGE_SELF`), in seconds.
fn cpu_of(who: libc::c_int) -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    let r = unsafe {
        let mut r: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut r);
        r
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(r.ru_utime) + tv(r.ru_stime)
}

/// Stream 1 MiB messages to `port` until `stop`.
fn client(port: u16, stop: Arc<AtomicBool>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let buf = vec![0x5au8; MIB];
    while !stop.load(Ordering::Relaxed) && s.write_all(&buf).is_ok() {}
}

/// One mode: a warm-up pass over the file, then `secs` measured.
fn run(mode: &str, path: &str, secs: Duration) -> (f64, f64, f64) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    let stop = Arc::new(AtomicBool::new(false));
    let sender = std::thread::spawn({
        let stop = stop.clone();
        move || client(port, stop)
    });
    let (sock, _) = listener.accept().expect("accept");
    let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).expect("open");
    file.set_len((FILE_MIB * MIB) as u64).expect("size");
    let mut sink = Sink::new(mode, sock, file);
    (0..FILE_MIB).for_each(|i| sink.land(i));
    let (t0, c0, p0) = (Instant::now(), cpu_of(libc::RUSAGE_THREAD), cpu_of(libc::RUSAGE_SELF));
    let mut n = 0;
    while t0.elapsed() < secs {
        sink.land(n % FILE_MIB);
        n += 1;
    }
    let (wall, cpu, both) =
        (t0.elapsed().as_secs_f64(), cpu_of(libc::RUSAGE_THREAD) - c0, cpu_of(libc::RUSAGE_SELF) - p0);
    stop.store(true, Ordering::Relaxed);
    drop(sink);
    sender.join().expect("client");
    (n as f64 / wall, cpu * 1e6 / n as f64, both * 1e6 / n as f64)
}

/// The server side: where each message goes.
struct Sink {
    splice: bool,
    crc: bool,
    sock: TcpStream,
    file: File,
    buf: Vec<u8>,
    pipe: [libc::c_int; 2],
    map: *const u8,
    sums: u32,
}

impl Sink {
    fn new(mode: &str, sock: TcpStream, file: File) -> Sink {
        let mut pipe = [0; 2];
        // SAFETY: pipe writes two fds into the array; mmap maps the file
        // read-only and shared (the page cache itself), checked below.
        let map = unsafe {
            assert_eq!(libc::pipe(pipe.as_mut_ptr()), 0, "pipe");
            assert!(libc::fcntl(pipe[1], libc::F_SETPIPE_SZ, MIB as libc::c_int) >= MIB as libc::c_int, "pipe size");
            let len = FILE_MIB * MIB;
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0)
        };
        assert_ne!(map, libc::MAP_FAILED, "mmap");
        let (splice, crc) = (mode == "splice", mode != "nocrc");
        Sink { splice, crc, sock, file, buf: vec![0; MIB], pipe, map: map as *const u8, sums: 0 }
    }

    /// Receive one message and write it at MiB `at` of the file.
    fn land(&mut self, at: usize) {
        let off = at * MIB;
        if !self.splice {
            self.sock.read_exact(&mut self.buf).expect("receive");
            if self.crc {
                self.sums ^= self.buf.chunks(GROUP).fold(0, |a, g| a ^ crc32c(g));
            }
            self.file.write_all_at(&self.buf, off as u64).expect("write");
            return;
        }
        self.splice_in();
        self.splice_out(off as i64);
        // SAFETY: [off, off + MIB) lies inside the mapping of FILE_MIB MiB.
        let page_cache = unsafe { std::slice::from_raw_parts(self.map.add(off), MIB) };
        self.sums ^= page_cache.chunks(GROUP).fold(0, |a, g| a ^ crc32c(g));
    }

    /// Socket -> pipe, one whole message.
    fn splice_in(&self) {
        let mut got = 0;
        while got < MIB {
            // SAFETY: splice between two fds we own; no memory of ours.
            let n = unsafe {
                let (sock, null) = (self.sock.as_raw_fd(), std::ptr::null_mut());
                libc::splice(sock, null, self.pipe[1], null, MIB - got, libc::SPLICE_F_MOVE)
            };
            assert!(n > 0, "splice from the socket");
            got += n as usize;
        }
    }

    /// Pipe -> file at `off`, one whole message.
    fn splice_out(&self, mut off: i64) {
        let mut put = 0;
        while put < MIB {
            // SAFETY: as above; `off` is ours and advanced by the kernel.
            let n = unsafe {
                let (file, null) = (self.file.as_raw_fd(), std::ptr::null_mut());
                libc::splice(self.pipe[0], null, file, &mut off, MIB - put, libc::SPLICE_F_MOVE)
            };
            assert!(n > 0, "splice to the file");
            put += n as usize;
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        // SAFETY: the mapping and the pipe's fds are ours and used no more.
        unsafe {
            libc::munmap(self.map as *mut libc::c_void, FILE_MIB * MIB);
            libc::close(self.pipe[0]);
            libc::close(self.pipe[1]);
        }
        // Keep the checksums observable, so the optimizer keeps them.
        std::hint::black_box(self.sums);
    }
}
