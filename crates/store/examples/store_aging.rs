//! The aging workload at the metadata level, on the store alone: N random
//! 4 KiB writes over a volume of V blocks, each a map insert (physical
//! blocks handed out sequentially, as linear placement does), a checkpoint
//! whenever the dirty nodes pass a bound, node blocks on a file with
//! pwrite + fdatasync. Prints inserts/s, checkpoint times, node bytes
//! written, resident memory, tree size, cold reopen + lookup rates.
//!
//! cargo run --release -p tarn-store --example store_aging -- FILE [N] [V] [CACHE_MIB] [BUFFERED_BYTES]

use std::fs::OpenOptions;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tarn_format::Pba;
use tarn_store::extents::Extent;
use tarn_store::{ExtentTree, FileIo, NodeAlloc, RootRef, Store};

/// Node blocks: a free list (reused) then a bump pointer.
struct Alloc {
    next: u64,
    free: Vec<Pba>,
}

impl NodeAlloc for Alloc {
    fn alloc_node(&mut self) -> Option<Pba> {
        Some(self.free.pop().unwrap_or_else(|| {
            self.next += 1;
            Pba::new(0, self.next)
        }))
    }
}

fn rss_mib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1));
    kib.and_then(|k| k.parse::<u64>().ok()).unwrap_or(0) / 1024
}

fn arg(i: usize, default: u64) -> u64 {
    std::env::args().nth(i).and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 - 1.0) * p) as usize).copied().unwrap_or(0.0)
}

fn main() {
    let path = std::env::args().nth(1).expect("usage: store_aging FILE [N] [V] [CACHE_MIB] [BUFFERED_BYTES]");
    let (n, vol_blocks) = (arg(2, 2_000_000), arg(3, 16 << 20));
    let (cache_mib, dirty_max) = (arg(4, 256), arg(5, 32 << 20));
    let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).expect("open");
    let io = Arc::new(FileIo::new(file));
    let store = Store::new(io.clone(), (cache_mib << 20) as usize).expect("store");
    let mut map = ExtentTree::new(&store, 1);
    let mut alloc = Alloc { next: 16, free: Vec::new() };
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut ckpt_ms = Vec::new();
    let mut root = RootRef::EMPTY;
    let t0 = Instant::now();
    let mut last = Instant::now();
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let lba = x % vol_blocks;
        let e = Extent { len: 1, pba: Pba::new(1, 1 + i), birth: 1 };
        map.insert(&store, lba, e).expect("insert");
        if store.buffered_bytes() >= dirty_max || i + 1 == n {
            let t = Instant::now();
            let frozen = map.freeze();
            let merged = frozen.write(&store, &mut alloc, i).expect("write");
            io.file.sync_data().expect("fdatasync");
            assert!(map.tree.adopt(&frozen, &merged));
            root = merged.root;
            for pba in merged.superseded {
                store.forget(pba);
                alloc.free.push(pba);
            }
            ckpt_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        if last.elapsed().as_secs() >= 10 {
            last = Instant::now();
            let s = store.cache.stats();
            eprintln!(
                "{i} inserts, {:.0}/s, rss {} MiB, cache {} MiB",
                i as f64 / t0.elapsed().as_secs_f64(),
                rss_mib(),
                s.bytes >> 20
            );
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let s = store.cache.stats();
    let nodes_written = io.writes.load(Ordering::Relaxed);
    let used_blocks = alloc.next - 16 - alloc.free.len() as u64;
    println!("inserts {n} over {vol_blocks} blocks in {secs:.1} s: {:.0} inserts/s", n as f64 / secs);
    println!(
        "extents {} ; tree blocks in use {used_blocks} = {:.1} bytes/extent",
        map.counts.extents,
        used_blocks as f64 * 4096.0 / map.counts.extents as f64
    );
    println!("metadata on disk vs data written (4 KiB each): {:.3}%", used_blocks as f64 * 100.0 / n as f64);
    println!(
        "checkpoints {} (buffered bytes bound {dirty_max}): median {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        ckpt_ms.len(),
        pct(&mut ckpt_ms, 0.5),
        pct(&mut ckpt_ms, 0.99),
        pct(&mut ckpt_ms, 1.0)
    );
    println!("node blocks written {nodes_written} = {:.1} KiB per insert", nodes_written as f64 * 4.0 / n as f64);
    println!(
        "cache {cache_mib} MiB: hits {} misses {} evictions {}; rss {} MiB",
        s.hits,
        s.misses,
        s.evictions,
        rss_mib()
    );
    drop(map);
    drop(store);
    let t = Instant::now();
    let cold = Store::new(io.clone(), (cache_mib << 20) as usize).expect("store");
    let reopened = ExtentTree::open(&cold, 1, root, Default::default()).expect("open");
    reopened.lookup(&cold, 12345, 1, 4).expect("lookup");
    println!("cold open + first lookup {:.2} ms", t.elapsed().as_secs_f64() * 1e3);
    let t = Instant::now();
    let lookups = 200_000;
    for _ in 0..lookups {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        reopened.lookup(&cold, x % vol_blocks, 1, 4).expect("lookup");
    }
    println!(
        "random lookups (cold cache filling): {:.0}/s; rss {} MiB",
        lookups as f64 / t.elapsed().as_secs_f64(),
        rss_mib()
    );
}
