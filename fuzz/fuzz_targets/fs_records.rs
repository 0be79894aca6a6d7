//! tarn-fs's on-disk records on arbitrary bytes: the first 256 bytes as
//! an inode record and as the volume header, the first 64 as a close
//! version record, the whole input as a directory object. Damage is an error, never a panic; what decodes
//! round-trips.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tarn_fs::namespace::dir::Dir;
use tarn_fs::namespace::inode::{Header, Inode, RECORD};
use tarn_fs::history::vrecord::{VersionRecord, LEN};

fuzz_target!(|data: &[u8]| {
    if data.len() >= RECORD {
        let mut b = [0u8; RECORD];
        b.copy_from_slice(&data[..RECORD]);
        let ino = u64::from(data[0]) + 1;
        if let Ok(Some(i)) = Inode::decode(&b, ino) {
            assert_eq!(Inode::decode(&i.encode(), ino).ok().flatten().as_ref(), Some(&i));
        }
        if let Ok(h) = Header::decode(&b) {
            assert_eq!(Header::decode(&h.encode()).ok().as_ref(), Some(&h));
        }
    }
    if data.len() >= LEN {
        let mut b = [0u8; LEN];
        b.copy_from_slice(&data[..LEN]);
        if let Ok(Some(r)) = VersionRecord::decode(&b, 0) {
            assert_eq!(VersionRecord::decode(&r.encode(), 0).ok().flatten().as_ref(), Some(&r));
        }
    }
    if let Ok(d) = Dir::decode(data, 1) {
        assert_eq!(Dir::decode(&d.encode(), 1).ok().as_ref(), Some(&d));
    }
});
