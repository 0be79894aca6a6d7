//! User extended attributes (`user.*`) of files and directories
//! (docs/FORMAT.md *Extended attributes*). They live in the inode's own
//! object, in the area past the largest file's end: two slots of
//! 256 KiB, each holding the whole set with a generation and a crc32c.
//! A change writes the slot that does not hold the newest set, so a
//! write torn by a crash leaves the previous set readable; and being in
//! the object, the set is kept by every snapshot, version and clone of
//! it with no extra rule (a tag of the object is a tag of its xattrs).

use crate::error::{FsError, Result};
use crate::namespace::acl::{Acl, AclKind, DEFAULT as DEFAULT_NAME};
use crate::namespace::inode::{Inode, Kind};
use crate::namespace::ns::{now, FileVolume, Ns};
use crate::MAX_FILE_SIZE;
use std::collections::BTreeMap;
use tarn_engine::PlacementKind;
use tarn_format::checksum::crc32c;

/// One slot: a header and the set.
pub const SLOT: u64 = 256 << 10;
/// Both slots, at the end of every object.
pub const AREA: u64 = 2 * SLOT;
/// Longest name, with its `user.` prefix (Linux's XATTR_NAME_MAX).
pub const MAX_NAME: usize = 255;
/// Longest value (Linux's XATTR_SIZE_MAX).
pub const MAX_VALUE: usize = 64 << 10;
const HEADER: usize = 28;
/// Largest encoded set: one slot.
pub const MAX_SET: usize = SLOT as usize - HEADER;
const MAGIC: &[u8; 4] = b"TFSX";
const VERSION: u8 = 1;
/// What a first read of a slot takes (most sets are small).
const FIRST_READ: usize = 4096;
/// The only namespace kept.
pub const USER: &[u8] = b"user.";
/// Names the FUSE adapter answers itself (snapshots, versions): never
/// stored, never listed.
pub const CONTROL: &[u8] = b"user.tarn.";

/// setxattr's flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XattrMode {
    /// Create or replace.
    Any,
    /// XATTR_CREATE: EEXIST if it exists.
    Create,
    /// XATTR_REPLACE: ENODATA if it does not.
    Replace,
}

type Map = BTreeMap<Vec<u8>, Vec<u8>>;

/// The newest set of an inode and the slot holding it.
pub(crate) struct Found {
    generation: u64,
    slot: Option<usize>,
    pub(crate) map: Map,
}

fn slot_offset(slot: usize) -> u64 {
    MAX_FILE_SIZE + slot as u64 * SLOT
}

/// A name this layer keeps: `user.` and more, not tarn's own, at most
/// MAX_NAME bytes, no NUL.
pub fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > MAX_NAME {
        return Err(FsError::XattrRange("a name is at most 255 bytes"));
    }
    if !name.starts_with(USER) || name.len() == USER.len() || name.starts_with(CONTROL) || name.contains(&0) {
        return Err(FsError::NotSupported);
    }
    Ok(())
}

pub(crate) fn encode(generation: u64, map: &Map) -> Vec<u8> {
    let mut b = vec![0u8; HEADER];
    for (name, value) in map {
        b.push(name.len() as u8);
        b.extend_from_slice(&(value.len() as u32).to_le_bytes());
        b.extend_from_slice(name);
        b.extend_from_slice(value);
    }
    let body = (b.len() - HEADER) as u32;
    b[0..4].copy_from_slice(MAGIC);
    b[4] = VERSION;
    b[8..16].copy_from_slice(&generation.to_le_bytes());
    b[16..20].copy_from_slice(&(map.len() as u32).to_le_bytes());
    b[20..24].copy_from_slice(&body.to_le_bytes());
    let crc = crc32c(&b);
    b[24..28].copy_from_slice(&crc.to_le_bytes());
    b
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The body length a slot's header announces (checked against the slot).
fn body_len(head: &[u8]) -> std::result::Result<usize, String> {
    let n = u32_at(head, 20) as usize;
    if n > MAX_SET {
        return Err(format!("body of {n} bytes in a slot of {MAX_SET}"));
    }
    Ok(n)
}

/// A slot: Ok(None) when never written (zeros), else the generation and
/// the set, with every check; Err names what does not decode.
pub(crate) fn decode(b: &[u8]) -> std::result::Result<Option<(u64, Map)>, String> {
    if b.len() < HEADER {
        return Err("short slot".into());
    }
    if b[..HEADER].iter().all(|&x| x == 0) {
        return Ok(None);
    }
    if &b[0..4] != MAGIC || b[4] != VERSION || b[5..8] != [0, 0, 0] {
        return Err("bad magic, version or reserved bytes".into());
    }
    let body = body_len(b)?;
    let b = b.get(..HEADER + body).ok_or("body past the bytes read")?;
    let mut zeroed = b.to_vec();
    zeroed[24..28].fill(0);
    if crc32c(&zeroed) != u32_at(b, 24) {
        return Err("crc mismatch".into());
    }
    let generation = u64::from_le_bytes(b[8..16].try_into().map_err(|_| "generation")?);
    let count = u32_at(b, 16) as usize;
    let map = entries(&b[HEADER..], count)?;
    Ok(Some((generation, map)))
}

fn entries(mut body: &[u8], count: usize) -> std::result::Result<Map, String> {
    let mut map = Map::new();
    let mut last: Option<Vec<u8>> = None;
    for k in 0..count {
        if body.len() < 5 {
            return Err(format!("entry {k} past the body"));
        }
        let (n, v) = (body[0] as usize, u32_at(body, 1) as usize);
        if v > MAX_VALUE || body.len() < 5 + n + v {
            return Err(format!("entry {k}: value of {v} bytes or past the body"));
        }
        let (name, value) = (&body[5..5 + n], &body[5 + n..5 + n + v]);
        match AclKind::of_name(name) {
            Some(_) => Acl::decode(value).map(drop).map_err(|e| format!("entry {k}: {e}"))?,
            None => check_name(name).map_err(|_| format!("entry {k}: name not kept by tarn"))?,
        }
        if last.as_deref().is_some_and(|l| l >= name) {
            return Err(format!("entry {k}: names not in ascending order"));
        }
        last = Some(name.to_vec());
        map.insert(name.to_vec(), value.to_vec());
        body = &body[5 + n + v..];
    }
    if !body.is_empty() {
        return Err(format!("{} bytes past the last entry", body.len()));
    }
    Ok(map)
}

/// Which inodes a change of their attribute set is for.
#[derive(Clone, Copy)]
enum Holders {
    /// `user.*` names: files and directories (EPERM elsewhere, as Linux).
    User,
    /// Access control lists: every kind but symlinks (EOPNOTSUPP there;
    /// Linux keeps none on a symlink). A fifo, socket or device node gets
    /// an object for its set at its first list (FS_SPECIAL_SETS).
    Lists,
}

impl Holders {
    fn admit(self, kind: Kind) -> Result<()> {
        match self {
            Holders::User if !matches!(kind, Kind::File | Kind::Dir) => {
                Err(FsError::NotPermitted("user extended attributes are for files and directories"))
            }
            Holders::Lists if kind == Kind::Symlink => Err(FsError::NotSupported),
            _ => Ok(()),
        }
    }
}

/// Whether inodes of `kind` may keep an attribute set in their object (a
/// symlink's object holds its target only).
fn holds_set(kind: Kind) -> bool {
    kind != Kind::Symlink
}

/// Keep `list` as access control list `kind` of `i` (None: drop it), and
/// byte 6 in step.
fn put_list(map: &mut Map, i: &mut Inode, kind: AclKind, list: Option<Vec<u8>>) {
    match list {
        Some(b) => {
            map.insert(kind.name().to_vec(), b);
            i.acl |= kind.flag();
        }
        None => {
            map.remove(kind.name());
            i.acl &= !kind.flag();
        }
    }
}

impl FileVolume {
    /// Read slot `slot` of `object` as this volume's view shows it.
    fn read_slot(&self, object: u32, slot: usize) -> Result<std::result::Result<Option<(u64, Map)>, String>> {
        let mut b = vec![0u8; FIRST_READ];
        self.read_object(object, slot_offset(slot), &mut b)?;
        if b[..HEADER].iter().any(|&x| x != 0) {
            match body_len(&b) {
                Ok(n) if HEADER + n > FIRST_READ => {
                    b = vec![0u8; HEADER + n];
                    self.read_object(object, slot_offset(slot), &mut b)?;
                }
                Ok(_) => {}
                Err(e) => return Ok(Err(e)),
            }
        }
        Ok(decode(&b))
    }

    /// The newest set of `i`. A slot that does not decode is one a crash
    /// tore (the other holds the set before it); both: corrupt.
    pub(crate) fn load_xattrs(&self, i: &Inode) -> Result<Found> {
        let mut found = Found { generation: 0, slot: None, map: Map::new() };
        if i.object == 0 || !holds_set(i.kind) {
            return Ok(found);
        }
        let mut bad = Vec::new();
        for slot in 0..2 {
            match self.read_slot(i.object, slot)? {
                Ok(Some((g, map))) if found.slot.is_none() || g > found.generation => {
                    found = Found { generation: g, slot: Some(slot), map };
                }
                Ok(_) => {}
                Err(e) => bad.push(e),
            }
        }
        if bad.len() == 2 {
            return Err(FsError::corrupt("extended attributes", i.ino, bad.join("; ")));
        }
        Ok(found)
    }

    /// The value of `name` (ENODATA: none).
    /// An access control list's name is answered from the inode's byte 6
    /// when it has none (the kernel asks for an inode's list once, on the
    /// first permission check by someone not its owner).
    pub fn get_xattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        let list = AclKind::of_name(name);
        if list.is_none() && check_name(name).is_err() {
            return Err(FsError::NoData);
        }
        let i = self.inode(&mut self.lock(), ino)?;
        if list.is_some_and(|k| i.acl & k.flag() == 0) {
            return Err(FsError::NoData);
        }
        self.load_xattrs(&i)?.map.remove(name).ok_or(FsError::NoData)
    }

    /// Every name, each followed by a NUL (listxattr's format).
    pub fn list_xattrs(&self, ino: u64) -> Result<Vec<u8>> {
        let i = self.inode(&mut self.lock(), ino)?;
        let mut out = Vec::new();
        for name in self.load_xattrs(&i)?.map.into_keys() {
            out.extend_from_slice(&name);
            out.push(0);
        }
        Ok(out)
    }

    /// Set `name` to `value` (flags as `mode`); one slot write.
    pub fn set_xattr(&self, ino: u64, name: &[u8], value: &[u8], mode: XattrMode) -> Result<()> {
        check_name(name)?;
        if value.len() > MAX_VALUE {
            return Err(FsError::XattrTooBig);
        }
        self.change_xattrs(ino, Holders::User, |map, _| {
            match (mode, map.contains_key(name)) {
                (XattrMode::Create, true) => return Err(FsError::Exists),
                (XattrMode::Replace, false) => return Err(FsError::NoData),
                _ => {}
            }
            map.insert(name.to_vec(), value.to_vec());
            Ok(())
        })
    }

    /// Remove `name` (ENODATA: none).
    pub fn remove_xattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        if check_name(name).is_err() {
            return Err(FsError::NoData);
        }
        self.change_xattrs(ino, Holders::User, |map, _| map.remove(name).map(drop).ok_or(FsError::NoData))
    }

    /// Load, change and write back the set of `ino` as one namespace
    /// change: the object's tag (first change after a snapshot), the
    /// slot write and the inode (its ctime, and the mode and byte 6 an
    /// access control list changes) in one commit.
    /// `holders`: the kinds of inode the change is for.
    fn change_xattrs(
        &self,
        ino: u64,
        holders: Holders,
        change: impl FnOnce(&mut Map, &mut Inode) -> Result<()>,
    ) -> Result<()> {
        self.writable()?;
        let mut ns = self.lock();
        let mut i = self.inode(&mut ns, ino)?;
        holders.admit(i.kind)?;
        // A file an older tarn let grow into the area.
        if i.size > MAX_FILE_SIZE {
            return Err(FsError::TooLarge);
        }
        let mut found = self.load_xattrs(&i)?;
        change(&mut found.map, &mut i)?;
        if i.object == 0 && found.map.is_empty() {
            // No set to keep (a list the mode says all of): the mode
            // alone, and no object made for nothing.
            i.ctime = now();
            return self.save(&mut ns, &i);
        }
        let bytes = encode(found.generation + 1, &found.map);
        if bytes.len() > SLOT as usize {
            return Err(FsError::XattrSpace);
        }
        self.enable_set_features(i.kind, i.acl != 0)?;
        self.write_xattrs(&mut ns, &mut i, found.slot, &bytes)
    }

    /// The pool features an attribute set of an inode of `kind` needs,
    /// each set by a commit of its own the first time: before the change
    /// queues anything, so no commit falls inside it.
    pub(crate) fn enable_set_features(&self, kind: Kind, lists: bool) -> Result<()> {
        self.pool.enable_fs_xattrs()?;
        if lists {
            self.pool.enable_fs_posix_acls()?;
        }
        if kind.is_special() {
            self.pool.enable_fs_special_sets()?;
        }
        Ok(())
    }

    /// Set access control list `kind` of `ino` from `value` (its xattr
    /// form, as the kernel sends it). An access list sets the mode's rwx
    /// bits (the group bits are its mask's) and is not kept when the mode
    /// says all of it; `kill_sgid` (the kernel's
    /// FUSE_SETXATTR_ACL_KILL_SGID: the caller is not in the file's group
    /// and may not keep it) clears set-group-ID.
    pub fn set_acl(&self, ino: u64, kind: AclKind, value: &[u8], kill_sgid: bool) -> Result<()> {
        let acl = Acl::decode(value)?;
        self.change_xattrs(ino, Holders::Lists, |map, i| {
            let keep = match kind {
                AclKind::Access => {
                    let (bits, equiv) = acl.equiv_mode();
                    i.perm = (i.perm & !0o777) | bits;
                    if kill_sgid {
                        i.perm &= !0o2000;
                    }
                    !equiv
                }
                AclKind::Default if i.kind == Kind::Dir => true,
                AclKind::Default => {
                    return Err(FsError::NotPermitted("a default access control list is for directories"))
                }
            };
            put_list(map, i, kind, keep.then(|| acl.encode()));
            Ok(())
        })
    }

    /// Remove access control list `kind` of `ino` (ENODATA: none); the
    /// mode stays.
    pub fn remove_acl(&self, ino: u64, kind: AclKind) -> Result<()> {
        self.change_xattrs(ino, Holders::Lists, |map, i| {
            if !map.contains_key(kind.name()) {
                return Err(FsError::NoData);
            }
            put_list(map, i, kind, None);
            Ok(())
        })
    }

    /// chmod of `i` (its new `perm` set) when it has an access list: the
    /// list's owner, group class and other entries follow the mode, all
    /// saved as one change.
    pub(crate) fn chmod_acl(&self, ns: &mut Ns, i: &mut Inode) -> Result<()> {
        let mut found = self.load_xattrs(i)?;
        let stored = found.map.get(AclKind::Access.name()).ok_or_else(|| {
            FsError::corrupt("access control list", i.ino, "byte 6 names a list the set does not hold")
        })?;
        let mut acl = Acl::decode(stored)?;
        acl.chmod(i.perm);
        found.map.insert(AclKind::Access.name().to_vec(), acl.encode());
        self.write_xattrs(ns, i, found.slot, &encode(found.generation + 1, &found.map))
    }

    /// What an inode of `kind` made with `perm` in directory `p`, which
    /// has a default list, inherits (POSIX.1e; Linux's
    /// `posix_acl_create`): its permission bits narrowed by the list (no
    /// umask), and the attribute set to write with it (a directory keeps
    /// the default list; an access list when the mode cannot say it).
    /// Fifos, sockets and device nodes inherit an access list as files
    /// do (their set in an object of their own: FS_SPECIAL_SETS).
    pub(crate) fn inherit_acl(&self, p: &Inode, kind: Kind, perm: u32) -> Result<(u32, Option<Vec<u8>>, u8)> {
        let map = self.load_xattrs(p)?.map;
        let default = map.get(DEFAULT_NAME).ok_or_else(|| {
            FsError::corrupt("access control list", p.ino, "byte 6 names a default list the set does not hold")
        })?;
        let mut acl = Acl::decode(default)?;
        let (perm, equiv) = acl.create_masq(perm);
        assert!(holds_set(kind), "a symlink inherits no list");
        let mut set = Map::new();
        if kind == Kind::Dir {
            set.insert(DEFAULT_NAME.to_vec(), default.clone());
        }
        if !equiv {
            set.insert(AclKind::Access.name().to_vec(), acl.encode());
        }
        let flags = set.keys().filter_map(|n| AclKind::of_name(n)).fold(0, |f, k| f | k.flag());
        Ok((perm, (!set.is_empty()).then(|| encode(1, &set)), flags))
    }

    pub(crate) fn write_xattrs(&self, ns: &mut Ns, i: &mut Inode, newest: Option<usize>, bytes: &[u8]) -> Result<()> {
        // The other slot may be overwritten in place (a file's object has
        // the pool's placement): the newest set must be committed first,
        // or a crash tearing this write would leave no whole set (a
        // directory's object is append-placed: nothing committed is
        // overwritten). No-op when nothing is pending.
        // A special file's object has the pool's placement too.
        let in_place = i.kind != Kind::Dir;
        if newest.is_some() && in_place {
            self.pool.flush()?;
        }
        self.room(3, bytes.len() as u64)?;
        self.before_change(ns, i)?;
        if i.object == 0 {
            // A directory's object is append-placed as its entries are,
            // and starts with its (empty) entries: an object is read as a
            // directory from its first byte.
            let place = (i.kind == Kind::Dir).then_some(PlacementKind::Append);
            let entries = if i.kind == Kind::Dir { Some(self.dir_ref(ns, i)?.encode()) } else { None };
            i.object = self.pool.create_object(self.id, crate::OBJECT_SIZE, place)?;
            if let Some(b) = entries {
                self.pool.write(i.object, 0, &b, false)?;
                i.size = b.len() as u64;
            }
        }
        let slot = newest.map_or(0, |s| 1 - s);
        if in_place && newest.is_some() {
            // Unmapped first, the slot's blocks are written anew: the set
            // shows only with the commit that saves the inode, never
            // before it (a write in place would show at once, and a crash
            // before the commit would pair it with the old inode: an
            // access list with the mode of the change before it).
            self.pool.write_zeroes(i.object, slot_offset(slot), SLOT, false, false)?;
        }
        self.pool.write(i.object, slot_offset(slot), bytes, false)?;
        i.ctime = now();
        self.save(ns, i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Map {
        let mut m = Map::new();
        m.insert(b"user.a".to_vec(), b"1".to_vec());
        m.insert(b"user.bb".to_vec(), Vec::new());
        m
    }

    /// FORMAT.md *Extended attributes*, byte for byte.
    #[test]
    fn golden_slot() {
        let b = encode(7, &sample());
        let mut want = Vec::new();
        want.extend_from_slice(b"TFSX\x01\x00\x00\x00");
        want.extend_from_slice(&7u64.to_le_bytes());
        want.extend_from_slice(&2u32.to_le_bytes());
        want.extend_from_slice(&24u32.to_le_bytes());
        want.extend_from_slice(&[0; 4]);
        want.extend_from_slice(b"\x06\x01\x00\x00\x00user.a1");
        want.extend_from_slice(b"\x07\x00\x00\x00\x00user.bb");
        let crc = crc32c(&want);
        want[24..28].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(b, want);
        assert_eq!(decode(&b).unwrap(), Some((7, sample())));
        assert_eq!(decode(&[0; 64]).unwrap(), None);
    }

    /// Every byte flipped: an error, never a panic or a different set.
    #[test]
    fn every_flipped_byte_is_refused() {
        let b = encode(3, &sample());
        for at in 0..b.len() {
            let mut c = b.clone();
            c[at] ^= 0x40;
            assert!(decode(&c).is_err(), "byte {at}");
        }
        for cut in 0..b.len() {
            assert!(decode(&b[..cut]).map_or(true, |s| s.is_none()), "cut at {cut}");
        }
    }

    #[test]
    fn names_kept_and_refused() {
        assert!(check_name(b"user.x").is_ok());
        for bad in [&b"user."[..], b"trusted.x", b"security.selinux", b"user.tarn.snapshot", b"user.a\0b"] {
            assert!(matches!(check_name(bad), Err(FsError::NotSupported)), "{bad:?}");
        }
        let long = [b"user.".to_vec(), vec![b'n'; 251]].concat();
        assert!(matches!(check_name(&long), Err(FsError::XattrRange(_))));
        assert!(check_name(&long[..255]).is_ok());
    }
}
