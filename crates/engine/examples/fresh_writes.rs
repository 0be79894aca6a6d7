//! Fresh 4 KiB random writes into an empty thin volume at the engine level
//! (every write a new map entry), a flush every 256, then random 4 KiB
//! reads: the map's cost per write, for twin builds side by side. Wall
//! time depends on load; `perf stat -e instructions` does not. FLUSH_EVERY
//! 0 never flushes (back-pressure commits only, as `bench/layout.sh`'s
//! first writes); SUMS 1 keeps data checksums (the pool default).
//!
//!   cargo run --release -p tarn-engine --example fresh_writes -- DIR [WRITES [FLUSH_EVERY [SUMS]]]

use std::sync::Arc;
use std::time::Instant;
use tarn_engine::{create_pool, CreateOptions, Device, FileDevice, OpenOptions, Pool};

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args.next().unwrap_or_else(|| "/var/tmp".into());
    let writes: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(200_000);
    let flush_every: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(256);
    let sums = args.next().is_some_and(|s| s == "1");
    let path = std::path::Path::new(&dir).join(format!("tarn-fresh-writes-{}.img", std::process::id()));
    let dev: Arc<dyn Device> = Arc::new(FileDevice::create_file(&path, 8 << 30).expect("create"));
    let opts = CreateOptions { no_checksums: !sums, ..Default::default() };
    create_pool(std::slice::from_ref(&dev), &[path.display().to_string()], &opts).expect("create pool");
    let pool = Pool::open(vec![dev], OpenOptions { no_discard: true, ..Default::default() }).expect("open");
    let blocks: u64 = 1 << 20;
    let v = pool.create_volume("a", blocks * 4096).expect("volume").id;
    let buf = vec![0x5au8; 4096];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let t = Instant::now();
    for i in 0..writes {
        pool.write(v, (next() % blocks) * 4096, &buf, false).expect("write");
        if flush_every > 0 && i % flush_every == flush_every - 1 {
            pool.flush().expect("flush");
        }
    }
    let w = t.elapsed().as_secs_f64();
    let mut out = vec![0u8; 4096];
    let t = Instant::now();
    for _ in 0..writes {
        pool.read(v, (next() % blocks) * 4096, &mut out).expect("read");
    }
    let r = t.elapsed().as_secs_f64();
    let extents = pool.volume_info(v).map(|i| i.extents).unwrap_or(0);
    println!(
        "{writes} fresh 4K writes: {:.0}/s; reads {:.0}/s; {extents} extents",
        writes as f64 / w,
        writes as f64 / r
    );
    drop(pool);
    let _ = std::fs::remove_file(&path);
}
