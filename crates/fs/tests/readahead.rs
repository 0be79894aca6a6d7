//! Per-file readahead: which READs make a sequential stream, how its
//! window grows, and that a file volume reading with readahead on reads
//! the same bytes, hinting the windows of a scattered file and not those
//! of a contiguous one.

use rand::seq::SliceRandom;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tarn_fs::data::readahead::{Streams, Window, FIRST_WINDOW};
use tarn_fs::ROOT;

mod common;
use common::{file, fresh, MIB};

const K128: u64 = 128 << 10;

/// READs of `len` bytes from `from` on, in order: the windows asked.
fn read_in_order(s: &mut Streams, object: u32, from: u64, to: u64, len: u64, size: u64) -> Vec<Window> {
    (from..to).step_by(len as usize).filter_map(|at| s.plan(object, at, (at + len).min(size), size)).collect()
}

#[test]
fn a_reader_from_the_start_gets_windows_doubling_to_the_largest() {
    let mut s = Streams::new(4 * MIB);
    let size = 64 * MIB;
    let windows = read_in_order(&mut s, 7, 0, 32 * MIB, K128, size);
    assert_eq!(windows[0], Window { object: 7, offset: K128, len: FIRST_WINDOW });
    let lens: Vec<u64> = windows.iter().map(|w| w.len).collect();
    assert_eq!(&lens[..6], &[K128, 2 * K128, 4 * K128, 8 * K128, 16 * K128, 4 * MIB]);
    assert!(lens.iter().all(|&l| l <= 4 * MIB), "never past the largest window: {lens:?}");
    // The windows follow each other: each byte asked once.
    for pair in windows.windows(2) {
        assert_eq!(pair[0].offset + pair[0].len, pair[1].offset);
    }
    // Always ahead of the reader, never more than 1.5 windows.
    let last = windows.last().expect("windows");
    assert!(last.offset + last.len > 32 * MIB && last.offset + last.len <= 32 * MIB + 6 * MIB);
}

#[test]
fn random_reads_ask_nothing_and_a_jump_starts_a_new_stream() {
    let mut s = Streams::new(4 * MIB);
    let size = 1 << 30;
    // Offsets 8 MiB apart at least, in shuffled order: none follows another.
    let mut offsets: Vec<u64> = (1..128).map(|k| k * 8 * MIB).collect();
    offsets.shuffle(&mut ChaCha8Rng::seed_from_u64(6));
    for at in offsets {
        assert_eq!(s.plan(3, at, at + 4096, size), None, "random READ at {at}");
    }
    // Two READs that follow each other make a stream again.
    let at = 515 * MIB;
    assert_eq!(s.plan(3, at, at + K128, size), None);
    assert_eq!(s.plan(3, at + K128, at + 2 * K128, size).map(|w| w.offset), Some(at + 2 * K128));
}

#[test]
fn reads_out_of_order_within_the_slack_keep_the_stream() {
    let mut s = Streams::new(4 * MIB);
    let size = 64 * MIB;
    let mut windows = 0;
    for at in [0, 2, 1, 4, 3, 5, 7, 6, 8, 9].map(|c| c * K128) {
        windows += usize::from(s.plan(1, at, at + K128, size).is_some());
    }
    assert!(windows >= 3, "the stream kept growing: {windows} windows");
}

#[test]
fn a_reader_at_the_end_is_forgotten_and_streams_stay_bounded() {
    let mut s = Streams::new(4 * MIB);
    read_in_order(&mut s, 1, 0, MIB, K128, MIB);
    assert!(s.is_empty(), "the stream went with its last READ");
    for object in 0..5000 {
        s.plan(object, 0, K128, MIB);
    }
    assert!(s.len() <= 1024, "{} streams", s.len());
}

#[test]
fn a_small_file_asks_nothing_past_its_end() {
    let mut s = Streams::new(4 * MIB);
    assert_eq!(s.plan(1, 0, 10_000, 10_000), None);
    // A file of 200 KiB: one window, cut at the end.
    assert_eq!(s.plan(2, 0, K128, 200 << 10), Some(Window { object: 2, offset: K128, len: (200 << 10) - K128 }));
}

/// A file of `mib` MiB written 4 KiB at a time in shuffled order (its
/// blocks then lie scattered in the pool), or in order.
fn write_file(fv: &tarn_fs::FileVolume, name: &str, data: &[u8], shuffled: bool) -> u64 {
    let ino = file(fv, ROOT, name);
    let mut order: Vec<usize> = (0..data.len() / 4096).collect();
    if shuffled {
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(15));
    }
    for i in order {
        fv.write(ino, (i * 4096) as u64, &data[i * 4096..(i + 1) * 4096]).unwrap();
    }
    ino
}

#[test]
fn a_volume_with_readahead_reads_the_same_bytes_and_hints_only_scattered_files() {
    let (_sim, _pool, mut fv) = fresh();
    fv.start_readahead(4 * MIB);
    let mut data = vec![0u8; 8 * MIB as usize];
    ChaCha8Rng::seed_from_u64(1).fill_bytes(&mut data);
    let scattered = write_file(&fv, "scattered", &data, true);
    let contiguous = write_file(&fv, "contiguous", &data, false);
    fv.sync().unwrap();
    for (ino, what) in [(contiguous, "contiguous"), (scattered, "scattered")] {
        let mut back = Vec::new();
        for at in (0..8 * MIB).step_by(K128 as usize) {
            back.extend(fv.read(ino, at, K128 as u32).unwrap());
        }
        assert!(back == data, "{what}: read back as written");
        if what == "contiguous" {
            fv.unmounted().unwrap();
            let s = fv.readahead_stats().expect("readahead on");
            assert!(s.windows > 0, "{s:?}");
            assert_eq!(s.hinted, 0, "a contiguous file is left to the device's readahead: {s:?}");
            fv.start_readahead(4 * MIB);
        }
    }
    // Writes after readahead read back new (hints keep no data).
    fv.write(scattered, 3 * MIB, &[9u8; 4096]).unwrap();
    assert_eq!(fv.read(scattered, 3 * MIB, 4096).unwrap(), vec![9u8; 4096]);
    fv.unmounted().unwrap();
    let s = fv.readahead_stats().expect("readahead on");
    assert!(s.hinted > 0 && s.hinted_bytes > 0, "the scattered file's windows were hinted: {s:?}");
}

#[test]
fn readahead_0_is_off() {
    let (_sim, _pool, mut fv) = fresh();
    fv.start_readahead(0);
    assert_eq!(fv.readahead_stats(), None);
}
