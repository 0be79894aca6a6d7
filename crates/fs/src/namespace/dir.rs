//! A directory's content (docs/FORMAT.md *File volumes*, directory
//! blocks): its entries in 4 KiB blocks, each checksummed on its own, so
//! a create or unlink rewrites the one block it changes, not the whole
//! directory (a rewrite per change made filling a directory quadratic:
//! 20,000 creates in one directory took 9.5 s, the last 5,000 three times
//! the first). A cookie is given once per directory and never changes,
//! so a readdir offset (the last cookie seen) stays valid while entries
//! come and go; readdir goes in cookie order whatever block holds them.

use crate::error::{FsError, Result};
use crate::namespace::dirblock::{self, Stored, BLOCK, BLOCK_ROOM, ENTRY_HEAD};
pub use crate::namespace::dirblock::{
    check_name, Entry, MAX_BLOCKS, MAX_BYTES, MAX_ENTRIES, MAX_NAME, MAX_READ_BLOCKS,
};
use crate::namespace::inode::Kind;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Blocks one namespace change may dirty in one directory: an entry's
/// old and new block and block 0 (whose block count a new block changes).
const CHANGE_BLOCKS: u64 = 3;

/// One block as memory keeps it: its entries' bytes as they are written
/// (ascending cookies), so writing it reads no entry scattered in the
/// heap (those reads, cache misses, were most of a change's directory
/// write in PostMark's profile).
#[derive(Debug, Clone, Default)]
struct Block {
    image: Vec<u8>,
    count: u16,
}

#[derive(Debug, Clone)]
pub struct Dir {
    /// The cookie the next entry gets (cookies 1 and 2 are `.` and `..`).
    next_cookie: u64,
    /// Every entry by cookie, with the block holding it.
    entries: BTreeMap<u64, (Entry, u32)>,
    names: HashMap<Vec<u8>, u64>,
    blocks: Vec<Block>,
    /// Blocks changed since the directory was last written.
    dirty: BTreeSet<u32>,
    /// No block below this one has room for the longest entry.
    full_below: usize,
}

/// Equal content: the same entries and next cookie, wherever they sit.
impl PartialEq for Dir {
    fn eq(&self, other: &Dir) -> bool {
        self.next_cookie == other.next_cookie && self.iter().eq(other.iter())
    }
}
impl Eq for Dir {}

impl Default for Dir {
    fn default() -> Dir {
        Dir::new()
    }
}

impl Dir {
    pub fn new() -> Dir {
        Dir {
            next_cookie: 3,
            entries: BTreeMap::new(),
            names: HashMap::new(),
            blocks: Vec::new(),
            dirty: BTreeSet::new(),
            full_below: 0,
        }
    }

    pub fn next_cookie(&self) -> u64 {
        self.next_cookie
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries in cookie (readdir) order.
    pub fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values().map(|(e, _)| e)
    }

    /// Entries whose cookie is above `cookie` (a readdir offset).
    pub fn after(&self, cookie: u64) -> impl Iterator<Item = &Entry> {
        self.entries.range(cookie.saturating_add(1)..).map(|(_, (e, _))| e)
    }

    pub fn find(&self, name: &[u8]) -> Option<&Entry> {
        self.names.get(name).and_then(|c| self.entries.get(c)).map(|(e, _)| e)
    }

    /// Add an entry (the name must be new); refused past MAX_ENTRIES or
    /// MAX_BLOCKS.
    pub fn insert(&mut self, name: &[u8], ino: u64, kind: Kind) -> Result<()> {
        assert!(!self.names.contains_key(name), "insert of a name the directory holds");
        if self.entries.len() >= MAX_ENTRIES {
            return Err(FsError::TooManyLinks);
        }
        let entry = Entry { cookie: self.next_cookie, ino, kind, name: name.to_vec() };
        let block = self.block_with_room(entry.encoded_len(), MAX_BLOCKS)?;
        self.next_cookie += 1;
        self.place(entry, block);
        self.dirty.insert(block);
        Ok(())
    }

    /// Point an existing name at another inode (a rename's exchange: the
    /// entry keeps its place and cookie); false if the name is absent.
    pub fn retarget(&mut self, name: &[u8], ino: u64, kind: Kind) -> bool {
        let Some((e, block)) = self.names.get(name).and_then(|c| self.entries.get_mut(c)) else {
            return false;
        };
        (e.ino, e.kind) = (ino, kind);
        let b = &mut self.blocks[*block as usize];
        let (at, _) = dirblock::entry_at(&b.image, e.cookie).expect("an entry is in its block's bytes");
        b.image[at + 8..at + 16].copy_from_slice(&ino.to_le_bytes());
        b.image[at + 16] = kind as u8;
        self.dirty.insert(*block);
        true
    }

    pub fn remove(&mut self, name: &[u8]) -> Option<Entry> {
        let cookie = self.names.remove(name)?;
        let (e, block) = self.entries.remove(&cookie)?;
        let b = &mut self.blocks[block as usize];
        let (at, len) = dirblock::entry_at(&b.image, cookie).expect("an entry is in its block's bytes");
        b.image.drain(at..at + len);
        b.count -= 1;
        self.dirty.insert(block);
        self.full_below = self.full_below.min(block as usize);
        Some(e)
    }

    /// The bytes the object holds for this directory: its blocks (one,
    /// empty, for a directory with none).
    pub fn size(&self) -> u64 {
        (self.blocks.len().max(1) * BLOCK) as u64
    }

    /// Most bytes the next change's write may take (for make-room): the
    /// blocks already dirty (all of them for a directory read in the
    /// old whole format) and what one change dirties.
    pub fn write_bound(&self) -> u64 {
        (self.dirty.len() as u64 + CHANGE_BLOCKS) * BLOCK as u64
    }

    /// The whole directory as its object holds it.
    pub fn encode(&self) -> Vec<u8> {
        let count = self.blocks.len().max(1);
        let mut out = Vec::with_capacity(count * BLOCK);
        for i in 0..count {
            out.extend_from_slice(&self.encode_block(i as u32));
        }
        out
    }

    /// The dirty blocks as writes (object offset, bytes), each run of
    /// neighbours one write, the highest first so that block 0 (the
    /// block count) lands after a block it counts; clears them.
    pub fn take_writes(&mut self) -> Vec<(u64, Vec<u8>)> {
        let dirty = std::mem::take(&mut self.dirty);
        let mut runs: Vec<(u32, Vec<u8>)> = Vec::new();
        for &b in &dirty {
            let bytes = self.encode_block(b);
            match runs.last_mut() {
                Some((start, run)) if *start as usize + run.len() / BLOCK == b as usize => {
                    run.extend_from_slice(&bytes)
                }
                _ => runs.push((b, bytes)),
            }
        }
        runs.into_iter().rev().map(|(b, run)| (b as u64 * BLOCK as u64, run)).collect()
    }

    fn encode_block(&self, i: u32) -> Vec<u8> {
        let empty = Block::default();
        let b = self.blocks.get(i as usize).unwrap_or(&empty);
        let blocks = if i == 0 { self.blocks.len().max(1) as u32 } else { 0 };
        dirblock::encode(i, blocks, self.next_cookie, b.count, &b.image)
    }

    /// Decode a directory object's bytes (either format), every check
    /// made: each block's own by `dirblock`, and across blocks here.
    pub fn decode(b: &[u8], ino: u64) -> Result<Dir> {
        match dirblock::decode(b, ino)? {
            Stored::Whole(next_cookie, entries) => Dir::from_whole(next_cookie, entries, ino),
            Stored::Blocks(blocks) => Dir::from_blocks(blocks, ino),
        }
    }

    /// Blocks as decoded: the directory's next cookie is the highest any
    /// block was written with (every insert writes the block it fills).
    fn from_blocks(blocks: Vec<(u64, Vec<Entry>)>, ino: u64) -> Result<Dir> {
        let next_cookie = blocks.iter().map(|(c, _)| *c).max().unwrap_or(3);
        let mut dir = Dir::loading(next_cookie, blocks.len());
        for (i, (_, entries)) in blocks.into_iter().enumerate() {
            for e in entries {
                dir.load(e, i as u32, ino)?;
            }
        }
        Ok(dir)
    }

    /// Place a decoded entry, refusing what no writer makes.
    fn load(&mut self, e: Entry, block: u32, ino: u64) -> Result<()> {
        if self.entries.len() >= MAX_ENTRIES
            || e.cookie >= self.next_cookie
            || self.entries.contains_key(&e.cookie)
            || self.names.contains_key(&e.name)
        {
            let detail = format!("block {block}: entry cookie {} of {}: a name or cookie twice", e.cookie, self.len());
            return Err(FsError::corrupt("directory", ino, detail));
        }
        self.place(e, block);
        Ok(())
    }

    /// The first block with room for `len` more bytes, or a new one if
    /// there are fewer than `limit`.
    fn block_with_room(&mut self, len: usize, limit: usize) -> Result<u32> {
        let longest = ENTRY_HEAD + MAX_NAME;
        for i in self.full_below..self.blocks.len() {
            let used = self.blocks[i].image.len();
            if used + len <= BLOCK_ROOM {
                return Ok(i as u32);
            }
            if self.full_below == i && used + longest > BLOCK_ROOM {
                self.full_below = i + 1;
            }
        }
        if self.blocks.len() >= limit {
            return Err(FsError::TooManyLinks);
        }
        self.blocks.push(Block::default());
        // Block 0 holds the count of blocks.
        self.dirty.insert(0);
        Ok(self.blocks.len() as u32 - 1)
    }

    /// Put `entry` into `block` (which has room) without dirtying it.
    fn place(&mut self, entry: Entry, block: u32) {
        let b = &mut self.blocks[block as usize];
        dirblock::push_entry(&mut b.image, &entry);
        b.count += 1;
        self.names.insert(entry.name.clone(), entry.cookie);
        self.entries.insert(entry.cookie, (entry, block));
    }

    /// A directory being decoded: `blocks` empty blocks, nothing dirty.
    fn loading(next_cookie: u64, blocks: usize) -> Dir {
        Dir { next_cookie, blocks: vec![Block::default(); blocks], ..Dir::new() }
    }

    /// A directory decoded from the old whole format: every entry placed
    /// anew, every block dirty, so the first change writes the blocked
    /// form whole (one write: the old bytes it overwrites are never read
    /// again, block 0 saying what the object is).
    fn from_whole(next_cookie: u64, entries: Vec<Entry>, ino: u64) -> Result<Dir> {
        let mut dir = Dir::loading(next_cookie, 0);
        for e in entries {
            let block = dir.block_with_room(e.encoded_len(), MAX_READ_BLOCKS)?;
            dir.load(e, block, ino)?;
        }
        dir.dirty = (0..dir.blocks.len().max(1) as u32).collect();
        Ok(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Dir {
        let mut d = Dir::new();
        d.insert(b"a", 5, Kind::File).unwrap();
        d.insert(b"sub", 6, Kind::Dir).unwrap();
        d.insert(b"gone", 7, Kind::File).unwrap();
        d.remove(b"gone");
        d
    }

    #[test]
    fn round_trip_and_golden_header() {
        let d = sample();
        let b = d.encode();
        assert_eq!(b.len(), BLOCK);
        assert_eq!(Dir::decode(&b, 1).unwrap(), d);
        // Magic, version 2, count 2, index 0, blocks 1, next cookie 6.
        assert_eq!(&b[..24], &[b'T', b'F', b'D', b'B', 2, 0, 2, 0, 0, 0, 0, 0, 1, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0]);
        // The first entry: cookie 3, inode 5, kind 1, name "a".
        assert_eq!(&b[24..24 + 19], &[3, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 1, 1, b'a']);
    }

    #[test]
    fn a_change_writes_the_block_it_touches() {
        let mut d = Dir::new();
        for i in 0..2000u64 {
            d.insert(format!("file-{i:05}").as_bytes(), 10 + i, Kind::File).unwrap();
        }
        let whole = d.take_writes();
        assert_eq!(whole.len(), 1, "neighbouring dirty blocks go as one write");
        assert_eq!(whole[0].1.len() as u64, d.size());
        assert!(d.size() > 10 * BLOCK as u64);
        d.remove(b"file-01000");
        let w = d.take_writes();
        assert_eq!(w.iter().map(|(_, b)| b.len()).sum::<usize>(), BLOCK, "one block for an unlink");
        // The freed room is taken by the next create: still one block.
        d.insert(b"new", 9999, Kind::File).unwrap();
        assert_eq!(
            d.take_writes(),
            w.iter().map(|(o, _)| (*o, d.encode()[*o as usize..][..BLOCK].to_vec())).collect::<Vec<_>>()
        );
        // A new block rewrites block 0 (its count) after it.
        let mut full = d.clone();
        let before = full.size();
        let mut i = 0;
        while full.size() == before {
            full.insert(format!("more-{i}").as_bytes(), 20_000 + i, Kind::File).unwrap();
            i += 1;
        }
        let w = full.take_writes();
        assert_eq!(
            w.last().map(|(o, _)| *o),
            Some(0),
            "block 0 last: {:?}",
            w.iter().map(|(o, _)| o).collect::<Vec<_>>()
        );
        assert_eq!(Dir::decode(&full.encode(), 1).unwrap(), full);
    }

    #[test]
    fn readdir_order_is_cookie_order_across_blocks() {
        let mut d = Dir::new();
        for i in 0..600u64 {
            d.insert(format!("{i:0200}").as_bytes(), 10 + i, Kind::File).unwrap();
        }
        for i in (0..600u64).step_by(3) {
            d.remove(format!("{i:0200}").as_bytes());
        }
        d.insert(b"late", 5000, Kind::File).unwrap();
        let back = Dir::decode(&d.encode(), 1).unwrap();
        let cookies: Vec<u64> = back.iter().map(|e| e.cookie).collect();
        assert!(cookies.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(back.iter().last().map(|e| &e.name[..]), Some(&b"late"[..]));
        assert_eq!(back.after(cookies[10]).next().map(|e| e.cookie), Some(cookies[11]));
        assert_eq!(back, d);
    }

    #[test]
    fn full_directories_are_refused() {
        let mut d = Dir::new();
        let long = [b'x'; 200];
        let mut i = 0u64;
        let err = loop {
            let mut name = long.to_vec();
            name.extend_from_slice(format!("{i}").as_bytes());
            if let Err(e) = d.insert(&name, 10 + i, Kind::File) {
                break e;
            }
            i += 1;
            assert!(i < 1 << 20, "a bound must stop it");
        };
        assert!(matches!(err, FsError::TooManyLinks));
        assert_eq!(d.size(), MAX_BYTES as u64);
    }

    fn sample4() -> Dir {
        let mut d = Dir::new();
        for (i, name) in ["a", "sub", "gone", "z"].iter().enumerate() {
            d.insert(name.as_bytes(), 5 + i as u64, Kind::File).unwrap();
        }
        d.remove(b"gone");
        d
    }

    #[test]
    fn damage_and_truncation_are_errors() {
        let good = sample4().encode();
        for cut in (0..good.len()).step_by(7) {
            assert!(Dir::decode(&good[..cut], 1).is_err(), "cut at {cut}");
        }
        for at in 0..good.len() {
            let mut b = good.clone();
            b[at] ^= 0x01;
            assert!(Dir::decode(&b, 1).is_err(), "flip at {at}");
        }
    }

    /// A block moved to another place, or block 0 of a longer directory
    /// standing alone, is refused: each block says where it belongs.
    #[test]
    fn misplaced_blocks_are_errors() {
        let mut d = Dir::new();
        for i in 0..400u64 {
            d.insert(format!("{i:040}").as_bytes(), 10 + i, Kind::File).unwrap();
        }
        let b = d.encode();
        assert!(b.len() >= 3 * BLOCK);
        assert_eq!(Dir::decode(&b, 1).unwrap(), d);
        assert!(Dir::decode(&b[..BLOCK], 1).is_err(), "block 0 counts more blocks");
        let mut swapped = b.clone();
        swapped[BLOCK..2 * BLOCK].copy_from_slice(&b[2 * BLOCK..3 * BLOCK]);
        swapped[2 * BLOCK..3 * BLOCK].copy_from_slice(&b[BLOCK..2 * BLOCK]);
        assert!(Dir::decode(&swapped, 1).is_err());
        let mut head = [0u8; dirblock::PROBE];
        head.copy_from_slice(&b[..dirblock::PROBE]);
        assert_eq!(dirblock::stored_len(&head, 1).unwrap(), b.len());
    }

    /// The version 1 whole format older pools hold still reads, and its
    /// first write is the blocked directory whole.
    #[test]
    fn the_whole_format_reads_and_converts() {
        let entry = |cookie, ino, name: &[u8]| Entry { cookie, ino, kind: Kind::File, name: name.to_vec() };
        let mut b = dirblock::encode_whole(7, &[entry(3, 5, b"a"), entry(5, 8, b"bb")]);
        let mut head = [0u8; dirblock::PROBE];
        head.copy_from_slice(&b[..dirblock::PROBE]);
        assert_eq!(dirblock::stored_len(&head, 1).unwrap(), b.len());
        let mut d = Dir::decode(&b, 1).unwrap();
        assert_eq!(d.iter().map(|e| (e.cookie, e.ino)).collect::<Vec<_>>(), [(3, 5), (5, 8)]);
        assert_eq!(d.next_cookie(), 7);
        let w = d.take_writes();
        assert_eq!(w, [(0, d.encode())], "the whole directory, blocked, in one write");
        assert_eq!(Dir::decode(&w[0].1, 1).unwrap(), d);
        b[40] ^= 1;
        assert!(Dir::decode(&b, 1).is_err());
    }

    /// Random creates, unlinks and exchanges against a model: after each
    /// batch the writes `take_writes` gives, laid over the object's bytes,
    /// decode to the directory and to the model.
    #[test]
    fn the_writes_of_each_change_rebuild_the_directory() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut d = Dir::new();
        let mut model: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
        let mut object: Vec<u8> = Vec::new();
        for step in 0..3000u64 {
            let name = format!("{}{}", "n".repeat(rng.random_range(1..120)), rng.random_range(0..400)).into_bytes();
            match (model.contains_key(&name), rng.random_range(0..3)) {
                (false, _) => {
                    d.insert(&name, 100 + step, Kind::File).unwrap();
                    model.insert(name, 100 + step);
                }
                (true, 0) => {
                    assert!(d.retarget(&name, 7, Kind::Dir));
                    model.insert(name, 7);
                }
                (true, _) => {
                    assert_eq!(d.remove(&name).map(|e| e.name), Some(name.clone()));
                    model.remove(&name);
                }
            }
            if step % 10 == 0 {
                for (at, bytes) in d.take_writes() {
                    let end = at as usize + bytes.len();
                    object.resize(object.len().max(end), 0);
                    object[at as usize..end].copy_from_slice(&bytes);
                }
                let back = Dir::decode(&object[..d.size() as usize], 1).unwrap();
                assert_eq!(back, d, "step {step}");
                let mut seen: Vec<(Vec<u8>, u64)> = back.iter().map(|e| (e.name.clone(), e.ino)).collect();
                seen.sort();
                assert_eq!(seen, model.iter().map(|(n, i)| (n.clone(), *i)).collect::<Vec<_>>(), "step {step}");
            }
        }
        assert!(d.size() > 4 * BLOCK as u64);
    }

    /// The largest whole-format directory an older tarn could write (16
    /// MiB of 255-byte names) takes more than MAX_BLOCKS once blocked: it
    /// still reads, converts and loses entries, and takes no new block.
    #[test]
    fn the_largest_whole_format_directory_still_converts() {
        let n = 61_000u64;
        let name = |i: u64| {
            let mut name = format!("{i:07}").into_bytes();
            name.resize(255, b'x');
            name
        };
        let entries: Vec<Entry> =
            (0..n).map(|i| Entry { cookie: 3 + i, ino: 10 + i, kind: Kind::File, name: name(i) }).collect();
        let b = dirblock::encode_whole(3 + n, &entries);
        assert!(b.len() <= MAX_BYTES);
        let mut d = Dir::decode(&b, 1).unwrap();
        assert!(d.size() > MAX_BYTES as u64, "{} bytes of blocks", d.size());
        let blocked = d.encode();
        assert_eq!(Dir::decode(&blocked, 1).unwrap(), d);
        // The last block's room is taken; no block is added.
        let size = d.size();
        let mut i = 0u8;
        let err = loop {
            if let Err(e) = d.insert(&[b'a' + i; 255], 5, Kind::File) {
                break e;
            }
            i += 1;
            assert!(i < 14, "a block holds at most 14 such entries");
        };
        assert!(matches!(err, FsError::TooManyLinks));
        assert_eq!(d.size(), size);
        assert!(d.remove(&name(0)).is_some());
        assert_eq!(d.len(), n as usize + usize::from(i) - 1);
    }

    #[test]
    fn names() {
        assert!(matches!(check_name(&[b'x'; 256]), Err(FsError::NameTooLong)));
        assert!(check_name(&[b'x'; 255]).is_ok());
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0"] {
            assert!(check_name(bad).is_err());
        }
    }
}
