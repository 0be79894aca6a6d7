//! `tarn serve --mount NAME:DIR`: a file volume served through FUSE by
//! the server's own process, beside its NBD exports, from the one open
//! pool. The engine's change gate keeps the server's commits (NBD FLUSH,
//! the timed commit, back-pressure) out of the mount's namespace changes
//! (docs/ARCHITECTURE.md *File volumes under tarn serve*).

use anyhow::{bail, Context, Result};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// `tarn mount`'s defaults (`--readahead 4M`, `--write-behind 32M`).
const READAHEAD: u64 = 4 << 20;
const WRITE_BEHIND: usize = 32 << 20;
/// How long the mount may take to appear, and to end at stop.
const MOUNT_WAIT: Duration = Duration::from_secs(10);
const UNMOUNT_WAIT: Duration = Duration::from_secs(30);

/// A file volume mounted by this process: its FUSE session's thread.
pub struct ServedMount {
    dir: PathBuf,
    session: JoinHandle<Result<()>>,
}

/// Mount file volume `name` of `pool` on `dir`; returns once the kernel
/// shows the mount (or with the session's error).
pub fn start(pool: &Arc<tarn_engine::Pool>, name: &str, dir: &Path) -> Result<ServedMount> {
    let parent_dev = parent_device(dir)?;
    let mut fv = tarn_fs::FileVolume::open(pool.clone(), name).with_context(|| format!("open file volume {name}"))?;
    fv.start_readahead(READAHEAD);
    fv.start_write_behind(WRITE_BEHIND).context("start the write-behind thread")?;
    let transport = tarn_fuse::Transport {
        session_slice: Duration::from_micros(100),
        uring: tarn_fuse::UringMode::Auto,
        report: |m| log::info!("mount: {m}"),
        allow_other: false,
    };
    let (volume, at) = (name.to_string(), dir.to_path_buf());
    let session = std::thread::Builder::new()
        .name("fs-session".into())
        .spawn(move || {
            tarn_fuse::mount(fv, &volume, &at, tarn_fuse::Durability::default(), transport)
                .with_context(|| format!("mount on {}", at.display()))
        })
        .context("start the mount's session thread")?;
    let started = Instant::now();
    while device_of(dir)? == parent_dev {
        if session.is_finished() {
            let why = session.join().unwrap_or_else(|_| panicked()).err();
            return Err(
                why.unwrap_or_else(|| anyhow::anyhow!("the mount on {} ended before it appeared", dir.display()))
            );
        }
        if started.elapsed() > MOUNT_WAIT {
            bail!("file volume {name} did not appear on {} within {MOUNT_WAIT:?}", dir.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    log::info!("file volume {name} mounted on {}", dir.display());
    Ok(ServedMount { dir: dir.to_path_buf(), session })
}

/// A session thread's panic, as its result.
fn panicked() -> Result<()> {
    Err(anyhow::anyhow!("the mount's session thread panicked"))
}

/// The device of `dir`'s parent: a mount on `dir` shows as another device.
fn parent_device(dir: &Path) -> Result<u64> {
    let meta = std::fs::metadata(dir).with_context(|| format!("mount point {}", dir.display()))?;
    if !meta.is_dir() {
        bail!("mount point {} is not a directory", dir.display());
    }
    let parent = device_of(&dir.join(".."))?;
    if meta.dev() != parent {
        bail!("{} is already a mount point", dir.display());
    }
    Ok(parent)
}

fn device_of(dir: &Path) -> Result<u64> {
    Ok(std::fs::metadata(dir).with_context(|| format!("stat {}", dir.display()))?.dev())
}

impl ServedMount {
    /// Unmount (`fusermount3 -u`; lazily if busy) and wait for the
    /// session to commit what it holds and end, so the pool closes after
    /// it. A mount already gone (unmounted by a user) just ends.
    pub fn stop(self) -> Result<()> {
        if !self.session.is_finished() {
            let plain = unmount(&self.dir, false);
            if !plain {
                log::warn!("{} is busy: unmounting it lazily (open files keep it until closed)", self.dir.display());
                unmount(&self.dir, true);
            }
        }
        let started = Instant::now();
        while !self.session.is_finished() {
            if started.elapsed() > UNMOUNT_WAIT {
                bail!("the mount on {} did not end within {UNMOUNT_WAIT:?}", self.dir.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.session.join().unwrap_or_else(|_| panicked())
    }
}

fn unmount(dir: &Path, lazy: bool) -> bool {
    let mut cmd = std::process::Command::new("fusermount3");
    cmd.arg(if lazy { "-uz" } else { "-u" }).arg(dir);
    match cmd.status() {
        Ok(s) => s.success(),
        Err(e) => {
            log::error!("fusermount3: {e}");
            false
        }
    }
}
