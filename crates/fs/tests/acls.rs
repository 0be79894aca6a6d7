//! POSIX access control lists on a real engine pool (the sim device):
//! the mode follows a list, chmod follows into the list, a default list
//! is inherited and the umask is not applied under it, and a power cut
//! anywhere in a run of list changes leaves each inode's mode and list
//! from the same change (never the mode of one and the list of another).

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tarn_fs::{AclKind, FileVolume, Kind, NewMode, SetAttr, ROOT};

mod common;
use common::{close_and_reopen, crash_and_reopen, file, fresh};

const NO_ID: u32 = u32::MAX;

/// The xattr form of `entries` (tag, perm, id).
fn list(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut b = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        b.extend_from_slice(&tag.to_le_bytes());
        b.extend_from_slice(&perm.to_le_bytes());
        b.extend_from_slice(&id.to_le_bytes());
    }
    b
}

/// `user::rwx user:ID:r-x group::r-- mask::MASK other::---`.
fn named(id: u32, mask: u16) -> Vec<u8> {
    list(&[(1, 7, NO_ID), (2, 5, id), (4, 4, NO_ID), (0x10, mask, NO_ID), (0x20, 0, NO_ID)])
}

fn perm(fv: &FileVolume, ino: u64) -> u32 {
    fv.getattr(ino).unwrap().inode.perm
}

#[test]
fn mode_and_list_follow_each_other() {
    let (_sim, _pool, fv) = fresh();
    let f = file(&fv, ROOT, "f");
    fv.set_acl(f, AclKind::Access, &named(1000, 6), false).unwrap();
    assert_eq!(perm(&fv, f), 0o760, "group bits are the mask's");
    assert_eq!(fv.get_xattr(f, b"system.posix_acl_access").unwrap(), named(1000, 6));
    fv.setattr(f, &SetAttr { perm: Some(0o705), ..Default::default() }).unwrap();
    assert_eq!(
        fv.get_xattr(f, b"system.posix_acl_access").unwrap(),
        list(&[(1, 7, NO_ID), (2, 5, 1000), (4, 4, NO_ID), (0x10, 0, NO_ID), (0x20, 5, NO_ID)])
    );
    // A list the mode says all of is not kept.
    fv.set_acl(f, AclKind::Access, &list(&[(1, 6, NO_ID), (4, 4, NO_ID), (0x20, 0, NO_ID)]), false).unwrap();
    assert_eq!(perm(&fv, f), 0o640);
    assert!(fv.get_xattr(f, b"system.posix_acl_access").is_err());
    assert!(fv.list_xattrs(f).unwrap().is_empty());
    // Invalid: refused, nothing changed.
    assert!(fv
        .set_acl(f, AclKind::Access, &list(&[(1, 6, NO_ID), (2, 5, 7), (4, 4, NO_ID), (0x20, 0, NO_ID)]), false)
        .is_err());
    assert!(fv.set_acl(f, AclKind::Default, &named(1, 7), false).is_err(), "a default list on a file");
    assert_eq!(perm(&fv, f), 0o640);
    // Set-group-ID cleared when the kernel says so.
    fv.setattr(f, &SetAttr { perm: Some(0o2750), ..Default::default() }).unwrap();
    fv.set_acl(f, AclKind::Access, &named(5, 7), true).unwrap();
    assert_eq!(perm(&fv, f), 0o770);
}

#[test]
fn default_lists_are_inherited_without_the_umask() {
    let (_sim, _pool, fv) = fresh();
    let d = fv.create(ROOT, b"d", Kind::Dir, 0o755, 0, 0).unwrap().inode.ino;
    let with_umask = |perm| NewMode { perm, umask: 0o077 };
    let plain = fv.create(d, b"plain", Kind::File, with_umask(0o666), 0, 0).unwrap().inode;
    assert_eq!(plain.perm, 0o600, "no default list: the umask applies");
    fv.set_acl(d, AclKind::Default, &named(1000, 7), false).unwrap();
    let f = fv.create(d, b"f", Kind::File, with_umask(0o666), 0, 0).unwrap().inode;
    assert_eq!(f.perm, 0o660, "under a default list: no umask, the list narrows");
    assert_eq!(
        fv.get_xattr(f.ino, b"system.posix_acl_access").unwrap(),
        list(&[(1, 6, NO_ID), (2, 5, 1000), (4, 4, NO_ID), (0x10, 6, NO_ID), (0x20, 0, NO_ID)])
    );
    let sub = fv.create(d, b"sub", Kind::Dir, with_umask(0o777), 0, 0).unwrap().inode;
    assert_eq!(sub.perm, 0o770);
    assert_eq!(fv.get_xattr(sub.ino, b"system.posix_acl_default").unwrap(), named(1000, 7));
    let deep = fv.create(sub.ino, b"deep", Kind::File, with_umask(0o644), 0, 0).unwrap().inode;
    assert_eq!(deep.perm, 0o640, "two levels down");
    let fifo = fv.create(d, b"p", Kind::Fifo, with_umask(0o666), 0, 0).unwrap().inode;
    assert_eq!(fifo.perm, 0o660, "a fifo inherits as a file does");
    assert_eq!(
        fv.get_xattr(fifo.ino, b"system.posix_acl_access").unwrap(),
        fv.get_xattr(f.ino, b"system.posix_acl_access").unwrap()
    );
    let link = fv.symlink(d, b"l", b"f", 0, 0).unwrap().inode;
    assert_eq!(link.perm, 0o777);
    fv.remove_acl(d, AclKind::Default).unwrap();
    assert_eq!(fv.create(d, b"after", Kind::File, with_umask(0o666), 0, 0).unwrap().inode.perm, 0o600);
    assert!(fv.check().unwrap().problems.is_empty());
}

/// Each change of a run is a new list with a matching mode; after a
/// power cut the inode's list and mode must be one change's pair.
#[test]
fn a_crash_keeps_mode_and_list_of_one_change() {
    crash_in_list_changes(Kind::File);
}

/// The same on a device node, whose set is in an object of its own.
#[test]
fn a_crash_keeps_mode_and_list_of_one_change_on_a_device_node() {
    crash_in_list_changes(Kind::CharDev);
}

fn crash_in_list_changes(kind: Kind) {
    let mut cut_inside = 0;
    for seed in 0..16u64 {
        let (sim, pool, fv) = fresh();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let f = match kind {
            Kind::File => file(&fv, ROOT, "f"),
            _ => fv.mknod(ROOT, b"f", kind, 0o644, 0x0103, (0, 0)).unwrap().inode.ino,
        };
        if kind == Kind::File {
            fv.write(f, 0, b"data").unwrap();
        }
        fv.set_acl(f, AclKind::Access, &named(100, 7), false).unwrap();
        fv.sync().unwrap();
        sim.crash_after(seed * 2);
        let mut synced = 0u32;
        for k in 1..=6u32 {
            // Alternate a list change and a chmod (which rewrites the list).
            let ok = if k % 2 == 1 {
                fv.set_acl(f, AclKind::Access, &named(100 + k, (k % 8) as u16), false).is_ok()
            } else {
                fv.setattr(f, &SetAttr { perm: Some(0o700 | (k % 8) << 3), ..Default::default() }).is_ok()
            };
            if !(ok && fv.sync().is_ok()) {
                break;
            }
            synced = k;
        }
        cut_inside += u32::from(synced < 6);
        let (pool, fv) = crash_and_reopen(&sim, &mut rng, fv, pool);
        let mode = perm(&fv, f);
        let stored = fv.get_xattr(f, b"system.posix_acl_access").unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let mask = u32::from(stored[4 + 3 * 8 + 2]);
        assert_eq!(
            (mode >> 3) & 7,
            mask,
            "seed {seed}: mode {mode:o} and the list's mask {mask} from different changes"
        );
        assert!(fv.check().unwrap().problems.is_empty(), "seed {seed}");
        assert_eq!(pool.check().problems, Vec::<String>::new(), "seed {seed}");
    }
    assert!(cut_inside > 8, "the cuts fell inside the run {cut_inside} times");
}

/// The checker compares byte 6 with the attribute set both ways: a list
/// byte 6 names that the set lacks, and a list the set holds that byte 6
/// does not name (the kernel, answered from byte 6, would see no list).
/// The damage is a record rewritten with another byte 6 (a valid crc).
#[test]
fn the_checker_compares_byte_6_with_the_set() {
    use tarn_fs::namespace::inode::{Inode, RECORD};
    let (_sim, pool, fv) = fresh();
    let f = file(&fv, ROOT, "f");
    let g = file(&fv, ROOT, "g");
    fv.set_acl(f, AclKind::Access, &named(100, 7), false).unwrap();
    fv.set_xattr(g, b"user.x", b"1", tarn_fs::XattrMode::Any).unwrap();
    fv.sync().unwrap();
    assert_eq!(fv.check().unwrap().problems, Vec::<String>::new());
    drop(fv);
    let id = pool.file_volume("home").unwrap().id;
    let set_byte_6 = |ino: u64, acl: u8| {
        let mut b = [0u8; RECORD];
        pool.read(id, ino * RECORD as u64, &mut b).unwrap();
        let mut i = Inode::decode(&b, ino).unwrap().unwrap();
        i.acl = acl;
        pool.write(id, ino * RECORD as u64, &i.encode(), false).unwrap();
        pool.flush().unwrap();
    };
    set_byte_6(f, 0);
    set_byte_6(g, 1);
    let fv = FileVolume::open(pool.clone(), "home").unwrap();
    let problems = fv.check().unwrap().problems;
    assert_eq!(
        problems,
        vec![
            format!("inode {f}: its set holds system.posix_acl_access but byte 6 does not name it"),
            format!("inode {g}: byte 6 names system.posix_acl_access but its set does not hold it"),
        ]
    );
}

/// Fifos, sockets and device nodes keep lists as files do, in an object
/// made at their first list (FS_SPECIAL_SETS, set then): the mode
/// follows, chmod follows into the list, a volume snapshot keeps the list
/// of its time (also of a node unlinked since), a reopen keeps it, and
/// the object goes with the node (a retired one with the snapshot).
/// `user.*` names stay refused there (EPERM, as Linux), and a symlink
/// takes no list.
#[test]
fn lists_on_fifos_sockets_and_device_nodes() {
    use tarn_format::superblock::incompat::FS_SPECIAL_SETS;
    let (sim, pool, fv) = fresh();
    let name = b"system.posix_acl_access";
    let mut nodes = Vec::new();
    for (k, kind) in [Kind::Fifo, Kind::Socket, Kind::CharDev, Kind::BlockDev].into_iter().enumerate() {
        let rdev = if matches!(kind, Kind::CharDev | Kind::BlockDev) { 0x0801 } else { 0 };
        let n = fv.mknod(ROOT, format!("n{k}").as_bytes(), kind, 0o644, rdev, (0, 0)).unwrap().inode.ino;
        assert!(k > 0 || !pool.has_feature(FS_SPECIAL_SETS), "set before any list");
        fv.set_acl(n, AclKind::Access, &named(100 + k as u32, 6), false).unwrap();
        assert!(pool.has_feature(FS_SPECIAL_SETS));
        assert_eq!(perm(&fv, n), 0o760, "{kind:?}: the mode's group bits are the mask's");
        assert_eq!(fv.get_xattr(n, name).unwrap(), named(100 + k as u32, 6));
        assert!(fv.set_xattr(n, b"user.x", b"1", tarn_fs::XattrMode::Any).is_err(), "{kind:?}: user.*");
        nodes.push(n);
    }
    // A list the mode says all of is not kept: no object for nothing.
    let plain = fv.mknod(ROOT, b"plain", Kind::Fifo, 0o600, 0, (0, 0)).unwrap().inode.ino;
    fv.set_acl(plain, AclKind::Access, &list(&[(1, 7, NO_ID), (4, 0, NO_ID), (0x20, 0, NO_ID)]), false).unwrap();
    let i = fv.getattr(plain).unwrap().inode;
    assert_eq!((i.perm, i.object, i.acl), (0o700, 0, 0), "the mode alone");
    let link = fv.symlink(ROOT, b"l", b"n0", 0, 0).unwrap().inode.ino;
    assert!(matches!(fv.set_acl(link, AclKind::Access, &named(1, 7), false), Err(tarn_fs::FsError::NotSupported)));
    fv.snap_create("s").unwrap();
    fv.setattr(nodes[2], &SetAttr { perm: Some(0o640), ..Default::default() }).unwrap();
    let after_chmod = list(&[(1, 6, NO_ID), (2, 5, 102), (4, 4, NO_ID), (0x10, 4, NO_ID), (0x20, 0, NO_ID)]);
    assert_eq!(fv.get_xattr(nodes[2], name).unwrap(), after_chmod, "chmod follows into the list");
    fv.sync().unwrap();
    let (pool, fv) = close_and_reopen(&sim, fv, pool);
    assert_eq!(fv.get_xattr(nodes[2], name).unwrap(), after_chmod, "after a reopen");
    assert_eq!(fv.get_xattr(nodes[3], name).unwrap(), named(103, 6));
    let snap = FileVolume::open_snapshot(pool.clone(), "home", "s").unwrap();
    assert_eq!(snap.get_xattr(nodes[2], name).unwrap(), named(102, 6), "the snapshot keeps the list of its time");
    drop(snap);
    assert_eq!(fv.check().unwrap().problems, Vec::<String>::new());
    let objects = || pool.file_volume("home").unwrap().objects;
    let before = objects();
    fv.unlink(ROOT, b"n0").unwrap();
    assert_eq!(objects(), before, "a node the snapshot saw is retired, its object kept");
    let snap = FileVolume::open_snapshot(pool.clone(), "home", "s").unwrap();
    assert_eq!(snap.get_xattr(nodes[0], name).unwrap(), named(100, 6), "the snapshot still reads it");
    drop(snap);
    fv.snap_delete("s").unwrap();
    assert_eq!(objects(), before - 1, "the snapshot's delete frees the retired node's object");
    for k in 1..4 {
        fv.unlink(ROOT, format!("n{k}").as_bytes()).unwrap();
    }
    fv.sync().unwrap();
    assert_eq!(objects(), before - 4, "nodes no snapshot sees go with their objects");
    assert_eq!(fv.check().unwrap().problems, Vec::<String>::new());
    assert_eq!(pool.check().problems, Vec::<String>::new());
}
