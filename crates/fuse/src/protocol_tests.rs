//! The protocol layer against bytes written out by hand from
//! include/uapi/linux/fuse.h, and the decoder against random and
//! truncated frames.

use crate::abi::{init, op, ring, IN_HEADER};
use crate::decode::{dev_request, header, ring_request, Malformed, Op};
use crate::reply::{self, Attr, Entry, InitOut, Reply};
use std::time::Duration;

/// A fuse_in_header of `len` bytes in all.
fn in_header(len: u32, opcode: u32, unique: u64, nodeid: u64) -> Vec<u8> {
    let mut h = Vec::new();
    h.extend_from_slice(&len.to_le_bytes());
    h.extend_from_slice(&opcode.to_le_bytes());
    h.extend_from_slice(&unique.to_le_bytes());
    h.extend_from_slice(&nodeid.to_le_bytes());
    h.extend_from_slice(&1000u32.to_le_bytes()); // uid
    h.extend_from_slice(&1001u32.to_le_bytes()); // gid
    h.extend_from_slice(&4242u32.to_le_bytes()); // pid
    h.extend_from_slice(&[0; 4]); // total_extlen, padding
    h
}

/// fuse_write_in of a 5-byte write at offset 8192 with KILL_SUIDGID.
fn write_in() -> Vec<u8> {
    let mut w = Vec::new();
    w.extend_from_slice(&7u64.to_le_bytes()); // fh
    w.extend_from_slice(&8192u64.to_le_bytes()); // offset
    w.extend_from_slice(&5u32.to_le_bytes()); // size
    w.extend_from_slice(&4u32.to_le_bytes()); // write_flags
    w.extend_from_slice(&[0; 16]); // lock_owner, flags, padding
    w
}

#[test]
fn write_request_decodes_alike_from_both_transports() {
    let body: Vec<u8> = [write_in(), b"hello".to_vec()].concat();
    let mut frame = in_header((IN_HEADER + body.len()) as u32, op::WRITE, 99, 12);
    frame.extend_from_slice(&body);
    let want = Op::Write { offset: 8192, write_flags: 4, data: b"hello" };
    let (h, got) = dev_request(&frame, false).expect("a whole WRITE");
    assert_eq!((h.unique, h.nodeid, h.uid, h.gid, h.pid), (99, 12, 1000, 1001, 4242));
    assert_eq!(got, want);

    // The ring: the header in in_out, fuse_write_in in op_in, the data in the payload.
    let mut headers = vec![0u8; ring::HEADER_SIZE];
    headers[..IN_HEADER].copy_from_slice(&frame[..IN_HEADER]);
    headers[ring::OP_IN..ring::OP_IN + 40].copy_from_slice(&write_in());
    let (rh, rgot) = ring_request(&headers, b"hello").expect("a whole ring WRITE");
    assert_eq!(rh, h);
    assert_eq!(rgot, want);
}

#[test]
fn ring_lookup_has_its_name_in_the_payload() {
    let mut headers = vec![0u8; ring::HEADER_SIZE];
    headers[..IN_HEADER].copy_from_slice(&in_header(IN_HEADER as u32 + 4, op::LOOKUP, 5, 1));
    let (_, got) = ring_request(&headers, b"foo\0").expect("a LOOKUP");
    assert_eq!(got, Op::Lookup { name: b"foo" });
    // A length that leaves less than the payload is malformed.
    assert_eq!(ring_request(&headers, b"foobar\0").err(), Some(Malformed));
}

/// fuse_mknod_in: mode, rdev, umask, padding, then the name.
#[test]
fn mknod_carries_the_device_number() {
    let mut body = Vec::new();
    for v in [libc::S_IFCHR | 0o640, 0x0103, 0o022, 0] {
        body.extend_from_slice(&v.to_le_bytes());
    }
    body.extend_from_slice(b"null\0");
    let mut frame = in_header((IN_HEADER + body.len()) as u32, op::MKNOD, 3, 1);
    frame.extend_from_slice(&body);
    let (_, got) = dev_request(&frame, false).expect("a whole MKNOD");
    assert_eq!(got, Op::Mknod { mode: libc::S_IFCHR | 0o640, rdev: 0x0103, umask: 0o022, name: b"null" });
}

#[test]
fn a_write_shorter_than_its_size_is_malformed() {
    let body: Vec<u8> = [write_in(), b"hel".to_vec()].concat();
    let mut frame = in_header((IN_HEADER + body.len()) as u32, op::WRITE, 1, 1);
    frame.extend_from_slice(&body);
    assert_eq!(dev_request(&frame, false).err(), Some(Malformed));
}

#[test]
fn init_with_flags2_and_its_reply_bytes() {
    let mut body = Vec::new();
    for v in [7u32, 45, 131072] {
        body.extend_from_slice(&v.to_le_bytes());
    }
    let offered = init::ASYNC_READ | init::INIT_EXT | init::WRITEBACK_CACHE | init::OVER_IO_URING;
    body.extend_from_slice(&(offered as u32).to_le_bytes());
    body.extend_from_slice(&((offered >> 32) as u32).to_le_bytes());
    body.extend_from_slice(&[0; 44]);
    let mut frame = in_header((IN_HEADER + body.len()) as u32, op::INIT, 1, 0);
    frame.extend_from_slice(&body);
    let (_, got) = dev_request(&frame, false).expect("an INIT");
    assert_eq!(got, Op::Init { major: 7, minor: 45, max_readahead: 131072, flags: offered });

    let out = InitOut {
        minor: 42,
        max_readahead: 131072,
        flags: init::ASYNC_READ | init::INIT_EXT | init::OVER_IO_URING,
        max_background: 16,
        congestion_threshold: 12,
        max_write: 1 << 20,
        max_pages: 256,
    };
    let mut bytes = Vec::new();
    assert_eq!(Reply::Init(out).encode(&mut bytes), 0);
    let want: Vec<u8> = [
        &7u32.to_le_bytes()[..],
        &42u32.to_le_bytes(),
        &131072u32.to_le_bytes(),
        &0x4000_0001u32.to_le_bytes(), // ASYNC_READ | INIT_EXT
        &16u16.to_le_bytes(),
        &12u16.to_le_bytes(),
        &(1u32 << 20).to_le_bytes(),
        &1u32.to_le_bytes(), // time_gran
        &256u16.to_le_bytes(),
        &0u16.to_le_bytes(),
        &0x200u32.to_le_bytes(), // flags2: bit 41 - 32
        &[0; 28],
    ]
    .concat();
    assert_eq!(bytes, want);
    assert_eq!(bytes.len(), 64);
}

#[test]
fn entry_reply_bytes() {
    let attr = Attr {
        ino: 42,
        size: 5,
        blocks: 8,
        atime: 1_500_000_000,
        mtime: -1,
        ctime: 3_000_000_007,
        mode: libc::S_IFCHR | 0o644,
        nlink: 1,
        uid: 1000,
        gid: 1001,
        rdev: 0x0103,
        blksize: 4096,
    };
    let e = Entry { attr, generation: 3, entry_ttl: Duration::from_millis(1500), attr_ttl: Duration::from_secs(30) };
    let mut bytes = Vec::new();
    assert_eq!(Reply::Entry(e).encode(&mut bytes), 0);
    let mut want = Vec::new();
    for v in [42u64, 3, 1, 30] {
        want.extend_from_slice(&v.to_le_bytes());
    }
    want.extend_from_slice(&500_000_000u32.to_le_bytes());
    want.extend_from_slice(&0u32.to_le_bytes());
    // fuse_attr: ino size blocks atime mtime ctime (s), then the u32s.
    for v in [42u64, 5, 8, 1, u64::MAX, 3] {
        want.extend_from_slice(&v.to_le_bytes());
    }
    // ... mode nlink uid gid rdev blksize flags.
    for v in [500_000_000u32, 999_999_999, 7, libc::S_IFCHR | 0o644, 1, 1000, 1001, 0x0103, 4096, 0] {
        want.extend_from_slice(&v.to_le_bytes());
    }
    assert_eq!(bytes, want);
    assert_eq!(bytes.len(), 128);
    assert_eq!(reply::out_header(9, 0, bytes.len()), {
        let mut h = [0u8; 16];
        h[..4].copy_from_slice(&144u32.to_le_bytes());
        h[8..].copy_from_slice(&9u64.to_le_bytes());
        h
    });
}

#[test]
fn an_error_reply_is_a_negative_errno_and_no_bytes() {
    let mut bytes = Vec::new();
    assert_eq!(Reply::Error(libc::ENOENT).encode(&mut bytes), -libc::ENOENT);
    assert!(bytes.is_empty());
}

#[test]
fn dirents_are_padded_and_bounded() {
    let mut out = Vec::new();
    assert!(reply::add_dirent(&mut out, 64, 5, 1, 8, b"abc"));
    assert_eq!(out.len(), 32);
    assert_eq!(&out[24..27], b"abc");
    assert!(!reply::add_dirent(&mut out, 64, 6, 2, 8, b"a-longer-name"), "40 more bytes do not fit in 64");
    assert_eq!(out.len(), 32);
}

/// xorshift64*: a fixed-seed source of test frames.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

#[test]
fn random_and_truncated_frames_never_panic() {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut decoded = 0;
    for round in 0..20_000 {
        let len = (next(&mut s) % 400) as usize;
        let mut frame: Vec<u8> = (0..len).map(|_| next(&mut s) as u8).collect();
        // Most frames get a plausible header, so the op decoders run.
        if len >= IN_HEADER && round % 4 != 0 {
            let claimed = if round % 3 == 0 { len as u32 } else { next(&mut s) as u32 % 500 };
            frame[..IN_HEADER].copy_from_slice(&in_header(claimed, (next(&mut s) % 52) as u32, 1, 1));
        }
        decoded += dev_request(&frame, false).is_ok() as u32;
        let split = (next(&mut s) as usize) % (len + 1);
        let (a, b) = frame.split_at(split);
        let mut headers = a.to_vec();
        headers.resize(ring::HEADER_SIZE, 0);
        decoded += ring_request(&headers, b).is_ok() as u32;
        let _ = header(&frame);
    }
    assert!(decoded > 0, "some random frames are whole requests");
}

/// fuse_setxattr_in: 8 bytes, or 16 with FUSE_SETXATTR_EXT (settled at
/// INIT: /dev/fuse is told, the ring's op_in length says it).
#[test]
fn setxattr_in_both_forms() {
    let want =
        |setxattr_flags| Op::Setxattr { flags: 1, setxattr_flags, name: b"system.posix_acl_access", value: b"ab" };
    for (ext, fixed) in [(false, vec![2u32, 1]), (true, vec![2, 1, 1, 0])] {
        let fixed: Vec<u8> = fixed.iter().flat_map(|v| v.to_le_bytes()).collect();
        let payload = b"system.posix_acl_access\0ab";
        let len = (IN_HEADER + fixed.len() + payload.len()) as u32;
        let mut frame = in_header(len, op::SETXATTR, 7, 3);
        frame.extend_from_slice(&fixed);
        frame.extend_from_slice(payload);
        let (_, got) = dev_request(&frame, ext).expect("a whole SETXATTR");
        assert_eq!(got, want(u32::from(ext)));
        let mut headers = vec![0u8; ring::HEADER_SIZE];
        headers[..IN_HEADER].copy_from_slice(&frame[..IN_HEADER]);
        headers[ring::OP_IN..ring::OP_IN + fixed.len()].copy_from_slice(&fixed);
        let (_, rgot) = ring_request(&headers, payload).expect("a whole ring SETXATTR");
        assert_eq!(rgot, want(u32::from(ext)));
    }
}
