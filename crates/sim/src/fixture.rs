//! Pools on one simulated device, for tests.

use crate::SimDevice;
use std::sync::Arc;
use tarn_engine::{create_pool, CreateOptions, Device, EngineError, OpenOptions, Pool};

/// A new pool (256 KiB journal) on a fresh simulated device named "sim0".
pub fn one_device_pool(size: u64) -> (Arc<SimDevice>, Pool) {
    let sim = Arc::new(SimDevice::new("sim0", size));
    let dyns: Vec<Arc<dyn Device>> = vec![sim.clone()];
    let opts = CreateOptions { journal_bytes: Some(256 << 10), ..Default::default() };
    create_pool(&dyns, &["sim0".into()], &opts).expect("create pool on a simulated device");
    let pool = Pool::open(dyns, OpenOptions::default()).expect("open a new pool");
    (sim, pool)
}

/// Open the pool on `sim` again (after a close, a crash or damage).
pub fn reopen(sim: &Arc<SimDevice>) -> Result<Pool, EngineError> {
    Pool::open(vec![sim.clone() as Arc<dyn Device>], OpenOptions::default())
}

/// Byte offset of the 4 KiB block holding exactly `data` on `sim` (tests
/// locate a volume block on the device to damage it).
pub fn find_block(sim: &SimDevice, data: &[u8]) -> Option<u64> {
    let bs = data.len();
    let mut buf = vec![0u8; bs];
    (0..sim.size() / bs as u64).map(|b| b * bs as u64).find(|&at| sim.read_at(&mut buf, at).is_ok() && buf == data)
}

/// Wait until `cond` holds (another thread's progress), polling every
/// 5 ms for at most 20 s; panics naming `what` when it never does.
pub fn wait_until(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..4000 {
        if cond() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    panic!("never happened within 20 s: {what}");
}
