//! A directory's content, as its object holds it (docs/FORMAT.md *File
//! volumes*): a checksummed header, then entries in cookie order. A
//! cookie is given once per directory and never changes, so a readdir
//! offset (the last cookie seen) stays valid while entries come and go.

use crate::error::{FsError, Result};
use crate::namespace::inode::Kind;
use tarn_format::checksum::crc32c;

const MAGIC: &[u8; 4] = b"TFSD";
const VERSION: u8 = 1;
pub const HEADER: usize = 32;
/// POSIX NAME_MAX.
pub const MAX_NAME: usize = 255;
/// Bounds a directory (and every decode loop): 256 Ki entries, 16 MiB
/// (under one engine write, so a directory is rewritten by one write).
pub const MAX_ENTRIES: usize = 1 << 18;
pub const MAX_BYTES: usize = 16 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub cookie: u64,
    pub ino: u64,
    pub kind: Kind,
    pub name: Vec<u8>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dir {
    /// The cookie the next entry gets (cookies 1 and 2 are `.` and `..`).
    pub next_cookie: u64,
    /// Ascending by cookie.
    pub entries: Vec<Entry>,
}

/// A name a directory may hold: 1..=255 bytes, no '/' or NUL, not . or ..
pub fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > MAX_NAME {
        return Err(FsError::NameTooLong);
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0) {
        return Err(FsError::Invalid("bad file name"));
    }
    Ok(())
}

impl Dir {
    pub fn new() -> Dir {
        Dir { next_cookie: 3, entries: Vec::new() }
    }

    pub fn find(&self, name: &[u8]) -> Option<&Entry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// Add an entry (the name must be new); refused past MAX_ENTRIES.
    pub fn insert(&mut self, name: &[u8], ino: u64, kind: Kind) -> Result<()> {
        if self.entries.len() >= MAX_ENTRIES || self.encoded_len() + 18 + name.len() > MAX_BYTES {
            return Err(FsError::TooManyLinks);
        }
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        self.entries.push(Entry { cookie, ino, kind, name: name.to_vec() });
        Ok(())
    }

    /// Point an existing name at another inode (a rename's exchange: the
    /// entry keeps its place and cookie); false if the name is absent.
    pub fn retarget(&mut self, name: &[u8], ino: u64, kind: Kind) -> bool {
        match self.entries.iter_mut().find(|e| e.name == name) {
            Some(e) => {
                (e.ino, e.kind) = (ino, kind);
                true
            }
            None => false,
        }
    }

    pub fn remove(&mut self, name: &[u8]) -> Option<Entry> {
        let at = self.entries.iter().position(|e| e.name == name)?;
        Some(self.entries.remove(at))
    }

    fn encoded_len(&self) -> usize {
        HEADER + self.entries.iter().map(|e| 18 + e.name.len()).sum::<usize>()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(self.encoded_len() - HEADER);
        for e in &self.entries {
            body.extend_from_slice(&e.cookie.to_le_bytes());
            body.extend_from_slice(&e.ino.to_le_bytes());
            body.push(e.kind as u8);
            body.push(e.name.len() as u8);
            body.extend_from_slice(&e.name);
        }
        let mut out = Vec::with_capacity(HEADER + body.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&[VERSION, 0, 0, 0]);
        out.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.next_cookie.to_le_bytes());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&[0; 8]);
        out.extend_from_slice(&body);
        let crc = sum(&out);
        out[24..28].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decode with every check (the object may hold anything).
    pub fn decode(b: &[u8], ino: u64) -> Result<Dir> {
        let bad = |d: String| FsError::corrupt("directory", ino, d);
        if b.len() < HEADER || &b[..4] != MAGIC || b[4] != VERSION || b[5..8] != [0; 3] || b[28..32] != [0; 4] {
            return Err(bad(format!("header of {} bytes", b.len())));
        }
        let word = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let count = word(8) as usize;
        let next_cookie = u64::from_le_bytes(b[12..20].try_into().map_err(|_| bad("cookie".into()))?);
        let len = word(20) as usize;
        if count > MAX_ENTRIES || len != b.len() - HEADER || sum(b) != word(24) {
            return Err(bad(format!("{count} entries, body {len} of {} bytes, or checksum", b.len() - HEADER)));
        }
        let mut dir = Dir { next_cookie, entries: Vec::with_capacity(count) };
        let mut r = &b[HEADER..];
        for _ in 0..count {
            let e = decode_entry(&mut r).ok_or_else(|| bad("truncated entry".into()))?;
            let after = dir.entries.last().map_or(2, |p| p.cookie);
            if e.cookie <= after || e.cookie >= next_cookie || e.ino < 2 || check_name(&e.name).is_err() {
                return Err(bad(format!("entry cookie {} inode {}", e.cookie, e.ino)));
            }
            if dir.find(&e.name).is_some() {
                return Err(bad("a name twice".into()));
            }
            dir.entries.push(e);
        }
        if !r.is_empty() {
            return Err(bad(format!("{} trailing bytes", r.len())));
        }
        Ok(dir)
    }
}

/// crc32c of a whole encoding with its crc field (bytes 24..28) as zeros.
fn sum(b: &[u8]) -> u32 {
    let mut copy = b.to_vec();
    copy[24..28].fill(0);
    crc32c(&copy)
}

fn decode_entry(r: &mut &[u8]) -> Option<Entry> {
    let head = r.get(..18)?;
    let cookie = u64::from_le_bytes(head[..8].try_into().ok()?);
    let ino = u64::from_le_bytes(head[8..16].try_into().ok()?);
    let kind = Kind::from_byte(head[16])?;
    let n = usize::from(head[17]);
    let name = r.get(18..18 + n)?.to_vec();
    *r = &r[18 + n..];
    Some(Entry { cookie, ino, kind, name })
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
        assert_eq!(Dir::decode(&b, 1).unwrap(), d);
        assert_eq!(&b[..16], &[b'T', b'F', b'S', b'D', 1, 0, 0, 0, 2, 0, 0, 0, 6, 0, 0, 0]);
        // The first entry: cookie 3, inode 5, kind 1, name "a".
        assert_eq!(&b[HEADER..HEADER + 19], &[3, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 1, 1, b'a']);
    }

    #[test]
    fn damage_and_truncation_are_errors() {
        let good = sample().encode();
        for cut in 0..good.len() {
            assert!(Dir::decode(&good[..cut], 1).is_err(), "cut at {cut}");
        }
        for at in 0..good.len() {
            let mut b = good.clone();
            b[at] ^= 0x01;
            assert!(Dir::decode(&b, 1).is_err(), "flip at {at}");
        }
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
