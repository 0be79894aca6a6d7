//! The parsers against file systems made by the real mke2fs, checked
//! against what dumpe2fs (e2fsprogs) says about the same image.

use std::path::{Path, PathBuf};
use std::process::Command;
use tarn_extfs::{classify, free_byte_ranges, ExtError, Groups, MetaKind, SliceSource, Superblock};

fn tool_missing(name: &str) -> bool {
    Command::new(name).arg("-V").output().is_err()
}

/// A fresh image of `mib` MiB made by `mke2fs ARGS`, filled from a small
/// tree so that some blocks are used.
fn make_image(dir: &Path, name: &str, mib: u64, args: &[&str]) -> PathBuf {
    assert!(!tool_missing("mke2fs"), "mke2fs not installed (apt-get install e2fsprogs)");
    let tree = dir.join(format!("{name}-tree"));
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    for i in 0..40u32 {
        let body: Vec<u8> = (0..(i * 5000)).map(|b| (b % 251) as u8).collect();
        std::fs::write(tree.join("sub").join(format!("f{i}")), body).unwrap();
    }
    // Many directories, one big enough for several blocks.
    for d in 0..30 {
        let sub = tree.join(format!("d{d}"));
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(sub.join("x"), [d as u8; 100]).unwrap();
    }
    for i in 0..300 {
        std::fs::write(tree.join("sub").join(format!("a-rather-long-file-name-{i:05}")), b"x").unwrap();
    }
    // A file of many small pieces: an extent tree deeper than the inode
    // (ext4), double indirect blocks (ext2/3 with 1 KiB blocks).
    let frag = std::fs::File::create(tree.join("frag")).unwrap();
    for i in 0..600u64 {
        std::os::unix::fs::FileExt::write_at(&frag, &[0xa5; 4096], i * 16384).unwrap();
    }
    std::os::unix::fs::symlink("t".repeat(100), tree.join("longlink")).unwrap();
    std::os::unix::fs::symlink("short", tree.join("shortlink")).unwrap();
    let img = dir.join(format!("{name}.img"));
    let file = std::fs::File::create(&img).unwrap();
    file.set_len(mib << 20).unwrap();
    let out = Command::new("mke2fs").args(["-q", "-F", "-d"]).arg(&tree).args(args).arg(&img).output().unwrap();
    assert!(out.status.success(), "mke2fs {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    img
}

/// Free block ranges per dumpe2fs: "Free blocks: 5-10, 12" lines of every group.
fn dumpe2fs_free(img: &Path) -> Vec<(u64, u64)> {
    let out = Command::new("dumpe2fs").arg(img).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let mut runs: Vec<(u64, u64)> = Vec::new();
    // Per-group lines only (the header has a "Free blocks:" count too).
    let groups = text.lines().skip_while(|l| !l.starts_with("Group 0:"));
    for line in groups.map(str::trim).filter(|l| l.starts_with("Free blocks: ")) {
        for part in line["Free blocks: ".len()..].split(", ").filter(|p| !p.is_empty()) {
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            let (a, b): (u64, u64) = (a.parse().unwrap(), b.parse().unwrap());
            match runs.last_mut() {
                Some((s, l)) if *s + *l == a => *l += b - a + 1,
                _ => runs.push((a, b - a + 1)),
            }
        }
    }
    runs
}

fn our_free(img: &Path) -> (Vec<(u64, u64)>, u64) {
    let bytes = std::fs::read(img).unwrap();
    let mut src = SliceSource(&bytes);
    let sb = Superblock::read(&mut src).unwrap();
    sb.check_readable().unwrap();
    sb.check_clean().unwrap();
    let groups = Groups::read(&mut src, &sb).unwrap();
    let mut runs = Vec::new();
    let bs = u64::from(sb.block_size);
    let summary = free_byte_ranges(&mut src, &groups, &mut |off, len| {
        runs.push((off / bs, len / bs));
        Ok(())
    })
    .unwrap();
    assert_eq!(summary.free_blocks, sb.free_blocks, "bitmaps vs superblock free count");
    (runs, summary.uninit_groups)
}

/// Returns how many groups had an uninitialized bitmap.
fn check_layout(name: &str, mib: u64, args: &[&str]) -> u64 {
    let dir = tempdir(name);
    let img = make_image(&dir, name, mib, args);
    let (ours, uninit) = our_free(&img);
    let theirs = dumpe2fs_free(&img);
    assert!(!theirs.is_empty());
    assert_eq!(ours, theirs, "{name}: free ranges differ from dumpe2fs");
    std::fs::remove_dir_all(&dir).unwrap();
    uninit
}

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tarn-extfs-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn ext4_default_layout() {
    assert!(check_layout("ext4", 256, &["-t", "ext4"]) > 0, "mke2fs left no group uninitialized");
}

#[test]
fn ext4_uninit_groups_without_flex_bg() {
    assert!(check_layout("ext4noflex", 300, &["-t", "ext4", "-O", "^flex_bg"]) > 0);
}

#[test]
fn ext4_meta_bg_64bit() {
    let _ = check_layout("ext4meta", 300, &["-t", "ext4", "-O", "meta_bg,^resize_inode,64bit"]);
}

#[test]
fn ext3_and_ext2_small_blocks() {
    let _ = check_layout("ext3", 64, &["-t", "ext3", "-b", "1024"]);
    let _ = check_layout("ext2", 64, &["-t", "ext2", "-b", "2048"]);
}

#[test]
fn ext4_sparse_super2() {
    let _ = check_layout("ext4ss2", 300, &["-t", "ext4", "-O", "sparse_super2"]);
}

#[test]
fn refuses_what_is_not_ext_or_not_clean() {
    let dir = tempdir("refuse");
    let img = make_image(&dir, "dirty", 64, &["-t", "ext4"]);
    let mut bytes = std::fs::read(&img).unwrap();
    // The journal-needs-recovery flag, as a mounted ext4 leaves it.
    bytes[1024 + 0x60] |= 0x4;
    let sb = Superblock::read(&mut SliceSource(&bytes)).unwrap();
    let err = sb.check_clean().unwrap_err();
    assert!(err.to_string().contains("journal needs recovery"), "{err}");
    let zeros = vec![0u8; 1 << 20];
    assert!(matches!(Superblock::read(&mut SliceSource(&zeros)), Err(ExtError::NotExt { .. })));
    // A superblock claiming more blocks than the image holds.
    let truncated = &bytes[..32 << 20];
    assert!(matches!(Superblock::read(&mut SliceSource(truncated)), Err(ExtError::Corrupt(_))));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_bitmap_that_disagrees_with_its_descriptor_is_refused() {
    let dir = tempdir("disagree");
    let img = make_image(&dir, "disagree", 64, &["-t", "ext4", "-O", "^metadata_csum"]);
    let mut bytes = std::fs::read(&img).unwrap();
    let mut src = SliceSource(&bytes);
    let sb = Superblock::read(&mut src).unwrap();
    let groups = Groups::read(&mut src, &sb).unwrap();
    // Clear the last used bit of group 0's bitmap: one more block looks free.
    let at = (groups.descs[0].block_bitmap * u64::from(sb.block_size)) as usize;
    let byte = bytes[at..at + 4096].iter().rposition(|b| *b != 0 && *b != 0xff).unwrap_or(0);
    bytes[at + byte] &= bytes[at + byte] - 1;
    let mut src = SliceSource(&bytes);
    let err = free_byte_ranges(&mut src, &groups, &mut |_, _| Ok(())).unwrap_err();
    assert!(err.to_string().contains("run e2fsck"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Blocks (of `bs` bytes) of `img` that are not all zeros, among `blocks`.
fn nonzero(bytes: &[u8], bs: usize, blocks: impl Iterator<Item = u64>) -> std::collections::BTreeSet<u64> {
    blocks.filter(|&b| bytes[b as usize * bs..(b as usize + 1) * bs].iter().any(|&x| x != 0)).collect()
}

/// The classifier's metadata against e2image's (e2fsprogs' own idea of
/// metadata: `e2image -r` copies exactly those blocks, zero ones as holes).
fn check_classifier(name: &str, mib: u64, args: &[&str]) {
    let dir = tempdir(name);
    let img = make_image(&dir, name, mib, args);
    let meta = dir.join("meta.img");
    let out = Command::new("e2image").arg("-r").arg(&img).arg(&meta).output().unwrap();
    assert!(out.status.success(), "e2image: {}", String::from_utf8_lossy(&out.stderr));
    let bytes = std::fs::read(&img).unwrap();
    let theirs_raw = std::fs::read(&meta).unwrap();
    let mut src = SliceSource(&bytes);
    let sb = Superblock::read(&mut src).unwrap();
    let groups = Groups::read(&mut src, &sb).unwrap();
    let map = classify(&mut src, &groups).unwrap();
    let bs = sb.block_size as usize;
    // e2image copies no backup superblock or descriptors: neither does fsck read them.
    let primary = map.runs.iter().filter(|r| r.2 != MetaKind::Backup);
    let ours = nonzero(&bytes, bs, primary.flat_map(|&(at, len, _)| at..at + len));
    let theirs = nonzero(&theirs_raw, bs, 0..(theirs_raw.len() / bs) as u64);
    let both = ours.intersection(&theirs).count() as f64;
    let (precision, recall) = (both / ours.len() as f64, both / theirs.len() as f64);
    let kinds: Vec<String> = MetaKind::ALL.iter().map(|k| format!("{} {}", k.name(), map.blocks_of(*k))).collect();
    println!(
        "{name}: {} inodes, metadata blocks: {}; nonzero: ours {}, e2image {}; precision {precision:.4}, recall {recall:.4}, skipped {}",
        map.inodes,
        kinds.join(", "),
        ours.len(),
        theirs.len(),
        map.skipped
    );
    let missed: Vec<_> = theirs.difference(&ours).take(10).collect();
    let extra: Vec<_> = ours.difference(&theirs).take(10).collect();
    assert!(precision >= 0.99 && recall >= 0.99, "{name}: missed {missed:?}, extra {extra:?}");
    assert_eq!(map.skipped, 0, "{name}: a clean file system has nothing to skip");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn classifier_matches_e2image_ext4() {
    check_classifier("c-ext4", 256, &["-t", "ext4"]);
    check_classifier("c-ext4-1k", 64, &["-t", "ext4", "-b", "1024"]);
}

#[test]
fn classifier_matches_e2image_ext3_and_ext2() {
    check_classifier("c-ext3", 128, &["-t", "ext3", "-b", "1024"]);
    check_classifier("c-ext2", 64, &["-t", "ext2", "-b", "4096"]);
}
