//! Handshake (option haggling) over a real socket.

mod common;

use std::io::{Read, Write};

use common::*;
use tarn_nbd::protocol::*;

#[test]
fn go_with_infos() {
    let t = start();
    let mut c = Client::connect(t.addr);
    let (size, flags, replies) = c.go("mem", &[NBD_INFO_BLOCK_SIZE, NBD_INFO_NAME, NBD_INFO_DESCRIPTION]).unwrap();
    assert_eq!(size, SIZE);
    for bit in [
        NBD_FLAG_HAS_FLAGS,
        NBD_FLAG_SEND_FLUSH,
        NBD_FLAG_SEND_FUA,
        NBD_FLAG_SEND_TRIM,
        NBD_FLAG_SEND_WRITE_ZEROES,
        NBD_FLAG_SEND_FAST_ZERO,
        NBD_FLAG_SEND_CACHE,
        NBD_FLAG_CAN_MULTI_CONN,
    ] {
        assert_ne!(flags & bit, 0, "flag {bit:#x} missing");
    }
    // No structured replies negotiated: no DF; writable: no READ_ONLY.
    assert_eq!(flags & (NBD_FLAG_SEND_DF | NBD_FLAG_READ_ONLY), 0);
    let info = |t: u16| {
        replies
            .iter()
            .find(|r| r.rtype == NBD_REP_INFO && r.data[0..2] == t.to_be_bytes())
            .map(|r| r.data[2..].to_vec())
    };
    assert_eq!(info(NBD_INFO_BLOCK_SIZE).unwrap(), [0, 0, 0, 1, 0, 0, 0x10, 0, 0x02, 0, 0, 0]);
    assert_eq!(info(NBD_INFO_NAME).unwrap(), b"mem");
    assert_eq!(info(NBD_INFO_DESCRIPTION).unwrap(), b"test export");
    // Now in transmission: a read works.
    assert_eq!(c.read_simple(1, 0, 512), vec![0u8; 512]);
    c.disc();
    assert!(c.closed_by_server());
}

#[test]
fn block_size_always_sent_and_default_export() {
    let t = start();
    let mut c = Client::connect(t.addr);
    // INFO without requests still carries EXPORT and BLOCK_SIZE; "" is the default export.
    let r = c.option(NBD_OPT_INFO, &info_data("", &[]));
    assert_eq!(r.last().unwrap().rtype, NBD_REP_ACK);
    let types: Vec<u16> =
        r.iter().filter(|r| r.rtype == NBD_REP_INFO).map(|r| u16::from_be_bytes([r.data[0], r.data[1]])).collect();
    assert!(types.contains(&NBD_INFO_EXPORT));
    assert!(types.contains(&NBD_INFO_BLOCK_SIZE));
    // The canonical name is given since the client used the empty one.
    assert!(types.contains(&NBD_INFO_NAME));
    // Still in option haggling after INFO.
    let (size, _, _) = c.go("", &[]).unwrap();
    assert_eq!(size, SIZE);
}

#[test]
fn option_errors_keep_the_session() {
    let t = start();
    let mut c = Client::connect(t.addr);
    let one = |c: &mut Client, opt: u32, data: &[u8]| {
        let r = c.option(opt, data);
        assert_eq!(r.len(), 1, "option {opt}: {r:?}");
        r[0].rtype
    };
    assert_eq!(one(&mut c, 12345, b"whatever"), NBD_REP_ERR_UNSUP);
    assert_eq!(one(&mut c, NBD_OPT_EXTENDED_HEADERS, b"x"), NBD_REP_ERR_INVALID);
    assert_eq!(one(&mut c, NBD_OPT_STARTTLS, &[]), NBD_REP_ERR_POLICY);
    assert_eq!(one(&mut c, NBD_OPT_STARTTLS, b"x"), NBD_REP_ERR_INVALID);
    assert_eq!(one(&mut c, NBD_OPT_LIST, b"x"), NBD_REP_ERR_INVALID);
    assert_eq!(one(&mut c, NBD_OPT_STRUCTURED_REPLY, b"x"), NBD_REP_ERR_INVALID);
    assert_eq!(one(&mut c, NBD_OPT_GO, &[0, 0, 0, 9, b'm']), NBD_REP_ERR_INVALID);
    assert_eq!(one(&mut c, NBD_OPT_INFO, &[]), NBD_REP_ERR_INVALID);
    let mut trailing = info_data("mem", &[]);
    trailing.push(0);
    assert_eq!(one(&mut c, NBD_OPT_INFO, &trailing), NBD_REP_ERR_INVALID);
    assert_eq!(one(&mut c, NBD_OPT_GO, &info_data("nope", &[])), NBD_REP_ERR_UNKNOWN);
    // Meta contexts need structured replies first.
    assert_eq!(one(&mut c, NBD_OPT_SET_META_CONTEXT, &meta_data("mem", &["base:allocation"])), NBD_REP_ERR_INVALID);
    assert_eq!(one(&mut c, NBD_OPT_LIST_META_CONTEXT, &meta_data("mem", &[])), NBD_REP_ERR_INVALID);
    // LIST.
    let r = c.option(NBD_OPT_LIST, &[]);
    assert_eq!(r.len(), 2);
    assert_eq!(r[0].rtype, NBD_REP_SERVER);
    assert_eq!(&r[0].data[0..4], &[0, 0, 0, 3]);
    assert_eq!(&r[0].data[4..7], b"mem");
    assert_eq!(&r[0].data[7..], b"test export");
    // Still alive: GO works.
    assert!(c.go("mem", &[]).is_ok());
}

#[test]
fn meta_contexts() {
    let t = start();
    let mut c = Client::connect(t.addr);
    c.structured();
    let names = |r: &[OptReply]| -> Vec<String> {
        r.iter()
            .filter(|r| r.rtype == NBD_REP_META_CONTEXT)
            .map(|r| String::from_utf8(r.data[4..].to_vec()).unwrap())
            .collect()
    };
    // LIST with no query, with the "base:" wildcard, and with an unknown namespace.
    let r = c.option(NBD_OPT_LIST_META_CONTEXT, &meta_data("mem", &[]));
    assert_eq!(names(&r), ["base:allocation"]);
    assert_eq!(r.last().unwrap().rtype, NBD_REP_ACK);
    let r = c.option(NBD_OPT_LIST_META_CONTEXT, &meta_data("mem", &["base:"]));
    assert_eq!(names(&r), ["base:allocation"]);
    let r = c.option(NBD_OPT_LIST_META_CONTEXT, &meta_data("mem", &["qemu:dirty-bitmap:a"]));
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].rtype, NBD_REP_ACK);
    // Malformed and unknown export.
    let mut bad = meta_data("mem", &["base:allocation"]);
    bad.truncate(bad.len() - 1);
    assert_eq!(c.option(NBD_OPT_SET_META_CONTEXT, &bad)[0].rtype, NBD_REP_ERR_INVALID);
    assert_eq!(
        c.option(NBD_OPT_SET_META_CONTEXT, &meta_data("zz", &["base:allocation"]))[0].rtype,
        NBD_REP_ERR_UNKNOWN
    );
    // SET "base:" selects nothing; SET base:allocation selects it with a nonzero id.
    let r = c.set_meta("mem", &["base:"]);
    assert_eq!(r.len(), 1);
    let r = c.set_meta("mem", &["x-foo:bar", "base:allocation"]);
    assert_eq!(names(&r), ["base:allocation"]);
    assert_ne!(&r[0].data[0..4], &[0, 0, 0, 0]);
    let (_, flags, _) = c.go("mem", &[]).unwrap();
    assert_ne!(flags & NBD_FLAG_SEND_DF, 0);
}

#[test]
fn export_name_with_and_without_zeroes() {
    let t = start();
    // NO_ZEROES negotiated: 10 bytes.
    let mut c = Client::connect(t.addr);
    c.send_option(NBD_OPT_EXPORT_NAME, b"mem");
    let mut r = [0u8; 10];
    c.s.read_exact(&mut r).unwrap();
    assert_eq!(u64::from_be_bytes(r[0..8].try_into().unwrap()), SIZE);
    assert_eq!(c.read_simple(1, 0, 16), vec![0u8; 16]);
    // Without NO_ZEROES: 124 zero bytes follow.
    let mut c = Client::connect_raw(t.addr, NBD_FLAG_C_FIXED_NEWSTYLE);
    c.send_option(NBD_OPT_EXPORT_NAME, b"");
    let mut r = [0u8; 134];
    c.s.read_exact(&mut r).unwrap();
    assert!(r[10..].iter().all(|&b| b == 0));
    assert_eq!(c.read_simple(1, 0, 16), vec![0u8; 16]);
    // Unknown export: the server must hang up.
    let mut c = Client::connect(t.addr);
    c.send_option(NBD_OPT_EXPORT_NAME, b"nope");
    assert!(c.closed_by_server());
}

#[test]
fn non_fixed_newstyle_client() {
    let t = start();
    // Plain newstyle may use EXPORT_NAME...
    let mut c = Client::connect_raw(t.addr, 0);
    c.send_option(NBD_OPT_EXPORT_NAME, b"mem");
    let mut r = [0u8; 134];
    c.s.read_exact(&mut r).unwrap();
    // ...but any other option ends the session (it could not parse replies).
    let mut c = Client::connect_raw(t.addr, 0);
    c.send_option(NBD_OPT_LIST, &[]);
    assert!(c.closed_by_server());
}

#[test]
fn abusive_handshakes_are_disconnected() {
    let t = start();
    // Unknown client flags.
    let mut c = Client::connect_raw(t.addr, 0x8000_0001);
    assert!(c.closed_by_server());
    // Bad option magic.
    let mut c = Client::connect(t.addr);
    c.s.write_all(&[0u8; 16]).unwrap();
    assert!(c.closed_by_server());
    // Absurd option length.
    let mut c = Client::connect(t.addr);
    let mut h = IHAVEOPT.to_be_bytes().to_vec();
    h.extend_from_slice(&NBD_OPT_GO.to_be_bytes());
    h.extend_from_slice(&(1u32 << 30).to_be_bytes());
    c.s.write_all(&h).unwrap();
    assert!(c.closed_by_server());
    // ABORT gets an ACK, then the session ends.
    let mut c = Client::connect(t.addr);
    let r = c.option(NBD_OPT_ABORT, &[]);
    assert_eq!(r[0].rtype, NBD_REP_ACK);
    assert!(c.closed_by_server());
}

#[test]
fn too_many_options() {
    let t = start();
    let mut c = Client::connect(t.addr);
    // Pipeline the options and count replies until the server hangs up.
    let mut all = Vec::new();
    for _ in 0..1100 {
        all.extend_from_slice(&IHAVEOPT.to_be_bytes());
        all.extend_from_slice(&999u32.to_be_bytes());
        all.extend_from_slice(&0u32.to_be_bytes());
    }
    let writer = {
        let mut s = c.s.try_clone().unwrap();
        std::thread::spawn(move || {
            let _ = s.write_all(&all);
        })
    };
    let mut replies = 0;
    let mut buf = [0u8; 20];
    while c.s.read_exact(&mut buf).is_ok() {
        assert_eq!(u32::from_be_bytes(buf[12..16].try_into().unwrap()), NBD_REP_ERR_UNSUP);
        replies += 1;
    }
    let _ = writer.join();
    assert_eq!(replies, 1000);
}

#[test]
fn read_only_export_flags() {
    let t = start_with(tarn_nbd::memory::MemoryExport::new_read_only(1 << 20), Default::default());
    let mut c = Client::connect(t.addr);
    let (_, flags, _) = c.go("mem", &[]).unwrap();
    assert_ne!(flags & NBD_FLAG_READ_ONLY, 0);
    assert_eq!(flags & NBD_FLAG_SEND_TRIM, 0);
    c.write(5, 0, &[1, 2, 3]);
    assert_eq!(c.simple(), (NBD_EPERM, 5));
    c.request(0, NBD_CMD_TRIM, 6, 0, 4096, &[]);
    assert_eq!(c.simple(), (NBD_EPERM, 6));
    c.request(0, NBD_CMD_WRITE_ZEROES, 7, 0, 4096, &[]);
    assert_eq!(c.simple(), (NBD_EPERM, 7));
    assert_eq!(c.read_simple(8, 0, 4), vec![0u8; 4]);
}
