//! Open-close versioning on a mount (Loris; docs/ARCHITECTURE.md
//! *Versioning: per-file snapshots and close versions*): a file's writes
//! and truncates mark it modified; the next close (FUSE flush) of any of
//! its handles matches it against the volume's policy on the path it was
//! looked up by and takes one close version. An unmodified close takes
//! none. The mount answers OPEN with ENOSYS (no OPEN and RELEASE round
//! trips: the kernel still sends a flush at every close), so it does not
//! count writers: a close after a change takes the version, whoever
//! closes. The session thread alone calls these.

use crate::error::Result;
use crate::policy::Rule;
use crate::snap::FsSnapshot;
use crate::versions::Versioned;
use std::collections::{HashMap, HashSet};

/// Names remembered for the policy's paths (cleared whole past this: a
/// file closed after that without a new lookup gets no close version).
const NAMES: usize = 1 << 16;

/// What the session knows of files, for close versions.
#[derive(Default)]
pub(crate) struct Sessions {
    /// The parent and name each regular file was last looked up or made by.
    names: HashMap<u64, (u64, Vec<u8>)>,
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

    /// Whether the policy versions `ino`, by the path it was last looked
    /// up or made by (none known: not versioned).
    fn policy_versions(&self, ino: u64) -> Result<bool> {
        let rules = self.rules()?;
        if rules.is_empty() {
            return Ok(false);
        }
        let noted = self.sessions().names.get(&ino).cloned();
        let Some((parent, name)) = noted else {
            return Ok(false);
        };
        let Some(dir) = self.live.dir_path(parent)? else {
            return Ok(false);
        };
        let name = String::from_utf8_lossy(&name);
        let path = if dir.is_empty() { name.into_owned() } else { format!("{dir}/{name}") };
        Ok(self.live.versioned_path(&rules, &path))
    }

    /// `ino` was written or truncated (without rules, nothing to note).
    pub fn wrote(&self, ino: u64) {
        let mut s = self.sessions();
        if s.rules.as_ref().is_none_or(|r| !r.is_empty()) {
            s.modified.insert(ino);
        }
    }

    /// A close (FUSE flush) of a handle of `ino`: when the file was
    /// modified since its last close version and the policy versions it,
    /// a close version is taken (the kernel has written the file's
    /// cached data back before the flush). A second close finds it
    /// unmodified.
    pub fn closed(&self, ino: u64) -> Result<Option<FsSnapshot>> {
        if !self.sessions().modified.remove(&ino) {
            return Ok(None);
        }
        if !self.policy_versions(ino)? {
            return Ok(None);
        }
        self.take_close_version(ino)
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
