//! Measures what the metadata-store decision rests on: the cost of one
//! durable commit of 1,000 map changes on a file device, map lookups per
//! second with 1M extents, and pool open time. `cargo run --release -p
//! tarn-engine --example commit_cost -- /path/on/target/fs`
//! (numbers go into docs/ARCHITECTURE.md; not a test).

use std::sync::Arc;
use std::time::Instant;
use tarn_engine::extent_map::ExtentMap;
use tarn_engine::{create_pool, CreateOptions, Device, FileDevice, OpenOptions, Pool};
use tarn_format::Pba;

fn main() {
    let dir = std::env::args().nth(1).unwrap_or_else(|| "/tmp".into());
    let path = std::path::Path::new(&dir).join("tarn-commit-cost.img");
    let _ = std::fs::remove_file(&path);
    let dev: Arc<dyn Device> = Arc::new(FileDevice::create_file(&path, 8 << 30).expect("create"));
    create_pool(std::slice::from_ref(&dev), &[path.display().to_string()], &CreateOptions::default())
        .expect("create pool");
    let pool = Pool::open(vec![dev], OpenOptions { no_discard: true, ..Default::default() }).expect("open");
    let vol = pool.create_volume("v", 4 << 30).expect("volume").id;
    let block = vec![0xa5u8; 4096];
    let mut x: u64 = 88172645463325252;
    let mut lat = Vec::new();
    for _ in 0..200 {
        for _ in 0..1000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            pool.write(vol, (x % (1 << 20)) * 4096, &block, false).expect("write");
        }
        let t = Instant::now();
        pool.flush().expect("flush");
        lat.push(t.elapsed().as_secs_f64() * 1e3);
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    println!("durable commit of 1,000 random 4K writes: median {:.2} ms, p90 {:.2} ms", lat[100], lat[180]);
    let t = Instant::now();
    pool.checkpoint().expect("checkpoint");
    println!(
        "checkpoint of {} extents: {:.1} ms",
        pool.volume_info(vol).map(|v| v.extents).unwrap_or(0),
        t.elapsed().as_secs_f64() * 1e3
    );
    pool.close().expect("close");
    drop(pool);
    let t = Instant::now();
    let dev: Arc<dyn Device> = Arc::new(FileDevice::open(&path, true).expect("open file"));
    let pool = Pool::open(vec![dev], OpenOptions::default()).expect("reopen");
    println!(
        "open with {} extents: {:.1} ms",
        pool.volume_info(vol).map(|v| v.extents).unwrap_or(0),
        t.elapsed().as_secs_f64() * 1e3
    );
    drop(pool);
    let _ = std::fs::remove_file(&path);

    let store = Arc::new(tarn_store::Store::memory());
    let mut map = ExtentMap::new(store, tarn_engine::extent_map::tree_id::head(1));
    for i in 0..1_000_000u64 {
        map.insert(i * 2, 1, Pba::new(0, 100 + i * 3), 1).expect("insert");
    }
    let t = Instant::now();
    let mut hits = 0;
    for i in 0..2_000_000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        hits += map.lookup((x ^ i) % 2_000_000, 1, 4).expect("lookup").len();
    }
    let secs = t.elapsed().as_secs_f64();
    println!("map lookups with 1M extents: {:.2} M/s ({hits} segments)", 2.0 / secs);
}
