//! What the file volume tests share: a fresh file volume on a simulated
//! device, and a file made in one call.

use std::sync::Arc;
use tarn_engine::Pool;
use tarn_fs::{FileVolume, Kind};
use tarn_sim::fixture::one_device_pool;
use tarn_sim::SimDevice;

pub const MIB: u64 = 1 << 20;

/// A pool of 256 MiB on a simulated device with file volume "home".
pub fn fresh() -> (Arc<SimDevice>, Arc<Pool>, FileVolume) {
    let (sim, pool) = one_device_pool(256 * MIB);
    let pool = Arc::new(pool);
    FileVolume::format(&pool, "home", 0, 0, 0).unwrap();
    let fv = FileVolume::open(pool.clone(), "home").unwrap();
    (sim, pool, fv)
}

/// A regular file `name` in `dir`; its inode number.
pub fn file(fv: &FileVolume, dir: u64, name: &str) -> u64 {
    fv.create(dir, name.as_bytes(), Kind::File, 0o644, 1, 2).unwrap().inode.ino
}

/// Power cut: the pool and its file volume "home" opened again from what
/// the device kept.
#[allow(dead_code)]
pub fn crash_and_reopen(
    sim: &Arc<SimDevice>,
    rng: &mut rand_chacha::ChaCha8Rng,
    fv: FileVolume,
    pool: Arc<Pool>,
) -> (Arc<Pool>, FileVolume) {
    sim.crash(rng);
    drop(fv);
    drop(pool);
    reopen(sim)
}

/// A clean close: the pool and its file volume "home" opened again.
#[allow(dead_code)]
pub fn close_and_reopen(sim: &Arc<SimDevice>, fv: FileVolume, pool: Arc<Pool>) -> (Arc<Pool>, FileVolume) {
    drop(fv);
    pool.close().unwrap();
    reopen(sim)
}

/// The pool on `sim` and its file volume "home", opened.
pub fn reopen(sim: &Arc<SimDevice>) -> (Arc<Pool>, FileVolume) {
    let device = sim.clone() as Arc<dyn tarn_engine::Device>;
    let pool = Arc::new(Pool::open(vec![device], tarn_engine::OpenOptions::default()).unwrap());
    let fv = FileVolume::open(pool.clone(), "home").unwrap();
    (pool, fv)
}
