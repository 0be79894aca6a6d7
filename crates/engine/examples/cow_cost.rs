//! What a first write to a block a snapshot shares costs the engine,
//! against the same write with no snapshot (an in-place overwrite) and a
//! first write to unwritten space (an allocation): CPU
//! and wall time per 4 KiB write, in process (no NBD, no client), twin
//! pools per round, the order rotating. Not a test.
//!
//! `cargo run --release -p tarn-engine --example cow_cost -- /var/tmp/x [--writes 200000] [--rounds 3] [--gib 2] [--modes fresh,none,snap,snap10]`
//!
//! Each pool: one file, a volume of `--gib` GiB written sequentially in
//! 1 MiB writes and flushed (not for `fresh`); the `snap` twin then takes
//! one snapshot.
//! Timed: `--writes` 4 KiB writes to distinct blocks in a scattered order
//! (every one breaks sharing on the `snap` twin), a flush every 256 as the
//! aging benchmark's client does. CPU time is the process's (user +
//! system: the writes and the commits they trigger), so other users of
//! the machine disturb it less than the wall time.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use tarn_engine::{create_pool, CreateOptions, Device, FileDevice, OpenOptions, Pool};

const BS: u64 = 4096;
const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn cpu_seconds() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn arg(args: &[String], name: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().unwrap_or_else(|_| panic!("{name} needs a number")))
}

/// What the timed writes land on.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Unwritten space: every write allocates.
    Fresh,
    /// A sequentially written volume: in-place overwrites.
    Overwrite,
    /// The same with a snapshot: every write breaks sharing.
    Snap,
    /// Ten snapshots, 1% of the blocks rewritten at random before each
    /// (the snapshot benchmark's k=10): every write breaks sharing, on a
    /// map and dead lists those rewrites cut up.
    Snap10,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Fresh => "fresh",
            Mode::Overwrite => "none",
            Mode::Snap => "snap",
            Mode::Snap10 => "snap10",
        }
    }
}

/// A pool with one volume `v`, filled sequentially unless `Fresh`; `Snap`
/// adds a snapshot.
fn prepare(path: &Path, gib: u64, mode: Mode) -> Pool {
    let _ = std::fs::remove_file(path);
    let dev: Arc<dyn Device> = Arc::new(FileDevice::create_file(path, gib * GIB * 3).expect("create pool file"));
    create_pool(std::slice::from_ref(&dev), &[path.display().to_string()], &CreateOptions::default())
        .expect("create pool");
    let pool = Pool::open(vec![dev], OpenOptions::default()).expect("open pool");
    let vol = pool.create_volume("v", gib * GIB).expect("create volume").id;
    let buf = vec![0x5a; MIB as usize];
    let filled = if mode == Mode::Fresh { 0 } else { gib * GIB / MIB };
    for i in 0..filled {
        pool.write(vol, i * MIB, &buf, false).expect("fill");
    }
    pool.flush().expect("flush");
    match mode {
        Mode::Snap => {
            pool.create_snapshot("v", "s").expect("snapshot");
        }
        Mode::Snap10 => churn_and_snapshot(&pool, vol, gib, 10),
        Mode::Fresh | Mode::Overwrite => {}
    }
    pool
}

/// `n` times: rewrite 1% of the volume's blocks at random (4 KiB writes),
/// then take a snapshot.
fn churn_and_snapshot(pool: &Pool, vol: u32, gib: u64, n: u32) {
    let blocks = gib * GIB / BS;
    let buf = vec![0x3c; BS as usize];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for s in 0..n {
        for _ in 0..blocks / 100 {
            // xorshift: a scattered block, repeats allowed (as fio's norandommap).
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            pool.write(vol, (x % blocks) * BS, &buf, false).expect("churn");
        }
        pool.flush().expect("flush");
        pool.create_snapshot("v", &format!("s{s}")).expect("snapshot");
    }
}

/// Time `writes` 4 KiB writes to distinct blocks: (cpu us, wall us) per write.
fn timed_writes(pool: &Pool, gib: u64, writes: u64) -> (f64, f64) {
    let vol = pool.volume_id("v").expect("volume v");
    let blocks = gib * GIB / BS;
    // A stride coprime with the (power of two) block count visits each
    // block once, scattered.
    let stride = (2_654_435_761u64 % blocks) | 1;
    let buf = vec![0xa5; BS as usize];
    let (cpu, wall) = (cpu_seconds(), Instant::now());
    for i in 0..writes.min(blocks) {
        pool.write(vol, (i * stride % blocks) * BS, &buf, false).expect("write");
        if i % 256 == 255 {
            pool.flush().expect("flush");
        }
    }
    pool.flush().expect("flush");
    let n = writes.min(blocks) as f64;
    ((cpu_seconds() - cpu) * 1e6 / n, wall.elapsed().as_secs_f64() * 1e6 / n)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = args.first().filter(|a| !a.starts_with('-')).map_or(PathBuf::from("/var/tmp"), PathBuf::from);
    let (writes, rounds, gib) = (arg(&args, "--writes", 200_000), arg(&args, "--rounds", 3), arg(&args, "--gib", 2));
    let only = args.iter().position(|a| a == "--modes").and_then(|i| args.get(i + 1)).cloned().unwrap_or_default();
    println!("round mode   cpu_us/write  wall_us/write  load1");
    for r in 0..rounds {
        let mut order = [Mode::Fresh, Mode::Overwrite, Mode::Snap, Mode::Snap10];
        let n = order.len();
        order.rotate_left(r as usize % n);
        for mode in order.into_iter().filter(|m| only.is_empty() || only.contains(m.name())) {
            let path = dir.join(format!("tarn-cow-cost-{}.img", mode.name()));
            let pool = prepare(&path, gib, mode);
            let (cpu, wall) = timed_writes(&pool, gib, writes);
            let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
            let name = mode.name();
            println!("{r:5} {name:6} {cpu:13.2} {wall:14.2}  {}", load.split(' ').next().unwrap_or(""));
            drop(pool);
            let _ = std::fs::remove_file(&path);
        }
    }
}
