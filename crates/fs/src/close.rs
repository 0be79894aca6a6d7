//! Open-close versioning on a mount (Loris; docs/ARCHITECTURE.md
//! *Versioning: per-file snapshots and close versions*): a file opened
//! for writing is matched against the volume's policy on the path it was
//! looked up by; its writes mark it modified; the close of its last
//! writer takes one close version (one commit). An unmodified close takes
//! none. The session thread alone calls these.

use crate::error::Result;
use crate::policy::Rule;
use crate::snap::FsSnapshot;
use crate::versions::Versioned;
use std::collections::{HashMap, HashSet};

/// Names remembered for the policy's paths (cleared whole past this: a
/// file opened after that without a new lookup gets no close versions).
const NAMES: usize = 1 << 16;

/// What the session knows of open files, for close versions.
#[derive(Default)]
pub(crate) struct Sessions {
    /// The parent and name each regular file was last looked up or made by.
    names: HashMap<u64, (u64, Vec<u8>)>,
    /// Open handles for writing per inode (the kernel bounds them).
    writers: HashMap<u64, u32>,
    /// Files the policy versions, decided at their first open for writing.
    versioned: HashSet<u64>,
    /// Files written (or truncated) since their last close version.
    modified: HashSet<u64>,
    /// The policy, read once per mount (the pool is locked while mounted,
    /// so `tarn fs version-policy` cannot change it meanwhile).
    rules: Option<Vec<Rule>>,
}

impl Versioned {
    fn sessions(&self) -> std::sync::MutexGuard<'_, Sessions> {
        self.close.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Regular file `ino` was found or made as `name` in `parent`.
    pub fn noted(&self, parent: u64, name: &[u8], ino: u64) {
        let mut s = self.sessions();
        if s.names.len() >= NAMES {
            s.names.clear();
        }
        s.names.insert(ino, (parent, name.to_vec()));
    }

    /// Whether the volume has close-version rules (true when they cannot
    /// be read: then every close is handled as with rules).
    pub fn any_policy(&self) -> bool {
        self.rules().map_or(true, |r| !r.is_empty())
    }

    fn rules(&self) -> Result<Vec<Rule>> {
        let cached = self.sessions().rules.clone();
        match cached {
            Some(r) => Ok(r),
            None => {
                let r = self.live.policy()?;
                self.sessions().rules = Some(r.clone());
                Ok(r)
            }
        }
    }

    /// A handle on `ino` was opened for writing: the first one decides
    /// whether its closes take versions.
    pub fn open_write(&self, ino: u64) -> Result<()> {
        let first = {
            let mut s = self.sessions();
            let n = s.writers.entry(ino).or_insert(0);
            *n += 1;
            *n == 1
        };
        if !first {
            return Ok(());
        }
        let rules = self.rules()?;
        if rules.is_empty() {
            return Ok(());
        }
        let noted = self.sessions().names.get(&ino).cloned();
        let Some((parent, name)) = noted else {
            return Ok(());
        };
        let Some(dir) = self.live.dir_path(parent)? else {
            return Ok(());
        };
        let name = String::from_utf8_lossy(&name);
        let path = if dir.is_empty() { name.into_owned() } else { format!("{dir}/{name}") };
        if self.live.versioned_path(&rules, &path) {
            self.sessions().versioned.insert(ino);
        }
        Ok(())
    }

    /// `ino` was written or truncated.
    pub fn wrote(&self, ino: u64) {
        let mut s = self.sessions();
        if s.versioned.contains(&ino) {
            s.modified.insert(ino);
        }
    }

    /// The close (FUSE flush) of a handle for writing: when it is the last
    /// writer's and the file was modified, its changes are committed and
    /// a close version taken. Another close (a dup) finds it unmodified.
    pub fn closed_write(&self, ino: u64) -> Result<Option<FsSnapshot>> {
        let take = {
            let mut s = self.sessions();
            s.writers.get(&ino) == Some(&1) && s.modified.remove(&ino)
        };
        if take {
            self.take_close_version(ino)
        } else {
            Ok(None)
        }
    }

    /// A handle for writing was released (after its last close): the last
    /// one takes the version a close left to it (another writer's release
    /// arrived after the last close).
    pub fn release_write(&self, ino: u64) -> Result<Option<FsSnapshot>> {
        let take = {
            let mut s = self.sessions();
            let Some(n) = s.writers.get_mut(&ino) else {
                return Ok(None);
            };
            *n = n.saturating_sub(1);
            if *n > 0 {
                return Ok(None);
            }
            s.writers.remove(&ino);
            s.versioned.remove(&ino);
            s.modified.remove(&ino)
        };
        if take {
            self.take_close_version(ino)
        } else {
            Ok(None)
        }
    }

    fn take_close_version(&self, ino: u64) -> Result<Option<FsSnapshot>> {
        // A file whose last name went has no version directory left.
        if self.live.getattr(ino)?.inode.nlink == 0 {
            return Ok(None);
        }
        // Committing at close: the data first, then the version (a crash
        // between keeps the data without the version). Otherwise both are
        // queued in order and the next commit takes them: a commit that
        // holds the version holds the data before it.
        if self.commit_at_close {
            self.live.sync()?;
        }
        let v = self.live.close_version(ino, self.commit_at_close)?;
        self.forget_views();
        Ok(Some(v))
    }
}
