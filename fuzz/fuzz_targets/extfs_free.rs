//! The ext2/3/4 parsers, the free-space walk and the metadata walk on an arbitrary image
//! (the first byte is flags; bit 0 writes the ext magic at byte 1080 so the
//! fields behind it are reached). What the walk reports must be sane:
//! ranges in order, disjoint, block-aligned, inside the file system.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tarn_extfs::{classify, free_byte_ranges, Groups, SliceSource, Superblock};

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut image = rest.to_vec();
    if flags & 1 != 0 && image.len() >= 1082 {
        image[1080..1082].copy_from_slice(&0xEF53u16.to_le_bytes());
    }
    let mut src = SliceSource(&image);
    let Ok(sb) = Superblock::read(&mut src) else { return };
    if sb.check_readable().is_err() {
        return;
    }
    let Ok(groups) = Groups::read(&mut src, &sb) else { return };
    let bs = u64::from(sb.block_size);
    let fs_bytes = sb.blocks_count * bs;
    let mut last_end = 0u64;
    let walked = free_byte_ranges(&mut src, &groups, &mut |offset, len| {
        assert!(len > 0 && offset % bs == 0 && len % bs == 0, "unaligned range {offset}+{len}");
        assert!(offset >= last_end, "ranges out of order or overlapping at {offset}");
        assert!(offset + len <= fs_bytes, "range {offset}+{len} past the file system's {fs_bytes} bytes");
        assert!(offset > last_end || last_end == 0, "adjacent ranges were not merged at {offset}");
        last_end = offset + len;
        Ok(())
    });
    if let Ok(summary) = walked {
        assert!(summary.free_blocks <= summary.fs_blocks);
    }
    // The metadata walk: runs inside the file system, sorted.
    if let Ok(map) = classify(&mut src, &groups) {
        assert!(map.runs.windows(2).all(|w| w[0] <= w[1]), "runs not sorted");
        for &(at, len, _) in &map.runs {
            assert!(len > 0 && at + len <= sb.blocks_count, "run {at}+{len} outside {} blocks", sb.blocks_count);
        }
    }
});
