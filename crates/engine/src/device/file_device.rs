//! A device backed by a regular file or a block device.

use crate::device::Device;
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
}

const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKDISCARD: libc::c_ulong = 0x1277;

impl FileDevice {
    /// Open an existing file or block device.
    pub fn open(path: &Path, writable: bool) -> io::Result<FileDevice> {
        let file = OpenOptions::new().read(true).write(writable).custom_flags(libc::O_CLOEXEC).open(path)?;
        let meta = file.metadata()?;
        let is_block = meta.file_type().is_block_device();
        let size = if is_block { block_device_size(&file)? } else { meta.len() };
        Ok(FileDevice { file, path: path.to_path_buf(), size: AtomicU64::new(size), is_block })
    }

    /// Create a sparse regular file of `size` bytes (it must not exist).
    pub fn create_file(path: &Path, size: u64) -> io::Result<FileDevice> {
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(path)?;
        file.set_len(size)?;
        Ok(FileDevice { file, path: path.to_path_buf(), size: AtomicU64::new(size), is_block: false })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
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
        self.file.write_all_at(data, offset)
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
