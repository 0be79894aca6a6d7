//! A device backed by a regular file or a block device.

use crate::device::Device;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

pub struct FileDevice {
    file: File,
    /// The same file opened O_DIRECT, for `write_uncached` (None: the file
    /// system refused O_DIRECT, e.g. tmpfs; writes then go through the cache).
    direct: Option<File>,
    path: PathBuf,
    size: u64,
    is_block: bool,
}

/// Alignment of O_DIRECT buffers, offsets and lengths (a 4 KiB-sector
/// device's, which also serves 512-byte ones).
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
        let direct = if writable { open_direct(path) } else { None };
        Ok(FileDevice { file, direct, path: path.to_path_buf(), size, is_block })
    }

    /// Create a sparse regular file of `size` bytes (it must not exist).
    pub fn create_file(path: &Path, size: u64) -> io::Result<FileDevice> {
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(path)?;
        file.set_len(size)?;
        Ok(FileDevice { file, direct: open_direct(path), path: path.to_path_buf(), size, is_block: false })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn open_direct(path: &Path) -> Option<File> {
    let opened = OpenOptions::new().write(true).custom_flags(libc::O_CLOEXEC | libc::O_DIRECT).open(path);
    match opened {
        Ok(f) => Some(f),
        Err(e) => {
            log::info!("{}: no O_DIRECT ({e}): metadata nodes go through the page cache", path.display());
            None
        }
    }
}

/// Write `data` at `offset` with O_DIRECT from an aligned copy; Ok(false)
/// if the request is not aligned (the caller writes it buffered).
fn write_direct(file: &File, data: &[u8], offset: u64) -> io::Result<bool> {
    if !data.len().is_multiple_of(DIRECT_ALIGN) || !offset.is_multiple_of(DIRECT_ALIGN as u64) {
        return Ok(false);
    }
    let mut room = vec![0u8; data.len() + DIRECT_ALIGN];
    let skip = room.as_ptr().align_offset(DIRECT_ALIGN);
    let aligned = &mut room[skip..skip + data.len()];
    aligned.copy_from_slice(data);
    file.write_all_at(aligned, offset)?;
    Ok(true)
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

    /// O_DIRECT when the file system takes it: the pages never become
    /// dirty in the page cache, so `flush` (a FLUSH's fdatasync) does not
    /// write them back; the device's own cache is still flushed by it.
    fn write_uncached(&self, data: &[u8], offset: u64) -> io::Result<()> {
        match &self.direct {
            Some(direct) if write_direct(direct, data, offset)? => Ok(()),
            _ => self.write_at(data, offset),
        }
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
        self.size
    }

    fn name(&self) -> String {
        self.path.display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node run written past the page cache reads back through it
    /// (the kernel keeps the two coherent), over stale cached pages too;
    /// an unaligned request still lands (buffered).
    #[test]
    fn uncached_writes_read_back_through_the_cache() {
        let dir = std::env::temp_dir().join(format!("tarn-filedev-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("dev.img");
        let _ = std::fs::remove_file(&path);
        let dev = FileDevice::create_file(&path, 1 << 20).unwrap();
        let mut back = vec![0u8; 3 * DIRECT_ALIGN];
        dev.write_at(&vec![1u8; back.len()], 8192).unwrap();
        dev.read_at(&mut back, 8192).unwrap();
        dev.write_uncached(&vec![2u8; back.len()], 8192).unwrap();
        dev.read_at(&mut back, 8192).unwrap();
        assert!(back.iter().all(|&b| b == 2), "a stale cached page was read");
        dev.write_uncached(&[3u8; 100], 8193).unwrap();
        dev.read_at(&mut back[..102], 8192).unwrap();
        assert_eq!((back[0], back[1], back[100], back[101]), (2, 3, 3, 2));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
