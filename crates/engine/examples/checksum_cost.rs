//! What data checksums cost the engine, with and without them, on a file
//! device: 4K random overwrites (a flush every 32, as a client would; the
//! first pass opens the overwrite regions), 4K random reads, 1M sequential
//! reads and fresh 1M sequential writes. Wall time per phase; for numbers
//! that do not depend on the machine's load, run it under callgrind with
//! `--toggle-collect='*phase_*'` (bench/checksums_cpu.sh does both).
//!
//!   cargo run --release -p tarn-engine --example checksum_cost -- DIR sums|nosums [PHASE]
//! PHASE: all (default), or one of randwrite, randread, seqread, seqwrite.

use std::sync::Arc;
use std::time::Instant;
use tarn_engine::{create_pool, CreateOptions, Device, FileDevice, OpenOptions, Pool};

const MIB: u64 = 1 << 20;
const VOL: u64 = 256 * MIB;
const OPS: u64 = 50_000;

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args.next().unwrap_or_else(|| "/var/tmp".into());
    let sums = args.next().as_deref() != Some("nosums");
    let phase = args.next().unwrap_or_else(|| "all".into());
    let path = std::path::Path::new(&dir).join(format!("tarn-checksum-cost-{}.img", std::process::id()));
    let dev: Arc<dyn Device> = Arc::new(FileDevice::create_file(&path, 2 << 30).expect("create"));
    let opts = CreateOptions { no_checksums: !sums, ..Default::default() };
    create_pool(std::slice::from_ref(&dev), &[path.display().to_string()], &opts).expect("create pool");
    let pool = Pool::open(vec![dev], OpenOptions { no_discard: true, ..Default::default() }).expect("open");
    let a = pool.create_volume("a", VOL).expect("volume").id;
    let b = pool.create_volume("b", VOL).expect("volume").id;
    let chunk = vec![0x5au8; MIB as usize];
    for i in 0..VOL / MIB {
        pool.write(a, i * MIB, &chunk, false).expect("prefill");
    }
    pool.flush().expect("flush");
    let run = |name: &str, f: &dyn Fn()| {
        if phase == "all" || phase == name {
            let t = Instant::now();
            f();
            println!("{} {name}: {:.3} s", if sums { "sums" } else { "nosums" }, t.elapsed().as_secs_f64());
        }
    };
    run("randwrite", &|| phase_randwrite(&pool, a));
    run("randread", &|| phase_randread(&pool, a));
    run("seqread", &|| phase_seqread(&pool, a));
    run("seqwrite", &|| phase_seqwrite(&pool, b));
    let _ = std::fs::remove_file(&path);
}

fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[inline(never)]
fn phase_randwrite(pool: &Pool, vol: u32) {
    let block = vec![0xa5u8; 4096];
    let mut x = 88172645463325252u64;
    for i in 0..OPS {
        pool.write(vol, (next(&mut x) % (VOL / 4096)) * 4096, &block, false).expect("write");
        if i % 32 == 31 {
            pool.flush().expect("flush");
        }
    }
    pool.flush().expect("flush");
}

#[inline(never)]
fn phase_randread(pool: &Pool, vol: u32) {
    let mut block = vec![0u8; 4096];
    let mut x = 1234567u64;
    for _ in 0..OPS {
        pool.read(vol, (next(&mut x) % (VOL / 4096)) * 4096, &mut block).expect("read");
    }
}

#[inline(never)]
fn phase_seqread(pool: &Pool, vol: u32) {
    let mut buf = vec![0u8; MIB as usize];
    for _ in 0..4 {
        for i in 0..VOL / MIB {
            pool.read(vol, i * MIB, &mut buf).expect("read");
        }
    }
}

#[inline(never)]
fn phase_seqwrite(pool: &Pool, vol: u32) {
    let buf = vec![0x3cu8; MIB as usize];
    for i in 0..VOL / MIB {
        pool.write(vol, i * MIB, &buf, false).expect("write");
    }
    pool.flush().expect("flush");
}
