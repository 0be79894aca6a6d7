//! Write the seed corpora: valid encodings of every structure each fuzz
//! target reads, into `fuzz/seeds/<target>/` (committed; rerun after a
//! format change):
//!
//!     cargo run --manifest-path fuzz/Cargo.toml --example gen_corpus
//!
//! It also checks that the pool images `engine_open` damages open clean
//! (as they are, resealed, and with the appended record of the `append` seeds).

use std::path::{Path, PathBuf};

use tarn_format::catalog::{Catalog, Root};
use tarn_format::checkpoint::{SegmentHeader, SEGMENT_HEADER_LEN};
use tarn_format::journal::RecordHeader;
use tarn_format::ops::{encode_ops, Op};
use tarn_format::superblock::SUPERBLOCK_COPIES;
use tarn_fuzz::image::{self, flags, Area, Flavour};

const BS: usize = 4096;
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
    let sb = image::current_superblock(&img.bytes).expect("image superblock");
    let copy = |i: usize| &img.bytes[SUPERBLOCK_COPIES[i] as usize * BS..(SUPERBLOCK_COPIES[i] as usize + 1) * BS];
    write(&dir, "format_superblock", "copy0", &with_flags(0, copy(0)));
    write(&dir, "format_superblock", "copy1", &with_flags(2, copy(1)));
    write(&dir, "format_superblock", "copy0_reseal", &with_flags(1, copy(0)));

    // Journal records: the image's, and one of every op.
    let every = encode_ops(&samples::every_op());
    let rec = RecordHeader::encode_record(7, 9, 32, 3, &every);
    write(&dir, "format_journal_record", "every_op", &with_flags(0, &rec));
    write(&dir, "format_journal_record", "every_op_reseal", &with_flags(3, &rec));
    let j = img.journal_start as usize * BS;
    let first = &img.bytes[j..j + BS];
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
    // The image's catalog (format 2), alone and in its segment.
    let catalog = image::checkpoint_payload(&img.bytes, &sb).expect("image checkpoint");
    write(&dir, "format_checkpoint", "catalog", &with_flags(0, &catalog));
    let at = sb.checkpoint.first_segment as usize * BS;
    let seg = &img.bytes[at..at + SEGMENT_HEADER_LEN + catalog.len()];
    write(&dir, "format_checkpoint", "catalog_segment", &with_flags(1, seg));

    // Store nodes: a leaf of extents, a leaf of ranges, a branch.
    use tarn_format::node::{encode_node, ChildRef, ExtentValue, NodeBody, NodeHeader, PackedLeaf, RangeValue};
    use tarn_format::Pba;
    let header =
        |level, codec| NodeHeader { self_pba: Pba::new(0, 300), generation: 4, tree: 1 << 32 | 1, level, codec };
    let extents: Vec<(u64, ExtentValue)> = (0..50)
        .map(|i| (i * 7, ExtentValue { len: 1 + i % 3, pba: Pba::new(0, 1000 + i * 5).0, birth: 1 + i % 2 }))
        .collect();
    write(&dir, "format_node", "extent_leaf", &encode_node(&header(0, 1), &NodeBody::Leaf(PackedLeaf::pack(&extents))));
    let ranges: Vec<(u64, RangeValue)> = (0..50).map(|i| (i * 10, RangeValue { len: 1 + i % 9 })).collect();
    write(&dir, "format_node", "range_leaf", &encode_node(&header(0, 2), &NodeBody::Leaf(PackedLeaf::pack(&ranges))));
    let children: Vec<ChildRef> =
        (0..20).map(|i| ChildRef { key: i * 1000, pba: Pba::new(0, 400 + i), crc: i as u32 }).collect();
    write(&dir, "format_node", "branch", &encode_node(&header(2, 1), &NodeBody::Branch(children)));
    // The images' own nodes: every root their catalogs name, and the
    // children of the branches (extent, range and sums trees).
    for (flavour, tag) in [(Flavour::Small, "small"), (Flavour::Branches, "branches")] {
        let img = image::build_flavour(flavour);
        let sb = image::current_superblock(&img.bytes).expect("image superblock");
        let c = Catalog::decode(&image::checkpoint_payload(&img.bytes, &sb).expect("checkpoint")).expect("catalog");
        let mut roots: Vec<(String, Root)> = vec![("sums".into(), c.sums), ("space".into(), c.spaces[0].root)];
        for v in &c.volumes {
            roots.push((format!("head_{}", v.name), v.head.root));
            for s in &v.snapshots {
                roots.push((format!("dead_{}_{}", v.name, s.epoch), s.dead.root));
            }
        }
        for (name, root) in roots.into_iter().filter(|(_, r)| r.pba != 0) {
            let node = &img.bytes[root.pba as usize * BS..(root.pba as usize + 1) * BS];
            write(&dir, "format_node", &format!("{tag}_{name}"), node);
            if root.level > 0 {
                // A branch's children: 20-byte entries (key, pba, crc) after the 40-byte header.
                let count = u16::from_le_bytes([node[36], node[37]]) as usize;
                for i in 0..count.min(2) {
                    let e = 40 + 20 * i + 8;
                    let pba = u64::from_le_bytes(node[e..e + 8].try_into().expect("8 bytes")) as usize;
                    write(&dir, "format_node", &format!("{tag}_{name}_child{i}"), &img.bytes[pba * BS..(pba + 1) * BS]);
                }
            }
        }
    }

    // engine_open: each image as is, resealed, and with an appended record.
    for (flavour, f, tag) in [(Flavour::Small, 0, ""), (Flavour::Branches, flags::BRANCHES, "_branches")] {
        engine_open_seeds(&dir, flavour, f, tag);
    }
    println!("seeds written to {}", dir.display());
}

/// Open the image `input` makes; panic unless it opens clean.
fn assert_clean(img: &image::Image, input: &[u8], what: &str) {
    let pool = image::open(image::apply_input(img, input)).unwrap_or_else(|e| panic!("{what}: does not open: {e}"));
    let report = pool.check();
    assert!(report.is_clean(), "{what}: not clean: {:?}", report.problems);
}

fn engine_open_seeds(dir: &Path, flavour: Flavour, f: u8, tag: &str) {
    let img = image::build_flavour(flavour);
    assert!(image::generate(flavour) == img.bytes, "the {flavour:?} pool image differs from one build to the next");
    let sb = image::current_superblock(&img.bytes).expect("image superblock");
    let seed = |name: &str, input: &[u8]| write(dir, "engine_open", &format!("{name}{tag}"), input);
    let as_is = image::encode_input(f, &[], None);
    assert_clean(&img, &as_is, "the pool image");
    seed("as_is", &as_is);
    let reseal_all = image::encode_input(f | 7, &[], None);
    assert_clean(&img, &reseal_all, "the resealed pool image");
    seed("reseal_all", &reseal_all);
    let txid = (sb.txid + 1).to_le_bytes();
    seed(
        "newer_copy1",
        &image::encode_input(f | flags::RESEAL_SUPERBLOCKS, &[(Area::SuperblockCopy1, 80, &txid)], None),
    );
    let first_seq = (sb.checkpoint.seq + 1).to_le_bytes();
    seed("journal_seq", &image::encode_input(f | flags::RESEAL_JOURNAL, &[(Area::Journal, 16, &first_seq)], None));
    // A record of every kind of op the image's volumes allow, replayable:
    // a Map to a free block (the first one found that keeps the pool clean).
    let pool = image::open(img.bytes.clone()).expect("pool image opens");
    let id = |name: &str| pool.volume_id(name).expect("image volume");
    let (a, b, c) = (id("a"), id("b"), id("c"));
    let new = pool.list_volumes().iter().map(|v| v.id).max().expect("volumes") + 1;
    let s2 = pool.snapshot_info("a", "s2").expect("s2").epoch;
    let e = img.epoch;
    let checksums = sb.incompat & tarn_format::superblock::incompat::DATA_CHECKSUMS != 0;
    let ops = |pba: u64| {
        let block = &img.bytes[pba as usize * BS..(pba as usize + 1) * BS];
        let mut ops = vec![
            Op::VolCreate { vol: new, size: 128 << 10, name: "f".into() },
            Op::Map { vol: new, lba: 1, len: 1, pba, birth: e },
        ];
        if checksums {
            ops.push(Op::Sums { pba, sums: vec![tarn_engine::sums::block_sum(block)] });
        }
        ops.extend([
            Op::Unmap { vol: a, lba: 0, len: 1 },
            Op::VolResize { vol: b, size: 512 << 10 },
            Op::Materialize { vol: c, snap: 0, lba: 7, len: 1, pba: 0 },
            Op::SnapCreate { vol: a, name: "s9".into(), created: image::SNAPSHOT_CREATED },
            Op::SnapDelete { vol: a, epoch: s2 },
            Op::Rollback { vol: a, epoch: e },
        ]);
        encode_ops(&ops)
    };
    drop(pool);
    let blocks = img.bytes.len() as u64 / BS as u64;
    let append = (sb.data_start..blocks)
        .rev()
        .map(|pba| image::encode_input(f | flags::APPEND_RECORD, &[], Some((1, &ops(pba)))))
        .find(|input| {
            image::open(image::apply_input(&img, input))
                .is_ok_and(|p| p.volume_id("f").is_some() && p.check().is_clean())
        })
        .expect("a free block for the appended Map");
    assert_clean(&img, &append, "the image with an appended record");
    seed("append", &append);
    let ckpt = image::encode_input(f | flags::RESEAL_CHECKPOINT, &[(Area::FirstSegment, 64 + 16, &[9, 9, 9, 9])], None);
    seed("checkpoint_edit", &ckpt);
    // A changed byte in a tree node (its parent's checksum catches it).
    let c = Catalog::decode(&image::checkpoint_payload(&img.bytes, &sb).expect("checkpoint")).expect("catalog");
    let unit = image::DEVICE_UNIT as u64;
    let at = u16::try_from(c.volumes[0].head.root.pba * BS as u64 / unit + 1).expect("node within reach of an edit");
    seed("node_edit", &image::encode_input(f, &[(Area::Device, at, &[0u8; 48])], None));
}
