//! A consistency check of a file volume's namespace (read-only): every
//! allocated inode reachable from the root, every entry pointing at an
//! allocated inode of its kind, link counts equal to the names found.
//! The crash tests use it; `tarn fs check` can later.

use crate::error::{FsError, Result};
use crate::namespace::acl::AclKind;
use crate::namespace::inode::{Inode, Kind, RECORD};
use crate::namespace::ns::FileVolume;
use crate::ROOT;
use std::collections::{BTreeMap, VecDeque};

/// Records read from the inode table per engine read.
const TABLE_CHUNK: u64 = 4096;
/// Problems reported at most (the rest are counted).
const MAX_PROBLEMS: usize = 100;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CheckReport {
    pub inodes: u64,
    pub directories: u64,
    pub problems: Vec<String>,
    pub more_problems: u64,
}

impl CheckReport {
    pub(crate) fn problem(&mut self, p: String) {
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(p);
        } else {
            self.more_problems += 1;
        }
    }
}

impl FileVolume {
    /// Walk the tree from the root, then compare with the inode table.
    pub fn check(&self) -> Result<CheckReport> {
        let mut report = CheckReport::default();
        let (allocated, damaged) = self.table()?;
        damaged.into_iter().for_each(|d| report.problem(d));
        let names = self.walk(&allocated, &mut report)?;
        // A set can hold a list only once the pool has the feature: no
        // set is read on a pool that never stored one.
        let lists_stored = self.pool.has_feature(tarn_format::superblock::incompat::FS_POSIX_ACLS);
        for (ino, i) in &allocated {
            let found = names.get(ino);
            let want = match i.kind {
                Kind::Dir => 2 + found.map_or(0, |n| n.subdirs),
                _ => found.map_or(0, |n| n.names),
            };
            if found.is_none_or(|n| n.names == 0) && *ino != ROOT {
                report.problem(format!("inode {ino} is allocated but no entry names it"));
            } else if i.nlink != want {
                report.problem(format!("inode {ino}: nlink {} but {want} expected", i.nlink));
            }
            if i.acl != 0 || (lists_stored && i.object != 0 && i.kind != Kind::Symlink) {
                self.check_lists(i, &mut report)?;
            }
        }
        self.check_version_log(&mut report)?;
        report.inodes = allocated.len() as u64;
        Ok(report)
    }

    /// Byte 6 names exactly the access control lists the inode's
    /// attribute set holds: a list it names that the set lacks, or one the
    /// set holds that it does not name (the kernel, answered from byte 6,
    /// would see no list: a file open to more than its list allows). A
    /// set that does not decode is reported too; the lists in it were
    /// checked by its decode.
    fn check_lists(&self, i: &Inode, report: &mut CheckReport) -> Result<()> {
        // The record in hand: no second inode read, no name list built.
        let set = match self.load_xattrs(i) {
            Ok(found) => found.map,
            Err(e @ FsError::Corrupt { .. }) => {
                report.problem(e.to_string());
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        for kind in [AclKind::Access, AclKind::Default] {
            let held = set.contains_key(kind.name());
            let (name, ino) = (lossy(kind.name()), i.ino);
            match (i.acl & kind.flag() != 0, held) {
                (true, false) => {
                    report.problem(format!("inode {ino}: byte 6 names {name} but its set does not hold it"))
                }
                (false, true) => {
                    report.problem(format!("inode {ino}: its set holds {name} but byte 6 does not name it"))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Every allocated record of the table, read in chunks, and what the
    /// records that do not decode say (a damaged record is not allocated
    /// here: the check reports it, the orphan scan leaves it alone).
    pub(crate) fn table(&self) -> Result<(BTreeMap<u64, Inode>, Vec<String>)> {
        let next = self.lock().header.next_ino;
        let mut out = BTreeMap::new();
        let mut damaged = Vec::new();
        let mut buf = vec![0u8; (TABLE_CHUNK as usize) * RECORD];
        for first in (0..next).step_by(TABLE_CHUNK as usize) {
            let n = TABLE_CHUNK.min(next - first) as usize;
            self.pool.read_view(self.id, self.table_view(), first * RECORD as u64, &mut buf[..n * RECORD])?;
            for (k, rec) in buf[..n * RECORD].chunks_exact(RECORD).enumerate() {
                let ino = first + k as u64;
                let mut b = [0u8; RECORD];
                b.copy_from_slice(rec);
                match Inode::decode(&b, ino) {
                    _ if ino == 0 => {}
                    Ok(Some(i)) => drop(out.insert(ino, i)),
                    Ok(None) => {}
                    Err(e) => damaged.push(e.to_string()),
                }
            }
        }
        Ok((out, damaged))
    }

    /// Names per inode found walking down from the root (each directory
    /// once: the queue holds at most every allocated directory).
    fn walk(&self, allocated: &BTreeMap<u64, Inode>, report: &mut CheckReport) -> Result<BTreeMap<u64, Names>> {
        let mut names: BTreeMap<u64, Names> = BTreeMap::new();
        let mut queue = VecDeque::from([ROOT]);
        let mut seen = std::collections::BTreeSet::from([ROOT]);
        while let Some(d) = queue.pop_front() {
            let Some(dir_inode) = allocated.get(&d) else {
                report.problem(format!("directory {d} is not allocated"));
                continue;
            };
            report.directories += 1;
            let dir = match self.dir_ref(&mut self.lock(), dir_inode).cloned() {
                Ok(dir) => dir,
                Err(e @ FsError::Corrupt { .. }) => {
                    report.problem(e.to_string());
                    continue;
                }
                Err(e) => return Err(e),
            };
            for e in dir.iter() {
                let n = names.entry(e.ino).or_default();
                n.names += 1;
                match allocated.get(&e.ino) {
                    None => report.problem(format!("entry {:?} in {d} names free inode {}", lossy(&e.name), e.ino)),
                    Some(i) if i.kind != e.kind => {
                        report.problem(format!("entry {:?} in {d}: kind differs", lossy(&e.name)))
                    }
                    Some(i) if i.kind == Kind::Dir => {
                        names.entry(d).or_default().subdirs += 1;
                        if i.parent != d {
                            report
                                .problem(format!("directory {} is in {d} but says its parent is {}", e.ino, i.parent));
                        }
                        if !seen.insert(e.ino) {
                            report.problem(format!("directory {} has two names", e.ino));
                        } else {
                            queue.push_back(e.ino);
                        }
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(names)
    }
}

#[derive(Default)]
struct Names {
    names: u32,
    subdirs: u32,
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
