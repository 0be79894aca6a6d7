//! Per-file snapshots and close versions (Loris; docs/ARCHITECTURE.md
//! *Versioning: per-file snapshots and close versions*). A version of one
//! file takes the next number from the volume snapshots' counter (the
//! header's epoch), an engine snapshot of the inode table (it keeps the
//! file's record, size, mode and times, as they were) named
//! `~f`/`~c` + owner, object and number, and eagerly the object's tag
//! `gN`, all in one commit. The tag holds what a lazy one would, so
//! reading and the delete pass need no new rule for objects.

use crate::error::{FsError, Result};
use crate::history::policy::{self, Rule, MAX_RULES, POLICY_HEADER};
use crate::history::snap::{version_name, FsSnapshot, VersionKind};
use crate::namespace::inode::{Header, Inode, Kind, DEFAULT_KEEP, MAX_KEEP};
use crate::namespace::ns::{FileVolume, Ns};
use std::time::{SystemTime, UNIX_EPOCH};
use tarn_engine::PlacementKind;

/// Longest label of a named file snapshot (the catalog name is at most
/// 128 bytes with the prefix).
pub const MAX_LABEL: usize = 64;

fn check_label(label: &str) -> Result<()> {
    if label.len() > MAX_LABEL {
        return Err(FsError::Invalid("a file snapshot's name is at most 64 bytes"));
    }
    if label.bytes().any(|b| b == b'/' || b == 0 || b.is_ascii_control()) {
        return Err(FsError::Invalid("a file snapshot's name has no '/', NUL or control characters"));
    }
    Ok(())
}

/// Close versions kept per file by header `h`.
pub(crate) fn keep_of(h: &Header) -> u32 {
    match h.keep {
        0 => DEFAULT_KEEP,
        k => k,
    }
}

impl FileVolume {
    /// A per-file snapshot of regular file `ino`, labelled `label` (may be
    /// empty): durable when it returns.
    pub fn snap_file(&self, ino: u64, label: &str) -> Result<FsSnapshot> {
        check_label(label)?;
        self.version_of(ino, VersionKind::File, label, true)
    }

    /// A close version of `ino` taken now (a batch of one: `owed.rs`),
    /// then the file's close versions past the volume's bound are deleted,
    /// oldest first. `durable`: committed when it returns; else queued
    /// whole (after the file's data) for the next commit.
    pub fn close_version(&self, ino: u64, durable: bool) -> Result<FsSnapshot> {
        self.writable()?;
        let mut ns = self.lock();
        let i = self.inode(&mut ns, ino)?;
        if i.kind != Kind::File {
            return Err(FsError::Invalid("a file version is of a regular file"));
        }
        let v = self.record_batch(&mut ns, std::iter::once(&i))?.pop().ok_or(FsError::NotFound)?;
        if durable {
            self.commit_then_release(ns)?;
        }
        Ok(v)
    }

    /// The inode with epoch `number`, saved in the version's commit when
    /// it says something: the epoch is only ever compared with the latest
    /// volume snapshot's number (tag once per object after it), so an
    /// inode already at or past it, with no unsaved change, is left as it
    /// is (one sub-block write fewer per close version: 2.2% of a
    /// versioned PostMark mount). An unsaved change (a write's size) is
    /// saved with the version, so a commit holding the version holds the
    /// size of the data it versions.
    pub(crate) fn save_epoch(&self, ns: &mut Ns, i: &mut Inode, number: u64) -> Result<()> {
        if i.epoch >= ns.last_volume && !ns.dirty.contains_key(&i.ino) {
            return Ok(());
        }
        i.epoch = number;
        self.save(ns, i)
    }

    /// One commit: header bump to N, table snapshot, tag `gN` of the
    /// file's object, the inode's epoch N (committed at once if `durable`).
    fn version_of(&self, ino: u64, kind: VersionKind, label: &str, durable: bool) -> Result<FsSnapshot> {
        self.writable()?;
        let mut ns = self.lock();
        let mut i = self.inode(&mut ns, ino)?;
        if i.kind != Kind::File {
            return Err(FsError::Invalid("a file version is of a regular file"));
        }
        // Its size and times as the version keeps them.
        self.save(&mut ns, &i)?;
        // Everything below in one commit: no back-pressure commit inside.
        self.pool.make_room_for(4 * 4096)?;
        let number = ns.header.epoch + 1;
        let name = version_name(kind, ino, i.object, number, label);
        let (number, engine_epoch) = self.bump_and_snapshot(&mut ns, &name)?;
        if i.object != 0 {
            if let Err(e) = self.tag_object(i.object, number) {
                // No table snapshot without its tag: undo it (queued).
                let _ = self.pool.delete_member_snapshots(&[(self.id, engine_epoch)]);
                return Err(e);
            }
        }
        i.epoch = number;
        self.save(&mut ns, &i)?;
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let s = FsSnapshot { name, kind, owner: ino, object: i.object, number, created, engine_epoch, slot: None };
        crate::history::vindex::VersionIndex::taken(&mut ns.index, &s);
        if durable {
            self.commit_then_release(ns)?;
        }
        Ok(s)
    }

    /// Close versions kept per file.
    pub fn keep(&self) -> u32 {
        keep_of(&self.lock().header)
    }

    /// Set the close versions kept per file (1..=MAX_KEEP); one commit.
    /// Files over it are pruned at their next close.
    pub fn set_keep(&self, keep: u32) -> Result<()> {
        self.writable()?;
        if keep == 0 || keep > MAX_KEEP {
            return Err(FsError::Invalid("close versions kept per file must be 1 to 1024"));
        }
        let mut ns = self.lock();
        ns.header.keep = keep;
        self.write_header(&mut ns)?;
        self.commit_then_release(ns)
    }

    /// The close-version rules, in order (empty: no policy).
    pub fn policy(&self) -> Result<Vec<Rule>> {
        let object = self.lock().header.policy;
        if object == 0 {
            return Ok(Vec::new());
        }
        policy::decode(&self.read_rule_object(object, policy::body_len)?)
    }

    /// A rule list object's bytes (`policy.rs` framing): its header, then
    /// the body it says (`body_len` bounds it).
    pub(crate) fn read_rule_object(&self, object: u32, body_len: fn(&[u8]) -> Result<usize>) -> Result<Vec<u8>> {
        let mut head = [0u8; POLICY_HEADER];
        self.read_object(object, 0, &mut head)?;
        let mut b = vec![0u8; POLICY_HEADER + body_len(&head)?];
        self.read_object(object, 0, &mut b)?;
        Ok(b)
    }

    /// Add rule `text` at the end (first match wins); a bad rule or one
    /// already there is refused, nothing changed. Durable on return.
    pub fn policy_add(&self, text: &str) -> Result<()> {
        let rule = Rule::parse(text)?;
        let mut rules = self.policy()?;
        if rules.contains(&rule) {
            return Err(FsError::Invalid("the rule is already in the version policy"));
        }
        if rules.len() >= MAX_RULES {
            return Err(FsError::Invalid("a version policy has at most 256 rules"));
        }
        rules.push(rule);
        // The pool takes version records from now on: enabled here (a
        // commit of its own, once per pool), not by the mount's first
        // batch of close versions, where that commit waited for the one
        // in flight under the namespace lock (1.5 s in a PostMark run).
        self.pool.enable_fs_version_records()?;
        self.write_policy(&rules)
    }

    /// Remove rule `text` (refused when not there). Durable on return.
    pub fn policy_remove(&self, text: &str) -> Result<()> {
        let rule = Rule::parse(text)?;
        let mut rules = self.policy()?;
        let at = rules.iter().position(|r| *r == rule).ok_or(FsError::Invalid("no such rule in the version policy"))?;
        rules.remove(at);
        self.write_policy(&rules)
    }

    fn write_policy(&self, rules: &[Rule]) -> Result<()> {
        self.write_rule_object(&policy::encode(rules), |h| &mut h.policy)
    }

    /// A rule list object (created on first use, append placement so a
    /// rewrite is whole or absent) and the header field `slot` naming it:
    /// one commit.
    pub(crate) fn write_rule_object(&self, bytes: &[u8], slot: fn(&mut Header) -> &mut u32) -> Result<()> {
        self.writable()?;
        let mut ns: crate::namespace::ns::NsGuard<'_> = self.lock();
        self.pool.make_room_for(bytes.len() / 4096 * 96 + 2048)?;
        if *slot(&mut ns.header) == 0 {
            *slot(&mut ns.header) =
                self.pool.create_object(self.id, crate::OBJECT_SIZE, Some(PlacementKind::Append))?;
            self.write_header(&mut ns)?;
        }
        let object = *slot(&mut ns.header);
        self.pool.write(object, 0, bytes, false)?;
        self.commit_then_release(ns)
    }

    /// Whether `path` (from the root, no leading '/') gets close versions.
    pub fn versioned_path(&self, rules: &[Rule], path: &str) -> bool {
        policy::versioned(rules, path)
    }

    /// The path of directory `dir` from the root ("" for the root), by its
    /// parents and their entries; None past the walk's bound.
    pub fn dir_path(&self, dir: u64) -> Result<Option<String>> {
        let mut names: Vec<String> = Vec::new();
        let mut at = dir;
        let mut ns = self.lock();
        for _ in 0..crate::namespace::ns::MAX_DEPTH {
            if at == crate::ROOT {
                names.reverse();
                return Ok(Some(names.join("/")));
            }
            let d = self.inode(&mut ns, at)?;
            let p = self.inode(&mut ns, d.parent)?;
            let e = self.dir_ref(&mut ns, &p)?.iter().find(|e| e.ino == at).cloned().ok_or(FsError::NotFound)?;
            names.push(String::from_utf8_lossy(&e.name).into_owned());
            at = d.parent;
        }
        Ok(None)
    }
}

impl FileVolume {
    /// The inode at `path` from the root ('/'-separated; a leading '/' and
    /// empty parts are ignored). At most 4096 parts.
    pub fn resolve(&self, path: &str) -> Result<u64> {
        let mut ino = crate::ROOT;
        for part in path.split('/').filter(|p| !p.is_empty()).take(crate::namespace::ns::MAX_DEPTH) {
            ino = self.lookup(ino, part.as_bytes())?.inode.ino;
        }
        Ok(ino)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Versioned, ROOT};
    use std::sync::Arc;

    fn read_version(v: &Versioned, n: u64) -> Vec<u8> {
        let x = v.lookup(ROOT, format!("a@{n}").as_bytes()).unwrap().inode.ino;
        v.read(x, 0, 100).unwrap()
    }

    /// A volume from before FS_VERSION_RECORDS keeps its close versions
    /// as `~c` table snapshots: they list, read and delete next to the
    /// new records, and the file's last name takes both kinds along.
    #[test]
    fn table_snapshot_close_versions_of_older_volumes_still_work() {
        let (_sim, pool) = tarn_sim::fixture::one_device_pool(256 << 20);
        let pool = Arc::new(pool);
        FileVolume::format(&pool, "home", 0, 0, 0).unwrap();
        let fv = FileVolume::open(pool.clone(), "home").unwrap();
        let a = fv.create(ROOT, b"a", Kind::File, 0o600, 1, 2).unwrap().inode.ino;
        for (k, data) in [b"old", b"mid", b"new"].iter().enumerate() {
            fv.write(a, 0, *data).unwrap();
            if k == 1 {
                // As an older tarn took it: a table snapshot.
                fv.version_of(a, VersionKind::Close, "", true).unwrap();
            } else {
                fv.close_version(a, true).unwrap();
            }
        }
        fv.write(a, 0, b"now").unwrap();
        fv.sync().unwrap();
        let kinds: Vec<(u64, bool)> = fv.versions().unwrap().iter().map(|s| (s.number, s.slot.is_some())).collect();
        assert_eq!(kinds, vec![(1, true), (2, false), (3, true)]);
        let v = Versioned::new(fv);
        assert_eq!(
            (read_version(&v, 1), read_version(&v, 2), read_version(&v, 3)),
            (b"old".to_vec(), b"mid".to_vec(), b"new".to_vec())
        );
        let x = v.lookup(ROOT, b"a@2").unwrap().inode;
        assert_eq!((x.perm, x.uid, x.size), (0o600, 1, 3), "the record of the table snapshot");
        v.remove_version(a, b"2").unwrap();
        assert_eq!(read_version(&v, 3), b"new");
        assert!(v.lookup(ROOT, b"a@2").is_err());
        v.live.unlink(ROOT, b"a").unwrap();
        v.live.sync().unwrap();
        assert!(v.live.versions().unwrap().is_empty(), "close versions of both kinds go with the last name");
        assert_eq!(pool.check().problems, Vec::<String>::new());
        assert_eq!(v.live.check().unwrap().problems, Vec::<String>::new());
    }
}
