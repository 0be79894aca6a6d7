//! `tarn vol export` and `tarn vol import`: a volume can always leave tarn
//! as a plain raw image, and come in from one (no lock-in, seed 002).
//!
//! Export reads a snapshot (the one named, or one taken for the purpose
//! and dropped afterwards), so a volume in use is copied as one point in
//! time. Holes stay holes in a file target (sparse) and are written as
//! zeros on a block device. Import writes only blocks that hold something
//! other than zeros, so the volume is as thin as the image; images qemu
//! reads in other formats (qcow2, vmdk...) go through `qemu-img convert`
//! to a sparse raw file first.

use crate::guestfs::with_snapshot;
use serde_json::{json, Value};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use tarn_engine::{Pool, View};

/// The snapshot `vol export` of a head reads.
const SNAPSHOT: &str = "tarn-export";
/// Bytes copied per read or write.
const CHUNK: u64 = 1 << 20;
const BLOCK: usize = 4096;

/// Export `view` (`VOL` or `VOL@SNAP`) to `dest` (a path as the pool's
/// process sees it). An existing regular file is replaced only with
/// `force`; a block device must hold the whole volume.
pub fn export(
    pool: &Pool,
    view: &str,
    dest: &str,
    force: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Value, String> {
    match view.split_once('@') {
        Some(_) => {
            let (vol, view_of) = pool.lookup_view(view).ok_or_else(|| format!("no volume or snapshot {view}"))?;
            copy_out(pool, vol, view_of, dest, force, progress).map(|r| r.json(view, dest))
        }
        None => with_snapshot(pool, view, SNAPSHOT, |snap| {
            copy_out(pool, snap.vol, View::Snapshot(snap.epoch), dest, force, progress).map(|r| r.json(view, dest))
        }),
    }
}

struct Copied {
    size: u64,
    data: u64,
}

impl Copied {
    fn json(&self, view: &str, dest: &str) -> Value {
        json!({"volume": view, "path": dest, "size": self.size, "data_bytes": self.data})
    }
}

fn copy_out(
    pool: &Pool,
    vol: u32,
    view: View,
    dest: &str,
    force: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Copied, String> {
    let size = pool.view_size(vol, view).ok_or("the volume went away")?;
    let (out, device) = open_target(dest, size, force)?;
    let mut buf = vec![0u8; CHUNK as usize];
    let mut data = 0;
    let mut at = 0;
    while at < size {
        let runs = pool.block_status_view(vol, view, at, (size - at).min(64 * CHUNK)).map_err(|e| e.to_string())?;
        for run in runs {
            if run.allocated || device {
                copy_run(pool, (vol, view), (at, run.length), &out, &mut buf, run.allocated)?;
            }
            data += if run.allocated { run.length } else { 0 };
            at += run.length;
            progress(at / BLOCK as u64, size.div_ceil(BLOCK as u64));
        }
    }
    out.sync_all().map_err(|e| format!("{dest}: {e}"))?;
    Ok(Copied { size, data })
}

/// Copy `len` bytes at `offset` of the view to the same offset of `out`
/// (zeros where `allocated` is false: a block device's holes).
fn copy_run(
    pool: &Pool,
    (vol, view): (u32, View),
    (offset, len): (u64, u64),
    out: &File,
    buf: &mut [u8],
    allocated: bool,
) -> Result<(), String> {
    let mut done = 0;
    while done < len {
        let n = (len - done).min(CHUNK) as usize;
        if allocated {
            pool.read_view(vol, view, offset + done, &mut buf[..n]).map_err(|e| e.to_string())?;
        } else {
            buf[..n].fill(0);
        }
        out.write_all_at(&buf[..n], offset + done).map_err(|e| format!("writing the image: {e}"))?;
        done += n as u64;
    }
    Ok(())
}

/// The target opened for writing, and whether it is a block device.
fn open_target(dest: &str, size: u64, force: bool) -> Result<(File, bool), String> {
    let meta = std::fs::metadata(dest);
    if let Ok(m) = &meta {
        if m.file_type().is_block_device() {
            let f = OpenOptions::new().write(true).open(dest).map_err(|e| format!("{dest}: {e}"))?;
            let have = device_size(&f).map_err(|e| format!("{dest}: {e}"))?;
            if have < size {
                return Err(format!("{dest} holds {have} bytes, the volume {size}"));
            }
            return Ok((f, true));
        }
        if !m.is_file() {
            return Err(format!("{dest} is neither a regular file nor a block device"));
        }
        if !force {
            return Err(format!("{dest} exists (--force replaces it)"));
        }
    }
    let f =
        OpenOptions::new().write(true).create(true).truncate(true).open(dest).map_err(|e| format!("{dest}: {e}"))?;
    f.set_len(size).map_err(|e| format!("{dest}: {e}"))?;
    Ok((f, false))
}

fn device_size(f: &File) -> std::io::Result<u64> {
    let mut size: u64 = 0;
    // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    // SAFETY: the ioctl writes one u64 into `size`, which outlives the call.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(size)
}

/// Import the raw image `src` as a new volume `name` of its size; the
/// volume is deleted again if the import fails half-way.
pub fn import(
    pool: &Pool,
    src: &str,
    shown: Option<&str>,
    name: &str,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Value, String> {
    let file = File::open(src).map_err(|e| format!("{src}: {e}"))?;
    let size = file.metadata().map_err(|e| format!("{src}: {e}"))?.len();
    if size == 0 {
        return Err(format!("{src} is empty"));
    }
    let info = pool.create_volume(name, size).map_err(|e| e.to_string())?;
    let written = copy_in(pool, info.id, &file, size, progress).and_then(|n| {
        pool.flush().map_err(|e| e.to_string())?;
        Ok(n)
    });
    match written {
        Ok(data) => Ok(json!({"volume": name, "path": shown.unwrap_or(src), "size": info.size, "data_bytes": data})),
        Err(e) => {
            let undo =
                pool.delete_volume(name, true).map_err(|d| format!("; deleting the partial volume failed too: {d}"));
            Err(format!("import into {name} failed: {e}{}", undo.err().unwrap_or_default()))
        }
    }
}

/// Write the non-zero 4 KiB blocks of the image's data regions; returns
/// the bytes written.
fn copy_in(pool: &Pool, vol: u32, file: &File, size: u64, progress: &mut dyn FnMut(u64, u64)) -> Result<u64, String> {
    let mut buf = vec![0u8; CHUNK as usize];
    let mut written = 0;
    for (start, end) in data_regions(file, size)? {
        let mut at = start;
        while at < end {
            let n = (end - at).min(CHUNK) as usize;
            file.read_exact_at(&mut buf[..n], at).map_err(|e| format!("reading the image at {at}: {e}"))?;
            written += write_nonzero(pool, vol, at, &buf[..n])?;
            at += n as u64;
            progress(at / BLOCK as u64, size.div_ceil(BLOCK as u64));
        }
    }
    Ok(written)
}

/// Write the runs of `data` (at byte `offset`) that are not all zeros.
fn write_nonzero(pool: &Pool, vol: u32, offset: u64, data: &[u8]) -> Result<u64, String> {
    let mut written = 0;
    let mut i = 0;
    while i < data.len() {
        let zero = |j: usize| data[j..(j + BLOCK).min(data.len())].iter().all(|&b| b == 0);
        if zero(i) {
            i += BLOCK;
            continue;
        }
        let start = i;
        while i < data.len() && !zero(i) {
            i += BLOCK;
        }
        let end = i.min(data.len());
        let mut run = data[start..end].to_vec();
        // The volume is whole 4 KiB blocks; the image's tail may not be.
        run.resize(run.len().div_ceil(BLOCK) * BLOCK, 0);
        pool.write(vol, offset + start as u64, &run, false).map_err(|e| e.to_string())?;
        written += run.len() as u64;
    }
    Ok(written)
}

/// The image's data regions (byte ranges) by SEEK_DATA/SEEK_HOLE; the
/// whole file where the file system cannot tell.
fn data_regions(file: &File, size: u64) -> Result<Vec<(u64, u64)>, String> {
    let fd = file.as_raw_fd();
    let mut regions = Vec::new();
    let mut at = 0i64;
    let end = i64::try_from(size).map_err(|_| "image too large".to_string())?;
    while at < end {
        // SAFETY: lseek on a descriptor we own; no memory is passed.
        let data = unsafe { libc::lseek(fd, at, libc::SEEK_DATA) };
        if data < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENXIO) => Ok(regions),
                Some(libc::EINVAL) if regions.is_empty() => Ok(vec![(0, size)]),
                _ => Err(format!("finding the image's data: {e}")),
            };
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) }.clamp(data, end);
        regions.push((data as u64, hole as u64));
        at = hole.max(data + 1);
    }
    Ok(regions)
}

/// Image formats qemu-img reads, by their magic bytes at offset 0.
const FOREIGN: [(&[u8], &str); 5] =
    [(b"QFI\xfb", "qcow2"), (b"KDMV", "vmdk"), (b"QED\0", "qed"), (b"vhdxfile", "vhdx"), (b"<<< ", "vdi")];

/// The qemu image format of `src`, None for what is taken as raw.
pub fn foreign_format(src: &Path) -> Result<Option<&'static str>, String> {
    let f = File::open(src).map_err(|e| format!("{}: {e}", src.display()))?;
    let mut head = [0u8; 8];
    let n = f.read_at(&mut head, 0).map_err(|e| format!("{}: {e}", src.display()))?;
    Ok(FOREIGN.iter().find(|(magic, _)| head[..n].starts_with(magic)).map(|&(_, kind)| kind))
}

/// A raw copy of a qemu image, removed when dropped.
pub struct RawCopy(PathBuf);

impl RawCopy {
    pub fn path(&self) -> &str {
        self.0.to_str().unwrap_or_default()
    }
}

impl Drop for RawCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `qemu-img convert -O raw` of `src` to a sparse file under $TMPDIR
/// (default /var/tmp: /tmp may be memory).
pub fn convert_to_raw(src: &Path, kind: &str) -> Result<RawCopy, String> {
    let dir = std::env::var_os("TMPDIR").map_or_else(|| PathBuf::from("/var/tmp"), PathBuf::from);
    let out = RawCopy(dir.join(format!("tarn-import-{}.raw", std::process::id())));
    let status = Command::new("qemu-img")
        .args(["convert", "-f", kind, "-O", "raw"])
        .arg(src)
        .arg(&out.0)
        .status()
        .map_err(|e| format!("a {kind} image needs qemu-img (Debian package qemu-utils): {e}"))?;
    if !status.success() {
        return Err(format!("qemu-img convert of {} failed ({status})", src.display()));
    }
    Ok(out)
}
