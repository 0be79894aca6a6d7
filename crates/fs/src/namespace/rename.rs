//! Rename: rename(2) and renameat2(2)'s RENAME_NOREPLACE,
//! RENAME_EXCHANGE and RENAME_WHITEOUT. A rename is one namespace change:
//! made room for whole (`FileVolume::room`), so a crash keeps all of it
//! or none.

use crate::error::{FsError, Result};
use crate::namespace::dir::{check_name, Dir, Entry};
use crate::namespace::inode::{Inode, Kind};
use crate::namespace::ns::{now, FileVolume, Ns, MAX_DEPTH};
use crate::ROOT;

/// What a rename does with an existing target (renameat2's flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenameMode {
    /// rename(2): an existing target is replaced (a file by a file, an
    /// empty directory by a directory).
    Replace,
    /// RENAME_NOREPLACE: an existing target fails the rename (EEXIST).
    NoReplace,
    /// RENAME_EXCHANGE: both names must exist and swap (of any kinds).
    Exchange,
    /// RENAME_WHITEOUT (an overlay file system's upper layer): a move as
    /// Replace (NoReplace with `no_replace`) whose old name becomes a
    /// *whiteout*, a character device 0:0 owned by `owner`, in the same
    /// change (overlayfs hides the lower layer's file behind it).
    Whiteout { owner: (u32, u32), no_replace: bool },
}

impl RenameMode {
    fn no_replace(self) -> bool {
        matches!(self, RenameMode::NoReplace | RenameMode::Whiteout { no_replace: true, .. })
    }
}

/// The source side of a rename, read under the namespace lock.
struct Source {
    parent: Inode,
    dir: Dir,
    entry: Entry,
}

impl FileVolume {
    /// rename(2), over an existing name too.
    pub fn rename(&self, parent: u64, name: &[u8], newparent: u64, newname: &[u8]) -> Result<()> {
        self.rename_as(parent, name, newparent, newname, RenameMode::Replace)
    }

    /// Rename as `mode` says. Same directory: one write. Across
    /// directories the new entry is written before the old one goes.
    pub fn rename_as(&self, parent: u64, name: &[u8], newparent: u64, newname: &[u8], mode: RenameMode) -> Result<()> {
        self.writable()?;
        check_name(name)?;
        check_name(newname)?;
        if matches!(mode, RenameMode::Whiteout { .. }) {
            // A whiteout is a special file (a commit of its own, once).
            self.pool.enable_fs_special_files()?;
        }
        let mut ns = self.lock();
        let p = self.inode(&mut ns, parent)?;
        let dir = self.dir(&mut ns, &p)?;
        let entry = dir.find(name).cloned().ok_or(FsError::NotFound)?;
        let src = Source { parent: p, dir, entry };
        if parent == newparent && name == newname {
            // The VFS answers these before asking; a direct caller gets
            // what it would.
            return if mode.no_replace() { Err(FsError::Exists) } else { Ok(()) };
        }
        match mode {
            RenameMode::Exchange => self.exchange(&mut ns, src, newparent, newname),
            _ => self.move_entry(&mut ns, src, newparent, newname, mode),
        }
    }

    /// The target directory's inode and entries (the source's own when
    /// the rename stays in one directory).
    fn target_dir(&self, ns: &mut Ns, src: &Source, newparent: u64) -> Result<(Inode, Dir)> {
        let np = self.inode(ns, newparent)?;
        let to = if src.parent.ino == newparent { src.dir.clone() } else { self.dir(ns, &np)? };
        Ok((np, to))
    }

    /// Replace or NoReplace: the source's entry moves to the new name.
    fn move_entry(&self, ns: &mut Ns, src: Source, newparent: u64, newname: &[u8], mode: RenameMode) -> Result<()> {
        let (mut np, mut to) = self.target_dir(ns, &src, newparent)?;
        let Source { parent: mut p, dir: mut from, entry: e } = src;
        let same = p.ino == newparent;
        if e.kind == Kind::Dir {
            self.refuse_loop(ns, e.ino, newparent)?;
        }
        let old = match to.find(newname).cloned() {
            Some(_) if mode.no_replace() => return Err(FsError::Exists),
            // Two names of one inode: POSIX says nothing happens.
            Some(o) if o.ino == e.ino => return Ok(()),
            Some(o) => Some(self.check_replace(ns, &e, &o)?),
            None => None,
        };
        self.room(7, to.write_bound() + if same { 0 } else { from.write_bound() })?;
        // Its inode before the entry naming it, as a create writes them.
        let whiteout = match mode {
            RenameMode::Whiteout { owner, .. } => Some(self.make_whiteout(ns, owner)?),
            _ => None,
        };
        to.remove(newname);
        to.insert(newname, e.ino, e.kind)?;
        let dir_moves = e.kind == Kind::Dir && !same;
        let replaced_dir = old.as_ref().is_some_and(|o| o.kind == Kind::Dir);
        if same {
            to.remove(&e.name);
            if let Some(w) = whiteout {
                to.insert(&e.name, w, Kind::CharDev)?;
            }
            if replaced_dir {
                p.nlink = p.nlink.saturating_sub(1);
            }
            self.write_dir(ns, &mut p, to)?;
        } else {
            np.nlink += u32::from(dir_moves && !replaced_dir);
            self.write_dir(ns, &mut np, to)?;
            from.remove(&e.name);
            if let Some(w) = whiteout {
                from.insert(&e.name, w, Kind::CharDev)?;
            }
            p.nlink = p.nlink.saturating_sub(u32::from(dir_moves));
            self.write_dir(ns, &mut p, from)?;
        }
        if dir_moves {
            self.reparent(ns, e.ino, newparent)?;
        }
        match old {
            Some(o) => self.drop_link(ns, o),
            None => Ok(()),
        }
    }

    /// RENAME_EXCHANGE: the two names swap their inodes; each entry keeps
    /// its place in its directory, nothing is unlinked. A directory
    /// moving to the other parent moves that parent's link count with it.
    fn exchange(&self, ns: &mut Ns, src: Source, newparent: u64, newname: &[u8]) -> Result<()> {
        let (mut np, mut to) = self.target_dir(ns, &src, newparent)?;
        let Source { parent: mut p, dir: mut from, entry: e } = src;
        let o = to.find(newname).cloned().ok_or(FsError::NotFound)?;
        if o.ino == e.ino {
            return Ok(());
        }
        let same = p.ino == newparent;
        if !same {
            if e.kind == Kind::Dir {
                self.refuse_loop(ns, e.ino, newparent)?;
            }
            if o.kind == Kind::Dir {
                self.refuse_loop(ns, o.ino, p.ino)?;
            }
        }
        self.room(6, to.write_bound() + if same { 0 } else { from.write_bound() })?;
        if same {
            let swapped = to.retarget(&e.name, o.ino, o.kind) && to.retarget(newname, e.ino, e.kind);
            assert!(swapped, "both names were found in this directory under the lock");
            return self.write_dir(ns, &mut p, to);
        }
        let (e_dir, o_dir) = (u32::from(e.kind == Kind::Dir), u32::from(o.kind == Kind::Dir));
        let swapped = to.retarget(newname, e.ino, e.kind) && from.retarget(&e.name, o.ino, o.kind);
        assert!(swapped, "both names were found in their directories under the lock");
        // Each count keeps the subdirectory it had until its own moves in.
        np.nlink = (np.nlink + e_dir).saturating_sub(o_dir);
        self.write_dir(ns, &mut np, to)?;
        p.nlink = (p.nlink + o_dir).saturating_sub(e_dir);
        self.write_dir(ns, &mut p, from)?;
        if e_dir == 1 {
            self.reparent(ns, e.ino, newparent)?;
        }
        if o_dir == 1 {
            self.reparent(ns, o.ino, p.ino)?;
        }
        Ok(())
    }

    /// A directory that moved records its new parent (its `..`).
    fn reparent(&self, ns: &mut Ns, dir: u64, newparent: u64) -> Result<()> {
        let mut moved = self.inode(ns, dir)?;
        (moved.parent, moved.ctime) = (newparent, now());
        self.save(ns, &moved)
    }

    /// What an existing target of a rename may be: a file for a file, an
    /// empty directory for a directory.
    fn check_replace(&self, ns: &mut Ns, e: &Entry, o: &Entry) -> Result<Inode> {
        let target = self.inode(ns, o.ino)?;
        match (e.kind == Kind::Dir, target.kind == Kind::Dir) {
            (true, false) => Err(FsError::NotDir),
            (false, true) => Err(FsError::IsDir),
            (true, true) if !self.dir_ref(ns, &target)?.is_empty() => Err(FsError::NotEmpty),
            _ => Ok(target),
        }
    }

    /// A directory may not move into its own subtree.
    fn refuse_loop(&self, ns: &mut Ns, moving: u64, newparent: u64) -> Result<()> {
        let mut at = newparent;
        for _ in 0..MAX_DEPTH {
            if at == moving {
                return Err(FsError::Invalid("a directory cannot move into itself"));
            }
            if at == ROOT {
                return Ok(());
            }
            at = self.inode(ns, at)?.parent;
        }
        Err(FsError::corrupt("directory tree", newparent, "deeper than the walk's bound"))
    }
}
