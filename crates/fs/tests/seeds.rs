//! The fuzz seeds of `fs_records` (fuzz/seeds/fs_records) were written by
//! a Python encoder from docs/FORMAT.md *File volumes*, not by these
//! encoders: decoding them pins the documented layout.

use tarn_fs::history::vrecord::{VersionRecord, LEN};
use tarn_fs::namespace::dir::Dir;
use tarn_fs::namespace::dirblock::encode_whole;
use tarn_fs::namespace::inode::{Header, Inode, RECORD};
use tarn_fs::Kind;

fn seed(name: &str) -> Vec<u8> {
    let path = format!("{}/../../fuzz/seeds/fs_records/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn record(name: &str) -> [u8; RECORD] {
    seed(name).try_into().expect("a 256-byte record")
}

#[test]
fn documented_bytes_decode_to_the_documented_values() {
    let i = Inode::decode(&record("inode7"), 7).unwrap().expect("an inode");
    assert_eq!((i.kind, i.perm, i.uid, i.gid, i.nlink, i.size), (Kind::File, 0o644, 1000, 100, 1, 5));
    assert_eq!((i.atime, i.mtime, i.ctime, i.object, i.epoch), (1, 2, 3, 9, 0));
    assert_eq!(i.encode(), record("inode7"), "the encoder writes the documented bytes");
    let h = Header::decode(&record("header")).unwrap();
    assert_eq!((h.next_ino, h.quota, h.epoch), (9, 0, 0));
    // The whole format of version 1 (an older tarn's directories) and
    // the same directory in two directory blocks (FS_DIR_BLOCKS).
    for name in ["dir3", "dirblocks2"] {
        let d = Dir::decode(&seed(name), 1).unwrap();
        let names: Vec<(u64, u64, &[u8])> = d.iter().map(|e| (e.cookie, e.ino, &e.name[..])).collect();
        assert_eq!(names, [(3, 5, &b"a"[..]), (4, 6, b"sub"), (6, 7, b"link")], "{name}");
        assert_eq!(d.next_cookie(), 7, "{name}");
    }
    let d = Dir::decode(&seed("dirblocks2"), 1).unwrap();
    assert_eq!(d.encode(), seed("dirblocks2"), "the encoder writes the documented bytes");
    let old = Dir::decode(&seed("dir3"), 1).unwrap();
    let whole: Vec<_> = old.iter().cloned().collect();
    assert_eq!(encode_whole(7, &whole), seed("dir3"), "and the version 1 encoder (tests' older pools) too");
    let b: [u8; LEN] = seed("vrecord5").try_into().expect("a 64-byte version record");
    let r = VersionRecord::decode(&b, 0).unwrap().expect("a version record");
    assert_eq!((r.number, r.ino, r.object, r.size, r.perm, r.uid, r.gid), (5, 7, 12, 4096, 0o640, 1000, 100));
    assert_eq!((r.mtime, r.ctime, r.created), (2000, 3000, 1_700_000_000));
    assert_eq!(r.encode(), b, "the encoder writes the documented bytes");
}
