//! Open-close versioning on a mount (Loris; docs/ARCHITECTURE.md
//! *Versioning: per-file snapshots and close versions*): a file opened
//! for writing is matched against the volume's policy on the path it was
//! looked up by; its writes mark it modified; the release of its last
//! writer (with a commit at every close: its last close) takes one
//! close version. An unmodified close takes
//! none. The session thread alone calls these.

use crate::error::Result;
use crate::history::owed::Change;
use crate::history::policy::Rule;
use crate::history::snap::FsSnapshot;
use crate::history::versions::{version_base, Node, Versioned};
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
    /// The layout policy, read once per mount likewise (`layout.rs`).
    pub(crate) layout: Option<std::sync::Arc<Vec<crate::data::layoutrules::LayoutRule>>>,
}

impl Versioned {
    pub(crate) fn sessions(&self) -> std::sync::MutexGuard<'_, Sessions> {
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

    /// Whether the mount must see opens: the volume has close-version
    /// rules, or layout rules (a layout rule applies at a file's first open
    /// for writing, which for a file made before the rule is an OPEN, not a
    /// CREATE). True when they cannot be read: then every open and close is
    /// handled as with rules.
    pub fn any_policy(&self) -> bool {
        let versions = self.rules().map_or(true, |r| !r.is_empty());
        versions || self.layout_rules().map_or(true, |r| !r.is_empty())
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
    /// whether its closes take versions, and gives a file without data a
    /// layout rule's layout (`layout.rs`).
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
        let laid_out = self.layout_at_open(ino);
        self.version_at_open(ino)?;
        laid_out
    }

    /// The parent and name regular file `ino` was last found by.
    pub(crate) fn noted_name(&self, ino: u64) -> Option<(u64, Vec<u8>)> {
        self.sessions().names.get(&ino).cloned()
    }

    fn version_at_open(&self, ino: u64) -> Result<()> {
        let rules = self.rules()?;
        if rules.is_empty() {
            return Ok(());
        }
        let Some((parent, name)) = self.noted_name(ino) else {
            return Ok(());
        };
        if let Some(path) = self.policy_path(rules.iter().any(|r| r.subtree), parent, &name)? {
            if self.live.versioned_path(&rules, &path) {
                self.sessions().versioned.insert(ino);
            }
        }
        Ok(())
    }

    /// The path a policy matches `name` in `parent` on: the base name
    /// alone when no rule is a subtree (a glob looks at the base name
    /// only), which spares the walk up the parents (`dir_path` searches
    /// each parent's entries: 2.6% of a versioned copy's mount time);
    /// None when the walk gives up.
    pub(crate) fn policy_path(&self, any_subtree: bool, parent: u64, name: &[u8]) -> Result<Option<String>> {
        let name = String::from_utf8_lossy(name).into_owned();
        if !any_subtree {
            return Ok(Some(name));
        }
        Ok(self.live.dir_path(parent)?.map(|dir| if dir.is_empty() { name } else { format!("{dir}/{name}") }))
    }

    /// `ino` was written or truncated.
    pub fn wrote(&self, ino: u64) {
        let mut s = self.sessions();
        if s.versioned.contains(&ino) {
            s.modified.insert(ino);
        }
    }

    /// The close (FUSE flush, sent only when the mount commits at every
    /// close) of a handle for writing: when it is the last writer's and
    /// the file was modified, its changes are committed and a close
    /// version taken. Another close (a dup) finds it unmodified.
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
    /// one takes the close version (under a commit interval the mount
    /// answers no FLUSH, so every close version is taken here, unless a
    /// look at the versions took it first: `settle`; with a commit at
    /// every close, when another writer's release came after the last
    /// close).
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
        if !take {
            return Ok(None);
        }
        if self.commit_at_close {
            return self.take_close_version(ino);
        }
        // Owed: taken with others before the next commit, or before
        // anything changes the file (`owed.rs`).
        self.live.owe_close_version(ino)?;
        Ok(None)
    }

    /// Whether any close version is owed (`take_owed` has work).
    pub fn owes_versions(&self) -> bool {
        self.live.owes_versions()
    }

    /// Before a request that may change `inos`: their owed close versions
    /// are taken (waiting for their data), so each holds the file as it
    /// was closed; with `all`, every owed one (a volume snapshot, or
    /// anything that may number versions, comes after them).
    pub fn take_owed(&self, inos: &[u64], all: bool) -> Result<()> {
        let taken = self.live.take_owed(if all { None } else { Some(inos) })?;
        self.taken(taken);
        Ok(())
    }

    /// Before `change` to file `ino`: its owed close versions are taken
    /// unless the change spares every byte they hold (`owed.rs`).
    pub fn take_owed_before(&self, ino: u64, change: Change<'_>) -> Result<()> {
        let taken = self.live.take_owed_before(ino, change)?;
        self.taken(taken);
        Ok(())
    }

    /// Versions were taken: the cached version lists are stale.
    fn taken(&self, count: usize) {
        if count > 0 {
            self.forget_views();
        }
    }

    /// Before a view of `ino`'s versions (`foo@`, `foo@N`, an entry of
    /// `foo@`): the close version the file owes is taken now, or, when its
    /// last writer's RELEASE has not come yet, the one it would owe. Under
    /// a commit interval the version is owed at RELEASE, which the kernel
    /// sends in the background after close(2) returned, and it does not
    /// order that RELEASE before the closer's next request (it waits
    /// behind `max_background` background requests, or is sent by a
    /// write-back's reply after the close), so `ls foo@` right after a
    /// close could be served first. The data is all here already (the
    /// close wrote it back and waited), so the version taken now is the
    /// one the release would owe; the release then finds the file
    /// unmodified. A writer still open gets a version of what it wrote
    /// so far.
    pub fn settle(&self, ino: u64) -> Result<Option<FsSnapshot>> {
        if self.sessions().modified.remove(&ino) {
            return self.take_close_version(ino);
        }
        self.take_owed(&[ino], false)?;
        Ok(None)
    }

    /// `settle` for the file whose versions a request on `x` views: a
    /// readdir of a list `foo@` (`name` None), or a lookup of `name` in
    /// `x` (an entry of `foo@`, or `foo@`/`foo@N` in a live directory).
    pub fn settle_view(&self, x: u64, name: Option<&[u8]>) -> Result<()> {
        if self.sessions().modified.is_empty() && !self.live.owes_versions() {
            return Ok(());
        }
        let ino = match (Node::decode(x), name.map(version_base)) {
            (Node::List(i), _) => i,
            (Node::Live(p), Some(Some((base, _)))) => match self.live.lookup(p, base) {
                Ok(a) => a.inode.ino,
                Err(_) => return Ok(()),
            },
            _ => return Ok(()),
        };
        self.settle(ino).map(drop)
    }

    /// Every close version still owed (the session ends: the kernel drops
    /// the RELEASEs it has not sent at unmount). Each file is tried; the
    /// first error is returned.
    pub fn settle_all(&self) -> Result<()> {
        let modified: Vec<u64> = self.sessions().modified.drain().collect();
        let mut first = self.take_owed(&[], true);
        for ino in modified {
            if let Err(e) = self.take_close_version(ino) {
                first = first.and(Err(e));
            }
        }
        first
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
