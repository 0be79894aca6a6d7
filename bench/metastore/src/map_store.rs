//! The shape of today's engine: the whole map in a std `BTreeMap`, one
//! compact log record appended (pwrite + fdatasync) per commit, and, when
//! the log passes `checkpoint_bytes` (tarn's journal: 64 MiB), a checkpoint of
//! the whole map (delta + varint encoded, as tarn's are compact) written,
//! synced and renamed in, after which the log starts over. Open = load the
//! checkpoint + replay the log.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::store::{apply, key, key_lba, key_vol, Extent, MetaStore, Ordered, Val};

const REC: usize = 32; // vol u32, lba u64, len u32, pba u64, birth u64

struct M<'a>(&'a mut BTreeMap<u128, Val>);

impl Ordered for M<'_> {
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

pub struct MapStore {
    map: BTreeMap<u128, Val>,
    dir: PathBuf,
    log: File,
    log_len: u64,
    pending: Vec<u8>,
    checkpoint_bytes: u64,
    pub checkpoints: u64,
}

fn fnv(b: &[u8]) -> u64 {
    let mut h = 0xcbf29ce484222325u64;
    for x in b {
        h = (h ^ *x as u64).wrapping_mul(0x100000001b3);
    }
    h
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(b: &[u8], at: &mut usize) -> u64 {
    let mut v = 0u64;
    let mut s = 0;
    loop {
        let x = b[*at];
        *at += 1;
        v |= ((x & 0x7f) as u64) << s;
        if x < 0x80 {
            return v;
        }
        s += 7;
    }
}

fn zigzag(d: i64) -> u64 {
    ((d << 1) ^ (d >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

impl MapStore {
    pub fn open(dir: &Path, checkpoint_bytes: u64) -> MapStore {
        let mut map = BTreeMap::new();
        // checkpoint: [n u64] then per entry varints: vol delta, lba delta
        // (from the previous key of the same volume), len, pba delta (zigzag), birth
        if let Ok(mut f) = File::open(dir.join("checkpoint")) {
            let mut b = Vec::new();
            f.read_to_end(&mut b).unwrap();
            let n = u64::from_le_bytes(b[0..8].try_into().unwrap());
            let mut at = 8;
            let (mut vol, mut lba, mut pba) = (0u64, 0u64, 0i64);
            for _ in 0..n {
                let dv = get_varint(&b, &mut at);
                if dv != 0 {
                    vol += dv;
                    lba = 0;
                }
                lba += get_varint(&b, &mut at);
                let len = get_varint(&b, &mut at) as u32;
                pba += unzigzag(get_varint(&b, &mut at));
                let birth = get_varint(&b, &mut at);
                map.insert(key(vol as u32, lba), Val { len, pba: pba as u64, birth });
            }
        }
        let log = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(dir.join("log")).unwrap();
        // log: records [count u32][count * REC bytes][fnv u64]; stops at the first bad one
        let mut b = Vec::new();
        (&log).read_to_end(&mut b).unwrap();
        let mut at = 0usize;
        while at + 4 <= b.len() {
            let n = u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
            let end = at + 4 + n * REC;
            if n == 0 || end + 8 > b.len() || fnv(&b[at..end]) != u64::from_le_bytes(b[end..end + 8].try_into().unwrap()) {
                break;
            }
            for r in b[at + 4..end].chunks_exact(REC) {
                let vol = u32::from_le_bytes(r[0..4].try_into().unwrap());
                let lba = u64::from_le_bytes(r[4..12].try_into().unwrap());
                let len = u32::from_le_bytes(r[12..16].try_into().unwrap());
                let pba = u64::from_le_bytes(r[16..24].try_into().unwrap());
                let birth = u64::from_le_bytes(r[24..32].try_into().unwrap());
                apply(&mut M(&mut map), vol, lba, len, pba, birth);
            }
            at = end + 8;
        }
        MapStore { map, dir: dir.to_path_buf(), log, log_len: at as u64, pending: Vec::new(), checkpoint_bytes, checkpoints: 0 }
    }

    fn checkpoint(&mut self) {
        let mut b = Vec::with_capacity(8 + self.map.len() * 10);
        b.extend_from_slice(&(self.map.len() as u64).to_le_bytes());
        let (mut vol, mut lba, mut pba) = (0u64, 0u64, 0i64);
        for (k, v) in &self.map {
            let kv = key_vol(*k) as u64;
            if kv != vol {
                put_varint(&mut b, kv - vol);
                vol = kv;
                lba = 0;
            } else {
                put_varint(&mut b, 0);
            }
            put_varint(&mut b, key_lba(*k) - lba);
            lba = key_lba(*k);
            put_varint(&mut b, v.len as u64);
            put_varint(&mut b, zigzag(v.pba as i64 - pba));
            pba = v.pba as i64;
            put_varint(&mut b, v.birth);
        }
        let tmp = self.dir.join("checkpoint.new");
        let mut f = File::create(&tmp).unwrap();
        f.write_all(&b).unwrap();
        f.sync_data().unwrap();
        std::fs::rename(&tmp, self.dir.join("checkpoint")).unwrap();
        File::open(&self.dir).unwrap().sync_all().unwrap();
        self.log.set_len(0).unwrap();
        self.log.sync_data().unwrap();
        self.log_len = 0;
        self.checkpoints += 1;
    }
}

impl MetaStore for MapStore {
    fn insert_extent(&mut self, vol: u32, lba: u64, len: u32, pba: u64, birth: u64) {
        apply(&mut M(&mut self.map), vol, lba, len, pba, birth);
        crate::store::push_record(&mut self.pending, 4, vol, lba, len, pba, birth);
    }

    fn lookup(&self, vol: u32, lba: u64) -> Option<Extent> {
        let (k, v) = self.map.range(..=key(vol, lba)).next_back()?;
        let e = v.extent(*k);
        (key_vol(*k) == vol && e.lba + e.len as u64 > lba).then_some(e)
    }

    fn commit(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let n = ((self.pending.len() - 4) / REC) as u32;
        self.pending[0..4].copy_from_slice(&n.to_le_bytes());
        let sum = fnv(&self.pending);
        self.pending.extend_from_slice(&sum.to_le_bytes());
        self.log.write_all_at(&self.pending, self.log_len).unwrap();
        self.log.sync_data().unwrap();
        self.log_len += self.pending.len() as u64;
        self.pending.clear();
        if self.log_len >= self.checkpoint_bytes {
            self.checkpoint();
        }
    }

    fn entries(&self) -> u64 {
        self.map.len() as u64
    }

    fn device_bytes(&self) -> u64 {
        let sz = |n: &str| std::fs::metadata(self.dir.join(n)).map(|m| m.len()).unwrap_or(0);
        sz("checkpoint") + sz("log")
    }
}
