//! A guest's ext2/3/4 read from below, from a snapshot taken for the
//! purpose so that a live file system is never read half-written: what
//! `vol reclaim` and `vol hint` start from.

use tarn_engine::{EngineError, Pool, View};
use tarn_extfs::{BlockSource, ExtError, Groups, Superblock};

/// A volume view as the ext parsers read it.
pub struct ViewSource<'a> {
    pub pool: &'a Pool,
    pub vol: u32,
    pub view: View,
    pub size: u64,
}

impl BlockSource for ViewSource<'_> {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), ExtError> {
        self.pool
            .read_view(self.vol, self.view, offset, buf)
            .map_err(|e| ExtError::Read { offset, message: e.to_string() })
    }
}

/// The snapshot a guest file system is read from (epoch, size).
pub struct Snapshot {
    pub vol: u32,
    pub epoch: u64,
    pub size: u64,
}

/// Run `f` on a fresh snapshot `snap` of volume `name` (a leftover one
/// from a crash is replaced), deleting the snapshot afterwards whatever
/// `f` answered.
pub fn with_snapshot<T>(
    pool: &Pool,
    name: &str,
    snap: &str,
    f: impl FnOnce(&Snapshot) -> Result<T, String>,
) -> Result<T, String> {
    let vol = pool.volume_id(name).ok_or_else(|| EngineError::NoSuchVolume(name.to_string()).to_string())?;
    if pool.snapshot_info(name, snap).is_ok() {
        pool.delete_snapshot(name, snap).map_err(|e| e.to_string())?;
    }
    let info = pool.create_snapshot(name, snap).map_err(|e| e.to_string())?;
    let result = f(&Snapshot { vol, epoch: info.epoch, size: info.size });
    let dropped = pool.delete_snapshot(name, snap).map_err(|e| e.to_string());
    let value = result?;
    dropped?;
    Ok(value)
}

/// The superblock and group descriptors of the ext file system the
/// snapshot shows, refusing what cannot be read safely; with `clean`,
/// also a file system that is mounted or needs recovery.
pub fn open_ext(src: &mut ViewSource, clean: bool) -> Result<(Superblock, Groups), String> {
    let sb = Superblock::read(src).map_err(|e| e.to_string())?;
    sb.check_readable().map_err(|e| e.to_string())?;
    if clean {
        sb.check_clean().map_err(|e| e.to_string())?;
    }
    let groups = Groups::read(src, &sb).map_err(|e| e.to_string())?;
    Ok((sb, groups))
}

/// What mke2fs -t would have been given.
pub fn fs_kind(sb: &Superblock) -> &'static str {
    use tarn_extfs::superblock::{compat, incompat};
    if sb.incompat & (incompat::EXTENTS | incompat::FLEX_BG | incompat::BIT64) != 0 {
        "ext4"
    } else if sb.compat & compat::HAS_JOURNAL != 0 {
        "ext3"
    } else {
        "ext2"
    }
}
