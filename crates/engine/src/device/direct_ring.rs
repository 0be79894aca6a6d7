//! O_DIRECT writes through a per-thread io_uring instead of `pwrite`.
//!
//! Why: a synchronous O_DIRECT `pwrite` into a file on ext4 holds the
//! file's inode lock until the device finishes, exclusively when it fills
//! a hole (every first write into a sparse pool file). Every buffered
//! write to the same pool file (metadata, small writes) then waits for
//! the whole transfer. Submitted through io_uring the write is
//! asynchronous to the kernel: the lock is held while the blocks are
//! allocated and the I/O submitted, not while it runs. The caller still
//! waits for the completion, so the `Device::write_at` contract is
//! unchanged. Where io_uring is refused (old kernel, seccomp) the thread
//! falls back to `pwrite` for good.
//!
//! Only threads that ask (`submit_direct_writes_async`) take this path:
//! the kernel finishes such a write on an io-wq worker, a hop that made a
//! lone writer slower (PostMark on a file volume 26-27 s against 23-24 s
//! with `pwrite`); it pays where another thread writes the same file
//! meanwhile (tarn-fs's write-behind thread).

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;

use io_uring::{opcode, types, IoUring};

/// Submissions per ring: one write at a time per thread.
const RING_ENTRIES: u32 = 2;
/// Completions a write may take (each a short write or an interrupted
/// wait) before it is an error: bounds the loop below.
const MAX_ROUNDS: usize = 64;

enum Ring {
    Unset,
    Ready(Box<IoUring>),
    Refused,
}

thread_local! {
    static RING: RefCell<Ring> = const { RefCell::new(Ring::Unset) };
    static ASKED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// From now on this thread's O_DIRECT writes go through io_uring.
pub fn submit_direct_writes_async() {
    ASKED.set(true);
}

/// Write all of `data` at `offset` of `file` (opened O_DIRECT; buffer,
/// length and offset aligned by the caller), waiting for it to complete.
pub(crate) fn write_all_at(file: &File, data: &[u8], offset: u64) -> io::Result<()> {
    if !ASKED.get() {
        return file.write_all_at(data, offset);
    }
    RING.with_borrow_mut(|ring| {
        if let Ring::Unset = ring {
            *ring = match IoUring::new(RING_ENTRIES) {
                Ok(r) => Ring::Ready(Box::new(r)),
                Err(e) => {
                    log::debug!("io_uring for direct writes refused ({e}): pwrite instead");
                    Ring::Refused
                }
            };
        }
        match ring {
            Ring::Ready(r) => write_through(r, file, data, offset),
            _ => file.write_all_at(data, offset),
        }
    })
}

fn write_through(ring: &mut IoUring, file: &File, data: &[u8], offset: u64) -> io::Result<()> {
    let mut done = 0usize;
    for _ in 0..MAX_ROUNDS {
        if done == data.len() {
            return Ok(());
        }
        let rest = &data[done..];
        let len = u32::try_from(rest.len()).unwrap_or(!4095);
        let sqe =
            opcode::Write::new(types::Fd(file.as_raw_fd()), rest.as_ptr(), len).offset(offset + done as u64).build();
        // SAFETY: `rest` outlives the wait below, which returns only once
        // the kernel has completed (or refused) this one submission.
        unsafe { ring.submission().push(&sqe) }.map_err(|_| io::Error::other("direct-write ring full"))?;
        let res = submit_and_reap(ring)?;
        match res {
            n if n > 0 => done += n as usize,
            0 => return Err(io::Error::new(io::ErrorKind::WriteZero, "direct write wrote nothing")),
            e if -e == libc::EINTR || -e == libc::EAGAIN => continue,
            e => return Err(io::Error::from_raw_os_error(-e)),
        }
    }
    Err(io::Error::other(format!("direct write of {} bytes did not complete in {MAX_ROUNDS} rounds", data.len())))
}

/// Submit what is queued and wait for the one completion.
fn submit_and_reap(ring: &mut IoUring) -> io::Result<i32> {
    for _ in 0..MAX_ROUNDS {
        match ring.submit_and_wait(1) {
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        if let Some(cqe) = ring.completion().next() {
            return Ok(cqe.result());
        }
    }
    Err(io::Error::other("no completion for a direct write"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;

    #[test]
    fn an_aligned_write_lands_and_reads_back() {
        let path = std::env::temp_dir().join(format!("tarn-direct-ring-{}", std::process::id()));
        let f = std::fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path).unwrap();
        f.set_len(1 << 20).unwrap();
        let direct = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(&path);
        // tmpfs refuses O_DIRECT: the ring is then tried on the plain file.
        let target = direct.as_ref().unwrap_or(&f);
        submit_direct_writes_async();
        let mut buf = vec![0u8; (256 << 10) + 4096];
        let at = buf.as_ptr().align_offset(4096);
        let data = &mut buf[at..at + (256 << 10)];
        data.iter_mut().enumerate().for_each(|(i, b)| *b = (i % 251) as u8);
        write_all_at(target, data, 64 << 10).unwrap();
        let mut back = vec![0u8; 256 << 10];
        f.read_exact_at(&mut back, 64 << 10).unwrap();
        assert!(back == *data, "the data read back differs");
        std::fs::remove_file(&path).unwrap();
    }
}
