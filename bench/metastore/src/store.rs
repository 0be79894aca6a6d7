//! The small interface every candidate metadata store implements, and the
//! extent-map semantics shared by all of them.

/// One mapping: volume blocks `[lba, lba + len)` live at pool blocks
/// `[pba, pba + len)`, written by commit `birth`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub lba: u64,
    pub len: u32,
    pub pba: u64,
    pub birth: u64,
}

pub trait MetaStore {
    /// Map `[lba, lba + len)` of volume `vol` to `[pba, pba + len)`, as a
    /// write does: what it overlaps is trimmed or split, and it merges with
    /// its predecessor when both are contiguous and of the same commit.
    fn insert_extent(&mut self, vol: u32, lba: u64, len: u32, pba: u64, birth: u64);
    /// The extent covering `lba` (predecessor search), as of the last commit.
    fn lookup(&self, vol: u32, lba: u64) -> Option<Extent>;
    /// Make every insert so far durable (returns once it is on the device).
    fn commit(&mut self);
    /// Bytes the store occupies on its device(s).
    fn device_bytes(&self) -> u64;
    /// Map entries (extents), as of the last commit.
    fn entries(&self) -> u64;
    /// Resident memory of the process.
    fn resident_bytes(&self) -> u64 {
        vmrss()
    }
}

/// VmRSS of this process in bytes (0 if /proc is not there).
pub fn vmrss() -> u64 {
    proc_status_kb("VmRSS:") * 1024
}

pub fn vmhwm() -> u64 {
    proc_status_kb("VmHWM:") * 1024
}

fn proc_status_kb(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// Append one 32-byte log record (vol, lba, len, pba, birth) to a commit's
/// pending bytes, which start with a header of `header` zero bytes.
pub fn push_record(pending: &mut Vec<u8>, header: usize, vol: u32, lba: u64, len: u32, pba: u64, birth: u64) {
    if pending.is_empty() {
        pending.resize(header, 0);
    }
    pending.extend_from_slice(&vol.to_le_bytes());
    pending.extend_from_slice(&lba.to_le_bytes());
    pending.extend_from_slice(&len.to_le_bytes());
    pending.extend_from_slice(&pba.to_le_bytes());
    pending.extend_from_slice(&birth.to_le_bytes());
}

/// Key order: volume, then lba (a big-endian (u32, u64) tuple as one integer).
pub fn key(vol: u32, lba: u64) -> u128 {
    ((vol as u128) << 64) | lba as u128
}

pub fn key_vol(k: u128) -> u32 {
    (k >> 64) as u32
}

pub fn key_lba(k: u128) -> u64 {
    k as u64
}

/// The value of a map entry: 20 bytes on disk (len u32, pba u64, birth u64).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Val {
    pub len: u32,
    pub pba: u64,
    pub birth: u64,
}

impl Val {
    pub fn encode(&self) -> [u8; 20] {
        let mut b = [0u8; 20];
        b[0..4].copy_from_slice(&self.len.to_le_bytes());
        b[4..12].copy_from_slice(&self.pba.to_le_bytes());
        b[12..20].copy_from_slice(&self.birth.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; 20]) -> Val {
        Val {
            len: u32::from_le_bytes(b[0..4].try_into().unwrap()),
            pba: u64::from_le_bytes(b[4..12].try_into().unwrap()),
            birth: u64::from_le_bytes(b[12..20].try_into().unwrap()),
        }
    }

    pub fn extent(&self, k: u128) -> Extent {
        Extent { lba: key_lba(k), len: self.len, pba: self.pba, birth: self.birth }
    }
}

/// The ordered-map operations the extent semantics need.
pub trait Ordered {
    /// Greatest entry with key <= k.
    fn pred(&mut self, k: u128) -> Option<(u128, Val)>;
    /// Least entry with key >= k.
    fn succ(&mut self, k: u128) -> Option<(u128, Val)>;
    fn put(&mut self, k: u128, v: Val);
    fn del(&mut self, k: u128);
}

/// Insert an extent with the semantics of `MetaStore::insert_extent`.
pub fn apply<O: Ordered>(o: &mut O, vol: u32, lba: u64, len: u32, pba: u64, birth: u64) {
    let end = lba + len as u64;
    let k = key(vol, lba);
    // the entry before the new extent once overlaps are gone: a merge candidate
    let mut before = None;
    if let Some((pk, pv)) = o.pred(k) {
        if key_vol(pk) == vol {
            let plba = key_lba(pk);
            let pend = plba + pv.len as u64;
            if pend > lba {
                // overlaps the start: keep its head, and its tail past the new extent
                if plba < lba {
                    let head = Val { len: (lba - plba) as u32, ..pv };
                    o.put(pk, head);
                    before = Some((pk, head));
                } else {
                    o.del(pk);
                    before = o.pred(k).filter(|(bk, _)| key_vol(*bk) == vol);
                }
                if pend > end {
                    o.put(key(vol, end), Val { len: (pend - end) as u32, pba: pv.pba + (end - plba), birth: pv.birth });
                }
            } else {
                before = Some((pk, pv));
            }
        }
    }
    // entries starting inside the new extent
    while let Some((nk, nv)) = o.succ(k + 1) {
        if key_vol(nk) != vol || key_lba(nk) >= end {
            break;
        }
        o.del(nk);
        let nend = key_lba(nk) + nv.len as u64;
        if nend > end {
            o.put(key(vol, end), Val { len: (nend - end) as u32, pba: nv.pba + (end - key_lba(nk)), birth: nv.birth });
            break;
        }
    }
    match before {
        // contiguous in both spaces and of this commit: one extent
        Some((bk, bv))
            if key_lba(bk) + bv.len as u64 == lba && bv.pba + bv.len as u64 == pba && bv.birth == birth =>
        {
            o.put(bk, Val { len: bv.len + len, pba: bv.pba, birth })
        }
        _ => o.put(k, Val { len, pba, birth }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    struct M(BTreeMap<u128, Val>);
    impl Ordered for M {
        fn pred(&mut self, k: u128) -> Option<(u128, Val)> {
            self.0.range(..=k).next_back().map(|(a, b)| (*a, *b))
        }
        fn succ(&mut self, k: u128) -> Option<(u128, Val)> {
            self.0.range(k..).next().map(|(a, b)| (*a, *b))
        }
        fn put(&mut self, k: u128, v: Val) {
            self.0.insert(k, v);
        }
        fn del(&mut self, k: u128) {
            self.0.remove(&k);
        }
    }

    #[test]
    fn overwrite_splits_and_merges() {
        let mut m = M(BTreeMap::new());
        apply(&mut m, 1, 0, 10, 100, 1);
        apply(&mut m, 1, 4, 2, 500, 2);
        let v: Vec<_> = m.0.iter().map(|(k, v)| (key_lba(*k), v.len, v.pba)).collect();
        assert_eq!(v, vec![(0, 4, 100), (4, 2, 500), (6, 4, 106)]);
        apply(&mut m, 1, 6, 1, 502, 2); // contiguous with (4, 2, 500) of the same commit
        let v: Vec<_> = m.0.iter().map(|(k, v)| (key_lba(*k), v.len, v.pba)).collect();
        assert_eq!(v, vec![(0, 4, 100), (4, 3, 500), (7, 3, 107)]);
        apply(&mut m, 1, 2, 20, 900, 3);
        let v: Vec<_> = m.0.iter().map(|(k, v)| (key_lba(*k), v.len, v.pba)).collect();
        assert_eq!(v, vec![(0, 2, 100), (2, 20, 900)]);
    }
}
