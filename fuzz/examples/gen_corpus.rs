//! Write the seed corpora: valid encodings of every structure each fuzz
//! target reads, into `fuzz/seeds/<target>/` (committed; rerun after a
//! format change):
//!
//!     cargo run --manifest-path fuzz/Cargo.toml --example gen_corpus
//!
//! It also checks that the pool image `engine_open` damages opens clean.

use std::path::{Path, PathBuf};

use tarn_format::checkpoint::{SegmentHeader, SEGMENT_HEADER_LEN};
use tarn_format::journal::RecordHeader;
use tarn_format::ops::{encode_ops, Op};
use tarn_fuzz::image::{self, flags, Area};
use tarn_fuzz::{nbd, samples};

fn write(dir: &Path, target: &str, name: &str, bytes: &[u8]) {
    let d = dir.join(target);
    std::fs::create_dir_all(&d).expect("create seed dir");
    std::fs::write(d.join(name), bytes).expect("write seed");
}

fn with_flags(flags: u8, bytes: &[u8]) -> Vec<u8> {
    let mut v = vec![flags];
    v.extend_from_slice(bytes);
    v
}

fn main() {
    let dir: PathBuf = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds"));

    // NBD: handshakes of every shape, each followed by every command.
    write(&dir, "nbd_handshake", "every_option", &nbd::every_option());
    for mode in 0..16u8 {
        let ro = mode & 4 != 0;
        let mut hs = nbd::handshake(mode);
        hs.extend(nbd::every_command(ro));
        write(&dir, "nbd_handshake", &format!("mode{mode:02}"), &hs);
        write(&dir, "nbd_transmission", &format!("mode{mode:02}"), &with_flags(mode, &nbd::every_command(ro)));
    }
    write(&dir, "nbd_transmission", "workers", &with_flags(0x13, &nbd::every_command(false)));

    // Superblock: both copies, as stored and with the checksum left to reseal.
    let img = image::build();
    let sb0 = &img.bytes[..4096];
    let sb1 = &img.bytes[16 * 4096..17 * 4096];
    write(&dir, "format_superblock", "copy0", &with_flags(0, sb0));
    write(&dir, "format_superblock", "copy1", &with_flags(2, sb1));
    write(&dir, "format_superblock", "copy0_reseal", &with_flags(1, sb0));

    // Journal records: the image's, and one of every op.
    let every = encode_ops(&samples::every_op());
    let rec = RecordHeader::encode_record(7, 9, 32, 3, &every);
    write(&dir, "format_journal_record", "every_op", &with_flags(0, &rec));
    write(&dir, "format_journal_record", "every_op_reseal", &with_flags(3, &rec));
    let first = &img.bytes[32 * 4096..33 * 4096];
    write(&dir, "format_journal_record", "image_first", &with_flags(0, first));

    // Ops payloads.
    write(&dir, "format_ops", "every_op", &every);
    for (i, (_, ops)) in samples::journal().iter().enumerate() {
        let mut all = vec![Op::VolCreate { vol: 1, size: 1 << 20, name: "a".into() }];
        all.extend(ops.iter().cloned());
        write(&dir, "format_ops", &format!("journal{i}"), &encode_ops(&all));
    }

    // Checkpoints: the image's payload, alone and after a segment header.
    let payload = samples::encode_checkpoint(&samples::checkpoint());
    write(&dir, "format_checkpoint", "payload", &with_flags(0, &payload));
    let h =
        SegmentHeader { seq: 5, index: 0, blocks: 1, self_pba: 100, next_pba: 0, payload_len: payload.len() as u32 };
    let mut seg = h.encode().to_vec();
    assert_eq!(seg.len(), SEGMENT_HEADER_LEN);
    seg.extend_from_slice(&payload);
    write(&dir, "format_checkpoint", "segment", &with_flags(1, &seg));
    write(&dir, "format_checkpoint", "segment_reseal", &with_flags(3, &seg));

    // Store nodes: a leaf of extents, a leaf of ranges, a branch.
    use tarn_format::node::{encode_node, ChildRef, ExtentValue, NodeBody, NodeHeader, PackedLeaf, RangeValue};
    use tarn_format::Pba;
    let header = |level, codec| NodeHeader { self_pba: Pba::new(0, 300), generation: 4, tree: 1 << 32 | 1, level, codec };
    let extents: Vec<(u64, ExtentValue)> =
        (0..50).map(|i| (i * 7, ExtentValue { len: 1 + i % 3, pba: Pba::new(0, 1000 + i * 5).0, birth: 1 + i % 2 })).collect();
    write(&dir, "format_node", "extent_leaf", &encode_node(&header(0, 1), &NodeBody::Leaf(PackedLeaf::pack(&extents))));
    let ranges: Vec<(u64, RangeValue)> = (0..50).map(|i| (i * 10, RangeValue { len: 1 + i % 9 })).collect();
    write(&dir, "format_node", "range_leaf", &encode_node(&header(0, 2), &NodeBody::Leaf(PackedLeaf::pack(&ranges))));
    let children: Vec<ChildRef> = (0..20).map(|i| ChildRef { key: i * 1000, pba: Pba::new(0, 400 + i), crc: i as u32 }).collect();
    write(&dir, "format_node", "branch", &encode_node(&header(2, 1), &NodeBody::Branch(children)));

    // engine_open: the image as is, resealed, and with an appended record.
    let pool = image::open(img.bytes.clone()).expect("pool image opens");
    let report = pool.check();
    assert!(report.is_clean(), "pool image not clean: {:?}", report.problems);
    write(&dir, "engine_open", "as_is", &image::encode_input(0, &[], None));
    write(&dir, "engine_open", "reseal_all", &image::encode_input(7, &[], None));
    let txid = 9u64.to_le_bytes();
    write(
        &dir,
        "engine_open",
        "newer_copy1",
        &image::encode_input(flags::RESEAL_SUPERBLOCKS, &[(Area::SuperblockCopy1, 80, &txid)], None),
    );
    let seq = 6u64.to_le_bytes();
    write(
        &dir,
        "engine_open",
        "journal_seq",
        &image::encode_input(flags::RESEAL_JOURNAL, &[(Area::Journal, 16, &seq)], None),
    );
    let ops = encode_ops(&[
        Op::Map { vol: 1, lba: 40, len: 4, pba: 500, birth: 4 },
        Op::SnapCreate { vol: 1, name: "s3".into(), created: 1_700_000_300 },
        Op::Rollback { vol: 1, epoch: 4 },
        Op::VolResize { vol: 3, size: 128 << 10 },
        Op::SnapDelete { vol: 1, epoch: 1 },
        Op::VolDelete { vol: 3 },
    ]);
    write(&dir, "engine_open", "append", &image::encode_input(flags::APPEND_RECORD, &[], Some((1, &ops))));
    let ckpt = image::encode_input(flags::RESEAL_CHECKPOINT, &[(Area::FirstSegment, 64 + 16, &[9, 9, 9, 9])], None);
    write(&dir, "engine_open", "checkpoint_edit", &ckpt);
    println!("seeds written to {}", dir.display());
}
