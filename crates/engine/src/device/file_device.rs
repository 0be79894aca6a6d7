//! A device backed by a regular file or a block device.

use crate::device::{direct_ring, Device};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

pub struct FileDevice {
    file: File,
    path: PathBuf,
    /// Grows (`Device::grow`, regular files only); never shrinks.
    size: AtomicU64,
    is_block: bool,
    /// A second descriptor of the same file opened with O_DIRECT, for large
    /// aligned data writes (see `write_at`); None unless asked for.
    direct: Option<File>,
    direct_bytes: AtomicU64,
}

/// The smallest write sent through the O_DIRECT descriptor: below it a
/// direct write waits on the device per call (4 KiB runs at ~75 MB/s here).
const DIRECT_MIN: usize = 64 << 10;
/// O_DIRECT needs offset, length and buffer address on this boundary.
const DIRECT_ALIGN: usize = 4096;

const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKDISCARD: libc::c_ulong = 0x1277;

impl FileDevice {
    /// Open an existing file or block device.
    pub fn open(path: &Path, writable: bool) -> io::Result<FileDevice> {
        let file = OpenOptions::new().read(true).write(writable).custom_flags(libc::O_CLOEXEC).open(path)?;
        let meta = file.metadata()?;
        let is_block = meta.file_type().is_block_device();
        let size = if is_block { block_device_size(&file)? } else { meta.len() };
        Ok(FileDevice::buffered(file, path, size, is_block))
    }

    /// A device writing through `file` only (no O_DIRECT descriptor yet).
    fn buffered(file: File, path: &Path, size: u64, is_block: bool) -> FileDevice {
        let (path, size) = (path.to_path_buf(), AtomicU64::new(size));
        FileDevice { file, path, size, is_block, direct: None, direct_bytes: AtomicU64::new(0) }
    }

    /// As [`FileDevice::open`] (writable), large aligned writes going
    /// through a second, O_DIRECT descriptor: they skip filling new
    /// page-cache pages, dear on a VM (`tarn mount`; docs/ARCHITECTURE.md
    /// *The pmd slice*). Block devices served over NBD keep `open`.
    pub fn open_direct_writes(path: &Path) -> io::Result<FileDevice> {
        let mut dev = FileDevice::open(path, true)?;
        dev.direct = open_direct(path)?;
        Ok(dev)
    }

    /// Bytes written through the O_DIRECT descriptor so far.
    pub fn direct_bytes(&self) -> u64 {
        self.direct_bytes.load(Ordering::Relaxed)
    }

    /// Create a sparse regular file of `size` bytes (it must not exist).
    pub fn create_file(path: &Path, size: u64) -> io::Result<FileDevice> {
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(path)?;
        file.set_len(size)?;
        Ok(FileDevice::buffered(file, path, size, false))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The O_DIRECT descriptor of a regular file, or None where the file
/// system refuses O_DIRECT (the buffered descriptor then does all).
fn open_direct(path: &Path) -> io::Result<Option<File>> {
    match OpenOptions::new().write(true).custom_flags(libc::O_CLOEXEC | libc::O_DIRECT).open(path) {
        Ok(file) => Ok(Some(file)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
        Err(e) => Err(e),
    }
}

/// True when a write goes through O_DIRECT: large, offset and length on
/// the boundary (a buffer off it is copied to an aligned one first).
fn direct_eligible(data: &[u8], offset: u64) -> bool {
    data.len() >= DIRECT_MIN && data.len().is_multiple_of(DIRECT_ALIGN) && offset.is_multiple_of(DIRECT_ALIGN as u64)
}

/// Largest piece copied into the per-thread bounce buffer at once (bounds
/// the memory each writing thread keeps).
const BOUNCE_MAX: usize = 1 << 20;

thread_local! {
    /// A reused buffer, so the copy lands in memory already touched (fresh
    /// pages are what makes buffered writes dear on this VM).
    static BOUNCE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Write `data` (length and offset aligned) through `direct`, piece by
/// piece through the thread's aligned bounce buffer.
fn write_bounced(direct: &File, data: &[u8], offset: u64) -> io::Result<()> {
    BOUNCE.with_borrow_mut(|buf| {
        if buf.is_empty() {
            buf.resize(BOUNCE_MAX + DIRECT_ALIGN, 0);
        }
        let start = buf.as_ptr().align_offset(DIRECT_ALIGN);
        let aligned = &mut buf[start..start + BOUNCE_MAX];
        let mut at = offset;
        for piece in data.chunks(BOUNCE_MAX) {
            aligned[..piece.len()].copy_from_slice(piece);
            direct_ring::write_all_at(direct, &aligned[..piece.len()], at)?;
            at += piece.len() as u64;
        }
        Ok(())
    })
}

fn block_device_size(file: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer we pass.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut size as *mut u64) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

impl Device for FileDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        // Coherence: Linux writes back and invalidates the page-cache pages
        // of the range before an O_DIRECT write, so buffered reads after it
        // see the new data. Durability is unchanged: a direct write may sit
        // in the device's cache like a buffered one, and the commit's
        // fdatasync (`flush`) still makes both durable.
        let Some(direct) = self.direct.as_ref().filter(|_| direct_eligible(data, offset)) else {
            return self.file.write_all_at(data, offset);
        };
        if (data.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN) {
            direct_ring::write_all_at(direct, data, offset)?;
        } else {
            write_bounced(direct, data, offset)?;
        }
        self.direct_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn prefetch(&self, offset: u64, len: u64) {
        // Asynchronous readahead of the range; a failure only loses the hint.
        let (fd, advice) = (self.file.as_raw_fd(), libc::POSIX_FADV_WILLNEED);
        // SAFETY: fadvise reads no memory of ours; a bad fd or range is an error code.
        unsafe { libc::posix_fadvise(fd, offset as libc::off_t, len as libc::off_t, advice) };
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let fd = self.file.as_raw_fd();
        if self.is_block {
            let range = [offset, len];
            // SAFETY: BLKDISCARD reads two u64 (start, length) from the pointer.
            let rc = unsafe { libc::ioctl(fd, BLKDISCARD as _, range.as_ptr()) };
            return if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) };
        }
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: plain syscall on an fd we own.
        let rc = unsafe { libc::fallocate(fd, mode, offset as libc::off_t, len as libc::off_t) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    fn grow(&self, size: u64) -> io::Result<()> {
        if self.is_block {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "a block device does not grow by truncation"));
        }
        if size > self.size() {
            self.file.set_len(size)?;
            self.size.store(size, Ordering::Release);
        }
        Ok(())
    }

    fn name(&self) -> String {
        self.path.display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str, size: u64) -> PathBuf {
        let path = std::env::temp_dir().join(format!("tarn-fd-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        FileDevice::create_file(&path, size).expect("create scratch file");
        path
    }

    #[test]
    fn direct_writes_reach_the_file_and_reads_see_them() {
        let path = scratch("direct", 4 << 20);
        let dev = FileDevice::open_direct_writes(&path).expect("open");
        // One byte in: a buffer off the 4 KiB boundary (the bounce path).
        let big: Vec<u8> = (0..(256 << 10) + 1).map(|i| (i % 251) as u8).collect();
        dev.write_at(&big[1..], 1 << 20).expect("large write");
        dev.write_at(&[9; 4096], 0).expect("small write");
        let mut back = vec![0; 256 << 10];
        dev.read_at(&mut back, 1 << 20).expect("read");
        assert_eq!(back, big[1..], "the engine reads what it wrote");
        let on_file = std::fs::read(&path).expect("read file");
        assert_eq!(&on_file[1 << 20..(1 << 20) + (256 << 10)], &big[1..], "the data is on the file");
        assert_eq!(&on_file[..4096], &[9; 4096], "small writes stay buffered and land too");
        assert_eq!(dev.direct_bytes(), 256 << 10, "only the large write went direct");
        std::fs::remove_file(&path).expect("remove scratch file");
    }
}
