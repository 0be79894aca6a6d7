//! POSIX access control lists (FS_POSIX_ACLS; docs/FORMAT.md *File
//! volumes*, access control lists): the list codec (Linux's xattr form,
//! `posix_acl_xattr.h`) and the three rules that keep a list and the
//! mode bits one thing (Linux's `posix_acl_equiv_mode`,
//! `posix_acl_create_masq`, `posix_acl_chmod_masq`). The kernel checks
//! permissions against the lists itself (the mount asks FUSE_POSIX_ACL);
//! this layer stores them, keeps the mode in step when one is set or the
//! mode changes, and hands a directory's default list to what is made in
//! it. Storage is the inode's extended attribute set (`xattr.rs`).

use crate::error::{FsError, Result};

/// The access list's attribute name.
pub const ACCESS: &[u8] = b"system.posix_acl_access";
/// A directory's default list (what is made in it inherits).
pub const DEFAULT: &[u8] = b"system.posix_acl_default";
/// Inode byte 6 bits: the inode has an access list, a default list.
pub const HAS_ACCESS: u8 = 1;
pub const HAS_DEFAULT: u8 = 2;

const XATTR_VERSION: u32 = 2;
const ENTRY: usize = 8;
/// Most entries: what fits the page the FUSE kernel module carries a
/// list in ((4096 - 4) / 8).
pub const MAX_ENTRIES: usize = 511;
/// The id of entries that name no one (ACL_UNDEFINED_ID).
const NO_ID: u32 = u32::MAX;

/// Entry tags, in the order a valid list has them.
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

/// Which of an inode's two lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AclKind {
    Access,
    Default,
}

impl AclKind {
    /// The list an attribute name is (None: not a list's name).
    pub fn of_name(name: &[u8]) -> Option<AclKind> {
        match name {
            ACCESS => Some(AclKind::Access),
            DEFAULT => Some(AclKind::Default),
            _ => None,
        }
    }

    pub fn name(self) -> &'static [u8] {
        match self {
            AclKind::Access => ACCESS,
            AclKind::Default => DEFAULT,
        }
    }

    /// Its inode byte 6 bit.
    pub fn flag(self) -> u8 {
        match self {
            AclKind::Access => HAS_ACCESS,
            AclKind::Default => HAS_DEFAULT,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    tag: u16,
    perm: u16,
    id: u32,
}

/// A valid list (checked at decode, so every method may rely on exactly
/// one USER_OBJ, GROUP_OBJ and OTHER, in order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

/// Where a list entry may follow (Linux's `posix_acl_valid` states).
#[derive(Clone, Copy, PartialEq)]
enum State {
    Start,
    Users,
    Groups,
    Other,
    Done,
}

fn invalid(what: &'static str) -> FsError {
    FsError::Invalid(what)
}

impl Acl {
    /// The xattr form: `a_version u32 = 2`, then entries of `e_tag u16`,
    /// `e_perm u16` (rwx bits), `e_id u32` (a uid or gid for named
    /// entries, 0xffffffff for the others), little-endian.
    pub fn decode(b: &[u8]) -> Result<Acl> {
        if b.len() < 4 || !(b.len() - 4).is_multiple_of(ENTRY) || (b.len() - 4) / ENTRY > MAX_ENTRIES {
            return Err(invalid("an access control list's length"));
        }
        if u32::from_le_bytes([b[0], b[1], b[2], b[3]]) != XATTR_VERSION {
            return Err(invalid("an access control list's version"));
        }
        let entries = b[4..]
            .chunks_exact(ENTRY)
            .map(|e| Entry {
                tag: u16::from_le_bytes([e[0], e[1]]),
                perm: u16::from_le_bytes([e[2], e[3]]),
                id: u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
            })
            .collect();
        let acl = Acl { entries };
        acl.check()?;
        Ok(acl)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = XATTR_VERSION.to_le_bytes().to_vec();
        for e in &self.entries {
            b.extend_from_slice(&e.tag.to_le_bytes());
            b.extend_from_slice(&e.perm.to_le_bytes());
            b.extend_from_slice(&e.id.to_le_bytes());
        }
        b
    }

    /// The kernel's rules: tags in order (owner, named users, owning
    /// group, named groups, mask, other), one of each unnamed entry, a
    /// mask when anyone is named, rwx bits only.
    fn check(&self) -> Result<()> {
        let mut state = State::Start;
        let mut named = false;
        for e in &self.entries {
            if e.perm & !7 != 0 || ((e.tag == USER || e.tag == GROUP) != (e.id != NO_ID)) {
                return Err(invalid("an access control list entry's permissions or id"));
            }
            state = match (e.tag, state) {
                (USER_OBJ, State::Start) => State::Users,
                (USER, State::Users) | (GROUP, State::Groups) => {
                    named = true;
                    state
                }
                (GROUP_OBJ, State::Users) => State::Groups,
                (MASK, State::Groups) => State::Other,
                (OTHER, State::Other) => State::Done,
                (OTHER, State::Groups) if !named => State::Done,
                _ => return Err(invalid("an access control list's entries or their order")),
            };
        }
        if state != State::Done {
            return Err(invalid("an access control list without owner, group or other"));
        }
        Ok(())
    }

    fn find(&self, tag: u16) -> Option<usize> {
        self.entries.iter().position(|e| e.tag == tag)
    }

    /// The index of the entry the group bits of the mode stand for: the
    /// mask when there is one, else the owning group.
    fn group_class(&self) -> usize {
        self.find(MASK).or_else(|| self.find(GROUP_OBJ)).unwrap_or(0)
    }

    /// The rwx bits (0o777) this list gives the mode, and whether the
    /// mode says all of it (then the list need not be kept).
    pub fn equiv_mode(&self) -> (u32, bool) {
        let perm = |tag| self.find(tag).map_or(0, |k| u32::from(self.entries[k].perm));
        let group = u32::from(self.entries[self.group_class()].perm);
        let equiv = self.entries.len() == 3;
        (perm(USER_OBJ) << 6 | group << 3 | perm(OTHER), equiv)
    }

    /// A new inode of mode `perm` under this default list: the list is
    /// narrowed to what `perm` allows and `perm`'s rwx bits to what the
    /// list allows. Returns the new permission bits (set-ID bits kept)
    /// and whether the list is the mode alone.
    pub fn create_masq(&mut self, perm: u32) -> (u32, bool) {
        let mut perm = perm;
        for (tag, shift) in [(USER_OBJ, 6), (OTHER, 0)] {
            if let Some(k) = self.find(tag) {
                self.entries[k].perm &= ((perm >> shift) & 7) as u16;
                perm &= !(0o7 << shift) | (u32::from(self.entries[k].perm) << shift);
            }
        }
        let g = self.group_class();
        self.entries[g].perm &= ((perm >> 3) & 7) as u16;
        perm &= !0o070 | (u32::from(self.entries[g].perm) << 3);
        (perm, self.entries.len() == 3)
    }

    /// chmod to `perm`: the owner, group class and other entries take
    /// the mode's rwx bits; named entries stay (the mask bounds them).
    pub fn chmod(&mut self, perm: u32) {
        for (k, shift) in [(self.find(USER_OBJ), 6), (Some(self.group_class()), 3), (self.find(OTHER), 0)] {
            if let Some(k) = k {
                self.entries[k].perm = ((perm >> shift) & 7) as u16;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut b = 2u32.to_le_bytes().to_vec();
        for &(tag, perm, id) in entries {
            b.extend_from_slice(&tag.to_le_bytes());
            b.extend_from_slice(&perm.to_le_bytes());
            b.extend_from_slice(&id.to_le_bytes());
        }
        b
    }

    /// `user::rw- user:1000:r-x group::r-- mask::rwx other::---`.
    fn named() -> Vec<u8> {
        acl(&[(USER_OBJ, 6, NO_ID), (USER, 5, 1000), (GROUP_OBJ, 4, NO_ID), (MASK, 7, NO_ID), (OTHER, 0, NO_ID)])
    }

    /// The bytes Linux's `posix_acl_to_xattr` writes, read and written back.
    #[test]
    fn golden_round_trip() {
        let b = named();
        assert_eq!(&b[..12], &[2, 0, 0, 0, 1, 0, 6, 0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(&b[12..20], &[2, 0, 5, 0, 0xe8, 3, 0, 0]);
        assert_eq!(Acl::decode(&b).unwrap().encode(), b);
    }

    #[test]
    fn invalid_lists_are_refused() {
        let minimal = [(USER_OBJ, 6, NO_ID), (GROUP_OBJ, 4, NO_ID), (OTHER, 4, NO_ID)];
        assert!(Acl::decode(&acl(&minimal)).is_ok());
        let bad: [&[(u16, u16, u32)]; 8] = [
            // no mask with a named user
            &[(USER_OBJ, 6, NO_ID), (USER, 5, 7), (GROUP_OBJ, 4, NO_ID), (OTHER, 0, NO_ID)],
            // out of order
            &[(GROUP_OBJ, 4, NO_ID), (USER_OBJ, 6, NO_ID), (OTHER, 0, NO_ID)],
            // no other
            &[(USER_OBJ, 6, NO_ID), (GROUP_OBJ, 4, NO_ID)],
            // two owners
            &[(USER_OBJ, 6, NO_ID), (USER_OBJ, 6, NO_ID), (GROUP_OBJ, 4, NO_ID), (OTHER, 0, NO_ID)],
            // a permission bit past rwx
            &[(USER_OBJ, 8, NO_ID), (GROUP_OBJ, 4, NO_ID), (OTHER, 0, NO_ID)],
            // a named user without an id, an unnamed entry with one
            &[(USER_OBJ, 6, NO_ID), (USER, 5, NO_ID), (GROUP_OBJ, 4, NO_ID), (MASK, 7, NO_ID), (OTHER, 0, NO_ID)],
            &[(USER_OBJ, 6, 0), (GROUP_OBJ, 4, NO_ID), (OTHER, 0, NO_ID)],
            // an unknown tag
            &[(USER_OBJ, 6, NO_ID), (GROUP_OBJ, 4, NO_ID), (0x40, 0, NO_ID), (OTHER, 0, NO_ID)],
        ];
        for (k, entries) in bad.iter().enumerate() {
            assert!(Acl::decode(&acl(entries)).is_err(), "list {k}");
        }
        let good = named();
        assert!(Acl::decode(&good[..good.len() - 1]).is_err(), "a cut entry");
        let mut v1 = good.clone();
        v1[0] = 1;
        assert!(Acl::decode(&v1).is_err(), "version 1");
        assert!(Acl::decode(&[]).is_err());
        let many: Vec<_> = std::iter::once((USER_OBJ, 6, NO_ID))
            .chain((0..MAX_ENTRIES as u32 - 3).map(|id| (USER, 4, id)))
            .chain([(GROUP_OBJ, 4, NO_ID), (MASK, 7, NO_ID), (OTHER, 0, NO_ID)])
            .collect();
        assert!(Acl::decode(&acl(&many[..MAX_ENTRIES - 1])).is_err(), "cut before other");
        let most: Vec<_> = many[..MAX_ENTRIES - 3].iter().chain(&many[many.len() - 3..]).copied().collect();
        assert_eq!(most.len(), MAX_ENTRIES);
        assert!(Acl::decode(&acl(&most)).is_ok());
        assert!(Acl::decode(&acl(&many)).is_err(), "{} entries", many.len());
    }

    /// The mode a list gives: the group bits are the mask's when there is one.
    #[test]
    fn equivalent_mode() {
        assert_eq!(Acl::decode(&named()).unwrap().equiv_mode(), (0o670, false));
        let minimal = acl(&[(USER_OBJ, 7, NO_ID), (GROUP_OBJ, 5, NO_ID), (OTHER, 1, NO_ID)]);
        assert_eq!(Acl::decode(&minimal).unwrap().equiv_mode(), (0o751, true));
    }

    /// Linux's posix_acl_create_masq: a file made 0666 under the default
    /// list above gets rw-, the mask narrowed to rw-, other none.
    #[test]
    fn create_narrows_both() {
        let mut a = Acl::decode(&named()).unwrap();
        assert_eq!(a.create_masq(0o666), (0o660, false));
        let want =
            acl(&[(USER_OBJ, 6, NO_ID), (USER, 5, 1000), (GROUP_OBJ, 4, NO_ID), (MASK, 6, NO_ID), (OTHER, 0, NO_ID)]);
        assert_eq!(a.encode(), want);
        let mut minimal = Acl::decode(&acl(&[(USER_OBJ, 7, NO_ID), (GROUP_OBJ, 5, NO_ID), (OTHER, 5, NO_ID)])).unwrap();
        assert_eq!(minimal.create_masq(0o2775), (0o2755, true));
    }

    /// Linux's posix_acl_chmod_masq: the mask (not the owning group)
    /// takes the group bits; named entries stay.
    #[test]
    fn chmod_moves_the_mask() {
        let mut a = Acl::decode(&named()).unwrap();
        a.chmod(0o704);
        let want =
            acl(&[(USER_OBJ, 7, NO_ID), (USER, 5, 1000), (GROUP_OBJ, 4, NO_ID), (MASK, 0, NO_ID), (OTHER, 4, NO_ID)]);
        assert_eq!(a.encode(), want);
        assert_eq!(a.equiv_mode(), (0o704, false));
    }
}
