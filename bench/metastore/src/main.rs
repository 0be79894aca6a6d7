//! Metadata-store comparison on the aging workload, at the metadata level:
//! N random 4 KiB writes over a volume of V blocks, each an extent insert
//! (random lba, pba = the next block, as linear placement gives), a durable
//! commit after every C inserts; then lookups of written blocks in random
//! order (predecessor search; all hit), then a reopen in a
//! fresh process (page cache dropped when allowed) with a first lookup.
//!
//!   metastore-bench BACKEND DIR [--n N] [--vol-blocks V] [--commit-every C]
//!       [--lookups L] [--cache-mib M] [--checkpoint-mib K] [--seed S]
//!       [--progress P] [--no-drop-caches] [--dirty-nodes D]
//!   BACKEND: redb | btreemap | tarn   (tarn: tarn's own B-tree, crates/store;
//!   build with --features tarn-store; D: dirty nodes that trigger its checkpoint)
//!
//! Prints a progress line per P inserts and, last, `RESULT {json}` for
//! bench/metastore.sh. DIR/BACKEND is wiped first.

mod map_store;
mod redb_store;
mod store;

#[cfg(feature = "tarn-store")]
mod tarn_store;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use store::{vmhwm, vmrss, MetaStore};

struct Opts {
    backend: String,
    dir: PathBuf,
    n: u64,
    vol_blocks: u64,
    commit_every: u64,
    lookups: u64,
    cache_mib: u64,
    checkpoint_mib: u64,
    dirty_nodes: u64,
    seed: u64,
    progress: u64,
    drop_caches: bool,
    open_only: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: metastore-bench redb|btreemap|tarn DIR [--n N] [--vol-blocks V] [--commit-every C] [--lookups L] \
         [--cache-mib M] [--checkpoint-mib K] [--seed S] [--progress P] [--no-drop-caches] [--dirty-nodes D]"
    );
    std::process::exit(2)
}

fn parse() -> Opts {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if a.len() < 2 {
        usage();
    }
    let mut o = Opts {
        backend: a[0].clone(),
        dir: PathBuf::from(&a[1]),
        n: 1_000_000,
        vol_blocks: 16 << 20, // 64 GiB of 4 KiB blocks
        commit_every: 256,
        lookups: 1_000_000,
        cache_mib: 256,
        checkpoint_mib: 64,
        dirty_nodes: 16384,
        seed: 32,
        progress: 0,
        drop_caches: true,
        open_only: false,
    };
    let mut i = 2;
    while i < a.len() {
        let num = |i: usize| -> u64 {
            let s = a.get(i + 1).unwrap_or_else(|| usage());
            let (d, m) = match s.chars().last() {
                Some('K') | Some('k') => (&s[..s.len() - 1], 1_000),
                Some('M') | Some('m') => (&s[..s.len() - 1], 1_000_000),
                _ => (&s[..], 1),
            };
            d.parse::<u64>().unwrap_or_else(|_| usage()) * m
        };
        match a[i].as_str() {
            "--n" => o.n = num(i),
            "--vol-blocks" => o.vol_blocks = num(i),
            "--commit-every" => o.commit_every = num(i),
            "--lookups" => o.lookups = num(i),
            "--cache-mib" => o.cache_mib = num(i),
            "--checkpoint-mib" => o.checkpoint_mib = num(i),
            "--seed" => o.seed = num(i),
            "--dirty-nodes" => o.dirty_nodes = num(i),
            "--progress" => o.progress = num(i),
            "--no-drop-caches" => {
                o.drop_caches = false;
                i += 1;
                continue;
            }
            "--open-only" => {
                o.open_only = true;
                i += 1;
                continue;
            }
            _ => usage(),
        }
        i += 2;
    }
    if o.progress == 0 {
        o.progress = (o.n / 10).max(1);
    }
    o
}

const GAMMA: u64 = 0x9e3779b97f4a7c15;

/// splitmix64: output i is mix(seed + (i + 1) * GAMMA), so the lba of any
/// earlier insert can be found again for the lookups.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GAMMA);
        mix(self.0)
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
    z ^ (z >> 31)
}

/// The lba the i-th insert wrote.
fn written_lba(o: &Opts, i: u64) -> u64 {
    mix(o.seed.wrapping_add((i + 1).wrapping_mul(GAMMA))) % o.vol_blocks
}

fn open(o: &Opts, dir: &Path) -> Box<dyn MetaStore> {
    match o.backend.as_str() {
        "redb" => Box::new(redb_store::RedbStore::open(dir, (o.cache_mib << 20) as usize)),
        "btreemap" => Box::new(map_store::MapStore::open(dir, o.checkpoint_mib << 20)),
        #[cfg(feature = "tarn-store")]
        "tarn" => Box::new(tarn_store::TarnStore::open(dir, o.checkpoint_mib << 20, o.dirty_nodes, (o.cache_mib << 20) as usize)),
        #[cfg(not(feature = "tarn-store"))]
        "tarn" => {
            eprintln!("backend tarn: built without it; build with --features tarn-store (see Cargo.toml)");
            std::process::exit(2)
        }
        b => {
            eprintln!("unknown backend {b}");
            usage()
        }
    }
}

fn pct(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Lookups of blocks the fill wrote (random order): every one should hit.
fn lookups(s: &dyn MetaStore, o: &Opts, seed: u64) -> (f64, u64) {
    let mut rng = Rng(seed);
    let mut hits = 0u64;
    let t = Instant::now();
    for _ in 0..o.lookups {
        if s.lookup(1, written_lba(o, rng.next() % o.n)).is_some() {
            hits += 1;
        }
    }
    (o.lookups as f64 / t.elapsed().as_secs_f64(), hits)
}

fn drop_caches() -> bool {
    unsafe_sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

fn unsafe_sync() {
    // sync(1) rather than libc: no dependency for one call
    let _ = std::process::Command::new("sync").status();
}

/// Child mode: open the store (cold), time the first lookup and then lookups.
fn open_only(o: &Opts) {
    let dir = o.dir.join(&o.backend);
    let t = Instant::now();
    let s = open(o, &dir);
    let open_ms = ms(t.elapsed());
    let t = Instant::now();
    let first = s.lookup(1, written_lba(o, o.n / 2));
    let first_ms = ms(t.elapsed());
    let rss_open = vmrss();
    let (lps, hits) = lookups(s.as_ref(), o, o.seed ^ 0x5555);
    println!(
        "OPEN {{\"open_ms\": {open_ms:.3}, \"first_lookup_ms\": {first_ms:.3}, \"first_hit\": {}, \"rss_after_open\": {rss_open}, \
         \"lookups_per_s_after_open\": {lps:.0}, \"hits_after_open\": {hits}, \"entries_after_open\": {}, \"rss_after_lookups\": {}}}",
        first.is_some(),
        s.entries(),
        vmrss()
    );
}

fn main() {
    let o = parse();
    if o.open_only {
        open_only(&o);
        return;
    }
    let dir = o.dir.join(&o.backend);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create DIR/BACKEND");
    println!(
        "backend {} dir {} n {} vol_blocks {} ({} GiB) commit_every {} cache_mib {} checkpoint_mib {} dirty_nodes {} seed {}",
        o.backend,
        dir.display(),
        o.n,
        o.vol_blocks,
        o.vol_blocks * 4096 >> 30,
        o.commit_every,
        o.cache_mib,
        o.checkpoint_mib,
        o.dirty_nodes,
        o.seed
    );
    let rss0 = vmrss();
    let mut s = open(&o, &dir);
    let mut rng = Rng(o.seed);
    let mut lat: Vec<u32> = Vec::with_capacity((o.n / o.commit_every + 1) as usize);
    let mut seg: Vec<u32> = Vec::new();
    let t0 = Instant::now();
    let mut tseg = Instant::now();
    let mut tbatch = Instant::now();
    let mut birth = 1u64;
    println!(
        "{:>10} {:>10} {:>11} {:>11} {:>11} {:>10} {:>12}",
        "inserts", "inserts/s", "batch p50ms", "batch p99ms", "batch maxms", "RSS MiB", "device MiB"
    );
    for i in 0..o.n {
        let lba = rng.next() % o.vol_blocks;
        s.insert_extent(1, lba, 1, i, birth);
        if (i + 1) % o.commit_every == 0 || i + 1 == o.n {
            s.commit();
            birth += 1;
            let us = tbatch.elapsed().as_micros().min(u32::MAX as u128) as u32;
            lat.push(us);
            seg.push(us);
            tbatch = Instant::now();
        }
        if (i + 1) % o.progress == 0 || i + 1 == o.n {
            seg.sort_unstable();
            let done = (i + 1) % o.progress;
            let k = if done == 0 { o.progress } else { done };
            println!(
                "{:>10} {:>10.0} {:>11.2} {:>11.2} {:>11.2} {:>10.0} {:>12.1}",
                i + 1,
                k as f64 / tseg.elapsed().as_secs_f64(),
                pct(&seg, 0.5),
                pct(&seg, 0.99),
                pct(&seg, 1.0),
                vmrss() as f64 / (1 << 20) as f64,
                s.device_bytes() as f64 / (1 << 20) as f64
            );
            seg.clear();
            tseg = Instant::now();
        }
    }
    let fill = t0.elapsed();
    let rss_fill = s.resident_bytes();
    let dev = s.device_bytes();
    let (lps, hits) = lookups(s.as_ref(), &o, o.seed ^ 0xaaaa);
    let rss_lookups = vmrss();
    let hwm = vmhwm();
    let extents = s.entries();
    drop(s);
    let dropped = o.drop_caches && drop_caches();
    let exe = std::env::current_exe().unwrap();
    let mut cmd = std::process::Command::new(exe);
    cmd.arg(&o.backend).arg(&o.dir).arg("--open-only");
    for (k, v) in [
        ("--n", o.n),
        ("--vol-blocks", o.vol_blocks),
        ("--lookups", o.lookups),
        ("--cache-mib", o.cache_mib),
        ("--checkpoint-mib", o.checkpoint_mib),
        ("--dirty-nodes", o.dirty_nodes),
        ("--seed", o.seed),
    ] {
        cmd.arg(k).arg(v.to_string());
    }
    let out = cmd.output().expect("reopen child");
    let child = String::from_utf8_lossy(&out.stdout);
    let open_json = child.lines().find_map(|l| l.strip_prefix("OPEN ")).unwrap_or("null").to_string();
    lat.sort_unstable();
    println!("fill: {} inserts in {:.1} s = {:.0} inserts/s; {} commits", o.n, fill.as_secs_f64(), o.n as f64 / fill.as_secs_f64(), lat.len());
    println!(
        "commit latency (batch of {} inserts + durable commit): median {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms",
        o.commit_every,
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        pct(&lat, 0.999),
        pct(&lat, 1.0)
    );
    println!("lookups of written blocks after the fill: {lps:.0}/s ({hits} of {} hit); {extents} extents", o.lookups);
    println!(
        "RSS: start {:.0} MiB, after fill {:.0} MiB, after lookups {:.0} MiB, peak {:.0} MiB",
        rss0 as f64 / 1048576.0,
        rss_fill as f64 / 1048576.0,
        rss_lookups as f64 / 1048576.0,
        hwm as f64 / 1048576.0
    );
    println!("device bytes at the end: {dev} ({:.1} per extent)", dev as f64 / extents.max(1) as f64);
    println!("reopen in a fresh process (page cache dropped: {dropped}): {open_json}");
    if !out.status.success() {
        println!("reopen child failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    println!(
        "RESULT {{\"backend\": \"{}\", \"n\": {}, \"vol_blocks\": {}, \"commit_every\": {}, \"cache_mib\": {}, \"fill_s\": {:.3}, \
         \"inserts_per_s\": {:.0}, \"commit_p50_ms\": {:.3}, \"commit_p99_ms\": {:.3}, \"commit_p999_ms\": {:.3}, \"commit_max_ms\": {:.3}, \
         \"lookups_per_s\": {:.0}, \"extents\": {}, \"rss_fill\": {}, \"rss_lookups\": {}, \"hwm\": {}, \"device_bytes\": {}, \
         \"caches_dropped\": {}, \"open\": {}}}",
        o.backend,
        o.n,
        o.vol_blocks,
        o.commit_every,
        o.cache_mib,
        fill.as_secs_f64(),
        o.n as f64 / fill.as_secs_f64(),
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        pct(&lat, 0.999),
        pct(&lat, 1.0),
        lps,
        extents,
        rss_fill,
        rss_lookups,
        hwm,
        dev,
        dropped,
        open_json
    );
}
