//! What snapshots cost at engine level, on a file device: snapshot creation
//! time against how much is written (sequential and 4K-fragmented maps),
//! deletion time against how much changed since, open and list with 1,000
//! snapshots, and reads from snapshots and clone chains. Not a test.
//!
//! `cargo run --release -p tarn-engine --example snapshot_cost -- /var/tmp/x [options]`
//!
//! Options (lists are comma-separated):
//!   --fill-gib 1,64        sequentially written sizes for creation timing
//!                          (a size that does not fit in the scratch fs, with
//!                          8 GiB to spare, is skipped and said so)
//!   --frag-gib 1           size written as 4K random writes (1 extent each)
//!   --reps 20              creations timed per case
//!   --delete-vol-gib 1,8   volume sizes for the deletion timing
//!   --deltas 0,16,256,1024 MiB overwritten (4K random, distinct blocks)
//!                          between the snapshot deleted and the next one
//!   --many 1000            snapshots for the open/list case
//!   --churn 64             4K blocks written between two of those snapshots
//!   --read-gib 1           volume size for the write, snapshot read and
//!                          clone read cases
//!   --clone-depth 8        deepest clone chain read
//!   --delete-modes contig-on,frag-on,frag-off
//!                          deletion timing with the volume first written
//!                          sequentially (contig) or as 4K random writes
//!                          (frag: every freed block its own extent), with
//!                          freed space punched out of the pool file as
//!                          `tarn serve` does (on) or not (off)
//!   --only a,b             sections: write,create,frag,delete,many,read,clone
//!
//! Every timed call runs on an otherwise idle pool opened like `tarn serve`
//! opens it (discard of freed space on). Each row carries the 1-minute load
//! average when it was measured: on a shared machine, re-run noisy rows.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use tarn_engine::{create_pool, CreateOptions, Device, FileDevice, OpenOptions, Pool, View};

const BS: u64 = 4096;
const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

struct Opts {
    dir: PathBuf,
    fill_gib: Vec<u64>,
    frag_gib: Vec<u64>,
    reps: usize,
    delete_vol_gib: Vec<u64>,
    deltas_mib: Vec<u64>,
    many: usize,
    churn: u64,
    read_gib: u64,
    clone_depth: usize,
    delete_modes: Vec<String>,
    only: Vec<String>,
}

fn list(s: &str) -> Vec<u64> {
    s.split(',').filter(|x| !x.is_empty()).map(|x| x.trim().parse().expect("number list")).collect()
}

fn parse_args() -> Opts {
    let mut args = std::env::args().skip(1);
    let mut o = Opts {
        dir: PathBuf::from("/var/tmp"),
        fill_gib: vec![1, 64],
        frag_gib: vec![1],
        reps: 20,
        delete_vol_gib: vec![1, 8],
        deltas_mib: vec![0, 16, 256, 1024],
        many: 1000,
        churn: 64,
        read_gib: 1,
        clone_depth: 8,
        delete_modes: vec!["contig-on".into(), "frag-on".into(), "frag-off".into()],
        only: Vec::new(),
    };
    let mut dir_set = false;
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--fill-gib" => o.fill_gib = list(&val()),
            "--frag-gib" => o.frag_gib = list(&val()),
            "--reps" => o.reps = val().parse().expect("--reps"),
            "--delete-vol-gib" => o.delete_vol_gib = list(&val()),
            "--deltas" => o.deltas_mib = list(&val()),
            "--many" => o.many = val().parse().expect("--many"),
            "--churn" => o.churn = val().parse().expect("--churn"),
            "--read-gib" => o.read_gib = val().parse().expect("--read-gib"),
            "--clone-depth" => o.clone_depth = val().parse().expect("--clone-depth"),
            "--delete-modes" => o.delete_modes = val().split(',').map(str::to_string).collect(),
            "--only" => o.only = val().split(',').map(str::to_string).collect(),
            "-h" | "--help" => {
                eprintln!(
                    "usage: snapshot_cost DIR [--fill-gib 1,64] [--frag-gib 1] [--reps 20] [--delete-vol-gib 1,8]"
                );
                eprintln!(
                    "       [--deltas 0,16,256,1024] [--many 1000] [--churn 64] [--read-gib 1] [--clone-depth 8]"
                );
                eprintln!("       [--only write,create,frag,delete,many,read,clone]");
                std::process::exit(0);
            }
            _ if !dir_set && !a.starts_with('-') => {
                o.dir = PathBuf::from(&a);
                dir_set = true;
            }
            _ => panic!("unknown argument {a}"),
        }
    }
    o
}

fn want(o: &Opts, section: &str) -> bool {
    o.only.is_empty() || o.only.iter().any(|s| s == section)
}

fn load1() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split(' ').next().map(str::to_string))
        .unwrap_or_default()
}

fn free_bytes(dir: &Path) -> u64 {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: statvfs fills the struct we pass; the path is NUL-terminated.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return 0;
        }
        st.f_bavail as u64 * st.f_frsize as u64
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// Block numbers 0..n in random order.
    fn permutation(&mut self, n: u64) -> Vec<u32> {
        let mut v: Vec<u32> = (0..n as u32).collect();
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
        v
    }
}

/// A scratch pool on one sparse file, removed on drop.
struct Scratch {
    path: PathBuf,
    pool: Option<Pool>,
}

impl Scratch {
    fn new(dir: &Path, tag: &str, size: u64) -> Scratch {
        Scratch::with(dir, tag, size, OpenOptions::default())
    }
    fn with(dir: &Path, tag: &str, size: u64, options: OpenOptions) -> Scratch {
        let path = dir.join(format!("tarn-snapshot-cost-{tag}.img"));
        let _ = std::fs::remove_file(&path);
        let dev: Arc<dyn Device> = Arc::new(FileDevice::create_file(&path, size).expect("create pool file"));
        create_pool(std::slice::from_ref(&dev), &[path.display().to_string()], &CreateOptions::default())
            .expect("create pool");
        let pool = Pool::open(vec![dev], options).expect("open pool");
        Scratch { path, pool: Some(pool) }
    }
    fn pool(&self) -> &Pool {
        self.pool.as_ref().expect("pool open")
    }
    /// Open again (timed by the caller); `clean` closes first (checkpoint),
    /// otherwise the pool is dropped as a crash would leave it.
    fn reopen(&mut self, clean: bool) -> f64 {
        if let Some(p) = self.pool.take() {
            if clean {
                p.close().expect("close");
            }
        }
        let t = Instant::now();
        let dev: Arc<dyn Device> = Arc::new(FileDevice::open(&self.path, true).expect("open file"));
        self.pool = Some(Pool::open(vec![dev], OpenOptions::default()).expect("reopen"));
        ms(t)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        self.pool.take();
        let _ = std::fs::remove_file(&self.path);
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

struct Stats {
    n: usize,
    median: f64,
    p90: f64,
    max: f64,
}

fn stats(mut v: Vec<f64>) -> Stats {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        return Stats { n, median: f64::NAN, p90: f64::NAN, max: f64::NAN };
    }
    let at = |q: f64| v[((n as f64 - 1.0) * q).round() as usize];
    Stats { n, median: at(0.5), p90: at(0.9), max: v[n - 1] }
}

struct Table {
    rows: Vec<String>,
    verdicts: Vec<String>,
}

impl Table {
    fn header(&self) {
        println!(
            "{:<48} {:<34} {:>4} {:>10} {:>10} {:>10}  {:>5}  note",
            "measurement", "setup", "n", "median ms", "p90 ms", "max ms", "load1"
        );
        println!("{}", "-".repeat(140));
    }
    fn row(&mut self, what: &str, setup: &str, s: &Stats, note: &str) {
        let line = format!(
            "{:<48} {:<34} {:>4} {:>10.3} {:>10.3} {:>10.3}  {:>5}  {}",
            what,
            setup,
            s.n,
            s.median,
            s.p90,
            s.max,
            load1(),
            note
        );
        println!("{line}");
        self.rows.push(line);
    }
    fn one(&mut self, what: &str, setup: &str, ms: f64, note: &str) {
        self.row(what, setup, &Stats { n: 1, median: ms, p90: ms, max: ms }, note);
    }
    fn info(&mut self, text: &str) {
        println!("  {text}");
    }
    fn verdict(&mut self, text: String) {
        self.verdicts.push(text);
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(seed | 1);
    let mut v = vec![0u8; len];
    for c in v.chunks_mut(8) {
        let x = r.next().to_le_bytes();
        c.copy_from_slice(&x[..c.len()]);
    }
    v
}

/// Write [from, to) bytes of `vol` sequentially in 1 MiB writes, committing
/// every GiB as the server's background committer would; returns seconds.
fn fill_seq(pool: &Pool, vol: u32, from: u64, to: u64) -> f64 {
    let buf = pattern(7, MIB as usize);
    let t = Instant::now();
    let mut at = from;
    while at < to {
        let n = MIB.min(to - at);
        pool.write(vol, at, &buf[..n as usize], false).expect("fill write");
        at += n;
        if at.is_multiple_of(GIB) {
            pool.flush().expect("flush");
        }
    }
    pool.flush().expect("flush");
    t.elapsed().as_secs_f64()
}

/// Write every 4K block of [0, bytes) once, in random order (one extent per
/// block with linear placement); returns seconds.
fn fill_random(pool: &Pool, vol: u32, bytes: u64, rng: &mut Rng) -> f64 {
    let buf = pattern(11, BS as usize);
    let order = rng.permutation(bytes / BS);
    let t = Instant::now();
    for (i, b) in order.iter().enumerate() {
        pool.write(vol, *b as u64 * BS, &buf, false).expect("frag write");
        if i % 16384 == 16383 {
            pool.flush().expect("flush");
        }
    }
    pool.flush().expect("flush");
    t.elapsed().as_secs_f64()
}

/// `n` random 4K writes inside [0, span) bytes.
fn scatter(pool: &Pool, vol: u32, span: u64, n: u64, rng: &mut Rng) {
    let buf = pattern(rng.next(), BS as usize);
    for _ in 0..n {
        pool.write(vol, rng.below(span / BS) * BS, &buf, false).expect("write");
    }
}

fn extents(pool: &Pool, vol: u32) -> u64 {
    pool.volume_info(vol).map(|v| v.extents).unwrap_or(0)
}

fn checkpoints(pool: &Pool) -> u64 {
    pool.counters.checkpoints.load(std::sync::atomic::Ordering::Relaxed)
}

/// Time `reps` snapshot creations of `v` (8 random 4K writes inside the
/// first `written` bytes before each, so every creation commits something),
/// next to plain commits of 8 allocating writes into the unwritten stretch
/// starting at `tail` (the same two flushes without the snapshot); then
/// delete the snapshots again.
fn time_creations(
    t: &mut Table,
    pool: &Pool,
    vol: u32,
    (written, tail): (u64, u64),
    reps: usize,
    setup: &str,
    rng: &mut Rng,
) {
    let buf = pattern(3, BS as usize);
    let mut base = Vec::new();
    for i in 0..reps as u64 {
        for j in 0..8 {
            pool.write(vol, tail + (i * 8 + j) * BS, &buf, false).expect("tail write");
        }
        let s = Instant::now();
        pool.flush().expect("flush");
        base.push(ms(s));
    }
    let ck0 = checkpoints(pool);
    let mut lat = Vec::new();
    for i in 0..reps {
        scatter(pool, vol, written, 8, rng);
        let s = Instant::now();
        pool.create_snapshot("v", &format!("c{i}")).expect("create snapshot");
        lat.push(ms(s));
    }
    let ck = checkpoints(pool) - ck0;
    let ext = extents(pool, vol);
    let st = stats(lat);
    t.row("commit of 8 allocating 4K writes (baseline)", setup, &stats(base), "");
    t.row("create_snapshot", setup, &st, &format!("{ext} extents in the head; {ck} of the commits were checkpoints"));
    t.verdict(format!(
        "create_snapshot, {setup}: median {:.2} ms, p90 {:.2} ms, max {:.2} ms (target <= 5 ms): {}",
        st.median,
        st.p90,
        st.max,
        if st.p90 <= 5.0 {
            "met"
        } else if st.median <= 5.0 {
            "median met, p90 not"
        } else {
            "MISSED"
        }
    ));
    let mut del = Vec::new();
    for i in 0..reps {
        let s = Instant::now();
        pool.delete_snapshot("v", &format!("c{i}")).expect("delete");
        del.push(ms(s));
    }
    t.row("delete_snapshot (8 blocks changed since)", setup, &stats(del), "the creations' snapshots, oldest first");
    let s = Instant::now();
    pool.checkpoint().expect("checkpoint");
    t.one(
        "checkpoint (a journal-full commit)",
        setup,
        ms(s),
        "every commit that finds the journal full pays this, snapshot or not",
    );
}

fn section_create(o: &Opts, t: &mut Table, rng: &mut Rng) {
    let mut sizes = o.fill_gib.clone();
    sizes.sort_unstable();
    sizes.dedup();
    let free = free_bytes(&o.dir);
    let spare = 8 * GIB;
    let fits: Vec<u64> = sizes.iter().copied().filter(|&g| g * GIB + spare <= free).collect();
    for g in sizes.iter().filter(|g| !fits.contains(g)) {
        t.info(&format!(
            "SKIPPED creation at {g} GiB written: {} GiB free in {}, need {} GiB + 8 GiB spare",
            free / GIB,
            o.dir.display(),
            g
        ));
    }
    let Some(&max) = fits.last() else { return };
    let tail = 64 * MIB;
    let sc = Scratch::new(&o.dir, "create", max * GIB + max * GIB / 16 + GIB);
    let pool = sc.pool();
    let vol = pool.create_volume("v", max * GIB + tail).expect("volume").id;
    let mut done = 0;
    for (round, &g) in fits.iter().enumerate() {
        let secs = fill_seq(pool, vol, done, g * GIB);
        t.info(&format!(
            "filled {} GiB sequentially (1 MiB writes) in {:.1} s ({:.0} MB/s)",
            g - done / GIB,
            secs,
            (g * GIB - done) as f64 / secs / 1e6
        ));
        done = g * GIB;
        // Baseline writes go to blocks of the tail no earlier round touched.
        let tail_at = max * GIB + round as u64 * o.reps as u64 * 8 * BS;
        time_creations(t, pool, vol, (done, tail_at), o.reps, &format!("{g} GiB written, sequential"), rng);
    }
}

fn section_frag(o: &Opts, t: &mut Table, rng: &mut Rng) {
    for &g in &o.frag_gib {
        if g * GIB + 4 * GIB > free_bytes(&o.dir) {
            t.info(&format!("SKIPPED fragmented {g} GiB: not enough free space"));
            continue;
        }
        let tail = 64 * MIB;
        let sc = Scratch::new(&o.dir, "frag", 2 * g * GIB + GIB);
        let pool = sc.pool();
        let vol = pool.create_volume("v", g * GIB + tail).expect("volume").id;
        let secs = fill_random(pool, vol, g * GIB, rng);
        t.info(&format!(
            "filled {g} GiB as 4K random writes in {:.1} s ({:.0} writes/s at engine level): {} extents",
            secs,
            (g * GIB / BS) as f64 / secs,
            extents(pool, vol)
        ));
        time_creations(t, pool, vol, (g * GIB, g * GIB), o.reps, &format!("{g} GiB written, 4K random"), rng);
    }
}

/// Deletion against changed data. Each row starts from a fresh pool whose
/// volume is written either sequentially (the data a deletion frees is
/// contiguous on disk wherever the changed blocks are adjacent) or as 4K
/// random writes (every freed block is its own extent): with discard on,
/// the cost per freed extent is a hole punched in the pool file.
fn section_delete(o: &Opts, t: &mut Table, rng: &mut Rng) {
    let mut by_delta: Vec<(String, u64, u64, f64)> = Vec::new();
    for mode in &o.delete_modes {
        let (layout, discard) = match mode.as_str() {
            "contig-on" => ("sequential", true),
            "contig-off" => ("sequential", false),
            "frag-on" => ("4K-random", true),
            "frag-off" => ("4K-random", false),
            _ => panic!("--delete-modes: contig-on, contig-off, frag-on, frag-off"),
        };
        let dmode = if discard { "discard on" } else { "discard off" };
        for &g in &o.delete_vol_gib {
            let need = g * GIB + o.deltas_mib.iter().max().copied().unwrap_or(0) * MIB + 4 * GIB;
            if need > free_bytes(&o.dir) {
                t.info(&format!("SKIPPED deletion on a {g} GiB volume: not enough free space"));
                continue;
            }
            let blocks = g * GIB / BS;
            let buf = pattern(5, BS as usize);
            let mut fill_secs = 0.0;
            for &d in &o.deltas_mib {
                let sc = Scratch::with(
                    &o.dir,
                    "delete",
                    3 * g * GIB + GIB,
                    OpenOptions { no_discard: !discard, ..Default::default() },
                );
                let pool = sc.pool();
                let vol = pool.create_volume("v", g * GIB).expect("volume").id;
                fill_secs += if layout == "sequential" {
                    fill_seq(pool, vol, 0, g * GIB)
                } else {
                    fill_random(pool, vol, g * GIB, rng)
                };
                let n = (d * MIB / BS).min(blocks);
                let reps = if d <= 16 {
                    5
                } else if d <= 256 {
                    3
                } else {
                    1
                };
                let mut lat = Vec::new();
                let mut lat_next = Vec::new();
                let mut freed = 0;
                for _ in 0..reps {
                    pool.create_snapshot("v", "old").expect("snapshot old");
                    let order = rng.permutation(blocks);
                    for b in &order[..n as usize] {
                        pool.write(vol, *b as u64 * BS, &buf, false).expect("write");
                    }
                    pool.flush().expect("flush");
                    pool.create_snapshot("v", "new").expect("snapshot new");
                    let s = Instant::now();
                    freed = pool.delete_snapshot("v", "old").expect("delete old");
                    lat.push(ms(s));
                    let s = Instant::now();
                    pool.delete_snapshot("v", "new").expect("delete new");
                    lat_next.push(ms(s));
                }
                let st = stats(lat);
                by_delta.push((format!("{layout} fill, {dmode}"), g, d, st.median));
                t.row(
                    &format!("delete_snapshot, {dmode}, {layout} fill"),
                    &format!("{d} MiB changed, {g} GiB volume"),
                    &st,
                    &format!("freed {} MiB", freed / MIB),
                );
                t.row("  then delete the next one (0 changed)", &format!("{g} GiB volume"), &stats(lat_next), "");
            }
            t.info(&format!("({g} GiB volumes filled {layout} in {fill_secs:.1} s in all, untimed)"));
        }
    }
    let mut keys: Vec<String> = by_delta.iter().map(|x| x.0.clone()).collect();
    keys.dedup();
    for key in keys {
        let mut summary = String::new();
        for &d in &o.deltas_mib {
            let cells: Vec<String> = by_delta
                .iter()
                .filter(|x| x.0 == key && x.2 == d)
                .map(|(_, g, _, m)| format!("{m:.1} ms on {g} GiB"))
                .collect();
            if !cells.is_empty() {
                summary.push_str(&format!("{d} MiB changed: {}; ", cells.join(", ")));
            }
        }
        t.verdict(format!("delete_snapshot ({key}): {summary}"));
    }
}

fn section_many(o: &Opts, t: &mut Table, rng: &mut Rng) {
    let g = 1;
    let mut sc = Scratch::new(&o.dir, "many", 3 * g * GIB);
    let vol = sc.pool().create_volume("v", g * GIB).expect("volume").id;
    fill_seq(sc.pool(), vol, 0, g * GIB);
    let mut lat = Vec::new();
    let t0 = Instant::now();
    for i in 0..o.many {
        scatter(sc.pool(), vol, g * GIB, o.churn, rng);
        let s = Instant::now();
        sc.pool().create_snapshot("v", &format!("s{i:04}")).expect("snapshot");
        lat.push(ms(s));
    }
    t.info(&format!(
        "took {} snapshots of a 1 GiB volume, {} random 4K writes before each, in {:.1} s",
        o.many,
        o.churn,
        t0.elapsed().as_secs_f64()
    ));
    let k = (o.many / 10).max(1);
    t.row("create_snapshot, first 10% of them", &format!("0..{k} snapshots exist"), &stats(lat[..k].to_vec()), "");
    t.row(
        "create_snapshot, last 10% of them",
        &format!("{}..{} snapshots exist", o.many - k, o.many),
        &stats(lat[o.many - k..].to_vec()),
        "",
    );
    let setup = format!("{} snapshots, 1 GiB volume", o.many);
    let time_list = |pool: &Pool, vol: Option<&str>| {
        let mut v = Vec::new();
        let mut n = 0;
        for _ in 0..5 {
            let s = Instant::now();
            n = pool.list_snapshots(vol).expect("list").len();
            v.push(ms(s));
        }
        (stats(v), n)
    };
    let (st, n) = time_list(sc.pool(), Some("v"));
    t.row("list_snapshots(Some(vol))", &setup, &st, &format!("{n} listed"));
    let mut list_ms = st.median;
    let s = Instant::now();
    sc.pool().checkpoint().expect("checkpoint");
    t.one("checkpoint", &setup, ms(s), "");
    // A crash after more work: the journal has records to replay.
    for i in 0..20 {
        scatter(sc.pool(), vol, g * GIB, o.churn, rng);
        sc.pool().create_snapshot("v", &format!("x{i:02}")).expect("snapshot");
    }
    for i in 0..20 {
        sc.pool().delete_snapshot("v", &format!("x{i:02}")).expect("delete");
    }
    scatter(sc.pool(), vol, g * GIB, 4096, rng);
    sc.pool().flush().expect("flush");
    let crash = sc.reopen(false);
    t.one(
        "Pool::open after a crash (journal replay)",
        &setup,
        crash,
        "checkpoint + 20 creates, 20 deletes, 16 MiB writes",
    );
    let clean_a = sc.reopen(true);
    let clean_b = sc.reopen(true);
    let clean_c = sc.reopen(true);
    let open = stats(vec![clean_a, clean_b, clean_c]);
    t.row("Pool::open after a clean close", &setup, &open, "file open + checkpoint load + space rebuild");
    let (st2, n2) = time_list(sc.pool(), Some("v"));
    t.row("list_snapshots(Some(vol)) after open", &setup, &st2, &format!("{n2} listed"));
    list_ms = list_ms.max(st2.median);
    let (st3, n3) = time_list(sc.pool(), None);
    t.row("list_snapshots(None)", &setup, &st3, &format!("{n3} listed"));
    let s = Instant::now();
    sc.pool().delete_snapshot("v", "s0000").expect("delete oldest");
    t.one("delete_snapshot, the oldest", &setup, ms(s), &format!("{} blocks changed after it", o.churn));
    let s = Instant::now();
    sc.pool().delete_snapshot("v", &format!("s{:04}", o.many / 2)).expect("delete middle");
    t.one("delete_snapshot, one in the middle", &setup, ms(s), "its dead list joins the previous snapshot's");
    let worst_open = crash.max(open.max);
    t.verdict(format!(
        "{} snapshots: open {:.1} ms (clean, median) / {:.1} ms (journal replay), list {:.2} ms (targets < 1000 ms): {}",
        o.many,
        open.median,
        crash,
        list_ms,
        if worst_open < 1000.0 && list_ms < 1000.0 { "met" } else { "MISSED" }
    ));
}

/// Reads: `n` random 4K reads and one sequential 1 MiB pass over `view`.
fn time_reads(pool: &Pool, vol: u32, view: View, size: u64, n: usize, rng: &mut Rng) -> (f64, f64) {
    let mut buf = vec![0u8; BS as usize];
    let s = Instant::now();
    for _ in 0..n {
        pool.read_view(vol, view, rng.below(size / BS) * BS, &mut buf).expect("read");
    }
    let iops = n as f64 / s.elapsed().as_secs_f64();
    let mut big = vec![0u8; MIB as usize];
    let s = Instant::now();
    let mut at = 0;
    while at < size {
        pool.read_view(vol, view, at, &mut big).expect("read");
        at += MIB;
    }
    let mbs = size as f64 / s.elapsed().as_secs_f64() / 1e6;
    (iops, mbs)
}

fn thread_cpu() -> f64 {
    // SAFETY: clock_gettime fills the timespec we pass.
    unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts);
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    }
}

/// One pass of 4K writes over every block of [0, bytes) in random order, a
/// commit every 16,384 writes (as the server's background committer would);
/// returns (wall, this thread's CPU) microseconds per write.
fn write_pass(pool: &Pool, vol: u32, bytes: u64, rng: &mut Rng) -> (f64, f64) {
    let buf = pattern(rng.next(), BS as usize);
    let order = rng.permutation(bytes / BS);
    let (t, c) = (Instant::now(), thread_cpu());
    for (i, b) in order.iter().enumerate() {
        pool.write(vol, *b as u64 * BS, &buf, false).expect("write");
        if i % 16384 == 16383 {
            pool.flush().expect("flush");
        }
    }
    pool.flush().expect("flush");
    let n = order.len() as f64;
    (t.elapsed().as_secs_f64() * 1e6 / n, (thread_cpu() - c) * 1e6 / n)
}

/// What a 4K write costs the engine (one thread, page cache, commits
/// included) in place, redirected after a snapshot, and in place again
/// once the map is as fragmented as a redirected pass leaves it. Thread CPU
/// time barely moves with the machine's load, wall time does.
fn section_write(o: &Opts, t: &mut Table, rng: &mut Rng) {
    let g = o.read_gib;
    let bytes = g * GIB;
    println!("  4K writes, {g} GiB volume, every block once per pass in random order (engine level, 1 thread):");
    let mut base = (0.0, 0.0);
    let mut show = |t: &mut Table, label: &str, (wall, cpu): (f64, f64), ext: u64| {
        if base.0 == 0.0 {
            base = (wall, cpu);
        }
        let line = format!(
            "    {label:<52} {wall:>6.2} us wall ({:.2}x)  {cpu:>6.2} us CPU ({:.2}x)  head extents {ext:>7}  load {}",
            base.0 / wall,
            base.1 / cpu,
            load1()
        );
        println!("{line}");
        t.rows.push(line);
    };
    {
        let sc = Scratch::new(&o.dir, "write", 4 * bytes + GIB);
        let pool = sc.pool();
        let vol = pool.create_volume("v", bytes).expect("volume").id;
        fill_seq(pool, vol, 0, bytes);
        let r = write_pass(pool, vol, bytes, rng);
        show(t, "in place, sequentially written volume (k=0)", r, extents(pool, vol));
        let r = write_pass(pool, vol, bytes, rng);
        show(t, "in place again (k=0)", r, extents(pool, vol));
        pool.create_snapshot("v", "a").expect("snapshot");
        let r = write_pass(pool, vol, bytes, rng);
        show(t, "first pass after 1 snapshot (every write redirected)", r, extents(pool, vol));
        let r = write_pass(pool, vol, bytes, rng);
        show(t, "next pass (in place; snapshot kept)", r, extents(pool, vol));
        pool.delete_snapshot("v", "a").expect("delete");
        let r = write_pass(pool, vol, bytes, rng);
        show(t, "next pass (in place; snapshot deleted)", r, extents(pool, vol));
    }
    {
        let sc = Scratch::new(&o.dir, "write", 4 * bytes + GIB);
        let pool = sc.pool();
        let vol = pool.create_volume("v", bytes).expect("volume").id;
        fill_random(pool, vol, bytes, rng);
        let r = write_pass(pool, vol, bytes, rng);
        show(t, "in place, volume written by 4K random writes (k=0f)", r, extents(pool, vol));
    }
    {
        let sc = Scratch::new(&o.dir, "write", 4 * bytes + GIB);
        let pool = sc.pool();
        let vol = pool.create_volume("v", bytes).expect("volume").id;
        fill_seq(pool, vol, 0, bytes);
        for i in 0..10 {
            if i > 0 {
                scatter(pool, vol, bytes, bytes / BS / 100, rng);
            }
            pool.create_snapshot("v", &format!("s{i}")).expect("snapshot");
        }
        let r = write_pass(pool, vol, bytes, rng);
        show(t, "first pass after 10 snapshots (1% rewritten between)", r, extents(pool, vol));
        let r = write_pass(pool, vol, bytes, rng);
        show(t, "next pass (in place; 10 snapshots kept)", r, extents(pool, vol));
    }
}

fn section_read(o: &Opts, t: &mut Table, rng: &mut Rng) {
    let g = o.read_gib;
    let sc = Scratch::new(&o.dir, "read", 3 * g * GIB);
    let pool = sc.pool();
    let vol = pool.create_volume("v", g * GIB).expect("volume").id;
    fill_seq(pool, vol, 0, g * GIB);
    // 10 snapshots, 10% of the blocks rewritten (4K random) before each later one.
    for i in 0..10 {
        if i > 0 {
            scatter(pool, vol, g * GIB, g * GIB / BS / 10, rng);
            pool.flush().expect("flush");
        }
        pool.create_snapshot("v", &format!("r{i}")).expect("snapshot");
    }
    scatter(pool, vol, g * GIB, g * GIB / BS / 10, rng);
    pool.flush().expect("flush");
    let n = 200_000;
    // Warm the page cache once so every row reads from memory alike.
    time_reads(pool, vol, View::Head, g * GIB, 1, rng);
    let mut rows = vec![("head".to_string(), View::Head)];
    for name in ["r9", "r5", "r0"] {
        let (_, view) = pool.lookup_view(&format!("v@{name}")).expect("snapshot view");
        rows.push((format!("snapshot {name}"), view));
    }
    println!(
        "  reads, {g} GiB volume, 10 snapshots with 10% rewritten between each (engine level, page cache, 1 thread):"
    );
    let mut head = (0.0, 0.0);
    for (label, view) in rows {
        let (iops, mbs) = time_reads(pool, vol, view, g * GIB, n, rng);
        if view == View::Head {
            head = (iops, mbs);
        }
        let line = format!(
            "    {label:<14} 4K random {iops:>10.0} reads/s ({:.2}x head)   1M sequential {mbs:>8.0} MB/s ({:.2}x head)   load {}",
            iops / head.0,
            mbs / head.1,
            load1()
        );
        println!("{line}");
        t.rows.push(line);
    }
}

fn section_clone(o: &Opts, t: &mut Table, rng: &mut Rng) {
    let g = o.read_gib;
    let sc = Scratch::new(&o.dir, "clone", 4 * g * GIB);
    let pool = sc.pool();
    let vol = pool.create_volume("v", g * GIB).expect("volume").id;
    fill_seq(pool, vol, 0, g * GIB);
    pool.create_snapshot("v", "base").expect("snapshot");
    // c1 = clone of v@base, c2 = clone of c1@base, ... each with 1% rewritten.
    let mut parent = "v".to_string();
    let mut lat = Vec::new();
    let mut ids = Vec::new();
    for d in 1..=o.clone_depth {
        let name = format!("c{d}");
        let s = Instant::now();
        let id = pool.create_clone(&parent, "base", &name).expect("clone").id;
        lat.push(ms(s));
        scatter(pool, id, g * GIB, g * GIB / BS / 100, rng);
        pool.create_snapshot(&name, "base").expect("snapshot of clone");
        ids.push(id);
        parent = name;
    }
    t.row("create_clone", &format!("{g} GiB origin, depth 1..{}", o.clone_depth), &stats(lat), "");
    println!("  clone reads, {g} GiB, 1% rewritten per generation (engine level, page cache, 1 thread):");
    let n = 200_000;
    time_reads(pool, vol, View::Head, g * GIB, 1, rng);
    let (h_iops, h_mbs) = time_reads(pool, vol, View::Head, g * GIB, n, rng);
    let show = |t: &mut Table, label: String, iops: f64, mbs: f64| {
        let line = format!(
            "    {label:<14} 4K random {iops:>10.0} reads/s ({:.2}x origin head)   1M sequential {mbs:>8.0} MB/s ({:.2}x)   load {}",
            iops / h_iops,
            mbs / h_mbs,
            load1()
        );
        println!("{line}");
        t.rows.push(line);
    };
    show(t, "origin head".into(), h_iops, h_mbs);
    let mut depths: Vec<usize> =
        [1, 2, 4, o.clone_depth].into_iter().filter(|&d| d >= 1 && d <= o.clone_depth).collect();
    depths.dedup();
    for d in depths {
        let (iops, mbs) = time_reads(pool, ids[d - 1], View::Head, g * GIB, n, rng);
        show(t, format!("clone depth {d}"), iops, mbs);
    }
    let s = Instant::now();
    let last = format!("c{}", o.clone_depth);
    pool.flatten(&last, &mut |_, _| {}).expect("flatten");
    t.one(
        &format!("flatten depth-{} clone", o.clone_depth),
        &format!("{g} GiB, 99% from origins"),
        ms(s),
        "copies the data",
    );
    let (iops, mbs) = time_reads(pool, ids[o.clone_depth - 1], View::Head, g * GIB, n, rng);
    show(t, format!("flattened c{}", o.clone_depth), iops, mbs);
}

fn main() {
    let o = parse_args();
    std::fs::create_dir_all(&o.dir).expect("scratch dir");
    let mut t = Table { rows: Vec::new(), verdicts: Vec::new() };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    println!(
        "snapshot_cost: scratch {} ({} GiB free), load at start {}",
        o.dir.display(),
        free_bytes(&o.dir) / GIB,
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );
    t.header();
    if want(&o, "write") {
        section_write(&o, &mut t, &mut rng);
    }
    if want(&o, "create") {
        section_create(&o, &mut t, &mut rng);
    }
    if want(&o, "frag") {
        section_frag(&o, &mut t, &mut rng);
    }
    if want(&o, "delete") {
        section_delete(&o, &mut t, &mut rng);
    }
    if want(&o, "many") {
        section_many(&o, &mut t, &mut rng);
    }
    if want(&o, "read") {
        section_read(&o, &mut t, &mut rng);
    }
    if want(&o, "clone") {
        section_clone(&o, &mut t, &mut rng);
    }
    println!();
    println!("against the targets:");
    for v in &t.verdicts {
        println!("  {v}");
    }
    println!("load at end {}", std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim());
}
