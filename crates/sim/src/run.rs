//! One seeded simulation run: random operations against a pool on simulated
//! devices and against the model, power cuts at random device calls,
//! reopen, compare, check. Any failure names its seed; `TARN_SEED=N`
//! replays it exactly.

use crate::device::SimDevice;
use crate::model::{Model, VolModel, BLOCK};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use tarn_engine::{create_pool, CreateOptions, Device, EngineError, OpenOptions, Pool};

/// Knobs of a run (small sizes keep hundreds of seeds within seconds).
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub steps: usize,
    pub device_bytes: u64,
    pub max_devices: usize,
    pub journal_bytes: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig { steps: 300, device_bytes: 6 << 20, max_devices: 2, journal_bytes: 64 << 10 }
    }
}

fn tracing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("TARN_SIM_TRACE").is_some())
}

macro_rules! trace {
    ($($arg:tt)*) => { if tracing() { eprintln!($($arg)*); } };
}

struct Run {
    rng: ChaCha8Rng,
    devs: Vec<Arc<SimDevice>>,
    pool: Option<Pool>,
    model: Model,
    /// A volume operation cut by a crash: (name, size before, size after; 0 = absent).
    uncertain_volume: Option<(String, usize, usize)>,
    crashes: usize,
    strict: bool,
}

/// Run one seed; Err describes the first divergence.
pub fn run_seed(seed: u64, cfg: &SimConfig) -> Result<RunStats, String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let ndev = rng.random_range(1..=cfg.max_devices);
    let devs: Vec<Arc<SimDevice>> =
        (0..ndev).map(|i| Arc::new(SimDevice::new(&format!("sim{i}"), cfg.device_bytes))).collect();
    let dyn_devs: Vec<Arc<dyn Device>> = devs.iter().map(|d| d.clone() as Arc<dyn Device>).collect();
    let paths = (0..ndev).map(|i| format!("sim{i}")).collect::<Vec<_>>();
    create_pool(&dyn_devs, &paths, &CreateOptions { journal_bytes: Some(cfg.journal_bytes), force: false })
        .map_err(|e| e.to_string())?;
    let strict = rng.random_bool(0.2);
    let mut run = Run { rng, devs, pool: None, model: Model::default(), uncertain_volume: None, crashes: 0, strict };
    run.reopen()?;
    for step in 0..cfg.steps {
        run.step().map_err(|e| format!("seed {seed} step {step}: {e}"))?;
    }
    run.crash_and_verify().map_err(|e| format!("seed {seed} final crash: {e}"))?;
    Ok(RunStats { crashes: run.crashes })
}

#[derive(Debug, Clone, Copy)]
pub struct RunStats {
    pub crashes: usize,
}

impl Run {
    fn pool(&self) -> &Pool {
        self.pool.as_ref().expect("pool open")
    }

    fn reopen(&mut self) -> Result<(), String> {
        let devs: Vec<Arc<dyn Device>> = self.devs.iter().map(|d| d.clone() as Arc<dyn Device>).collect();
        let pool = Pool::open(devs, OpenOptions { strict: self.strict, ..Default::default() })
            .map_err(|e| format!("reopen: {e}"))?;
        let report = pool.check();
        if !report.is_clean() {
            return Err(format!("checker after reopen: {:?}", report.problems));
        }
        self.pool = Some(pool);
        Ok(())
    }

    fn step(&mut self) -> Result<(), String> {
        if self.model.vols.is_empty() || self.rng.random_bool(0.02) {
            return self.volume_op();
        }
        let roll = self.rng.random_range(0..100);
        match roll {
            0..=44 => self.write(),
            45..=54 => self.trim_or_zero(),
            55..=69 => self.flush(),
            70..=84 => self.read_compare(),
            85..=91 => self.crash_and_verify(),
            92..=93 => self.clean_reopen(),
            _ => self.arm_crash(),
        }
    }

    fn any_volume(&mut self) -> (String, u32, usize) {
        let names: Vec<&String> = self.model.vols.keys().collect();
        let name = names[self.rng.random_range(0..names.len())].clone();
        let id = self.pool().volume_id(&name).expect("model volume exists in pool");
        let size = self.model.vols[&name].current.len();
        (name, id, size)
    }

    /// A random byte range, block-aligned most of the time.
    fn range(&mut self, size: usize, max: usize) -> (usize, usize) {
        if self.rng.random_bool(0.7) {
            let blocks = size / BLOCK;
            let b = self.rng.random_range(0..blocks);
            let n = self.rng.random_range(1..=(blocks - b).min(max / BLOCK));
            (b * BLOCK, n * BLOCK)
        } else {
            let off = self.rng.random_range(0..size - 1);
            let len = self.rng.random_range(1..=(size - off).min(max));
            (off, len)
        }
    }

    fn write(&mut self) -> Result<(), String> {
        let (name, id, size) = self.any_volume();
        let (off, len) = self.range(size, 64 << 10);
        let fill: u8 = self.rng.random();
        let data: Vec<u8> = (0..len).map(|i| fill.wrapping_add((i / 512) as u8)).collect();
        let fua = self.rng.random_bool(0.05);
        let r = self.pool().write(id, off as u64, &data, fua);
        trace!("write {name} {off}+{len} fill {fill} fua {fua}: {r:?}");
        match r {
            Ok(()) => {
                let m = self.model.vols.get_mut(&name).expect("volume");
                m.write(off, &data);
                if fua {
                    // A FUA write answers after a full commit of the pool.
                    self.model.flushed();
                }
                Ok(())
            }
            Err(e) => self.after_failed_write(&name, id, off, &data, e),
        }
    }

    /// A failed write leaves its range undefined: adopt what the pool shows
    /// (each sector old or new is checked after the next crash anyway).
    fn after_failed_write(
        &mut self,
        name: &str,
        id: u32,
        off: usize,
        attempted: &[u8],
        e: EngineError,
    ) -> Result<(), String> {
        let len = attempted.len();
        if self.devs.iter().any(|d| d.is_dead()) {
            // Cut mid-write: any sector of the range may hold old or new data.
            self.model.vols.get_mut(name).expect("volume").write(off, attempted);
            return self.crash_and_verify();
        }
        if !matches!(e, EngineError::NoSpace) {
            return Err(format!("write failed without a crash: {e}"));
        }
        let mut back = vec![0u8; len];
        self.pool().read(id, off as u64, &mut back).map_err(|e| format!("read after ENOSPC: {e}"))?;
        self.model.vols.get_mut(name).expect("volume").adopt(off, &back);
        Ok(())
    }

    fn trim_or_zero(&mut self) -> Result<(), String> {
        let (name, id, size) = self.any_volume();
        let (off, len) = self.range(size, 256 << 10);
        let zero = self.rng.random_bool(0.5);
        let no_hole = zero && self.rng.random_bool(0.3);
        let r = if zero {
            self.pool().write_zeroes(id, off as u64, len as u64, no_hole, false)
        } else {
            self.pool().trim(id, off as u64, len as u64)
        };
        trace!("{} {name} {off}+{len} no_hole {no_hole}: {r:?}", if zero { "zero" } else { "trim" });
        match r {
            Ok(()) => {
                let m = self.model.vols.get_mut(&name).expect("volume");
                if zero {
                    m.write(off, &vec![0u8; len]);
                } else {
                    // Only whole blocks inside the range are released.
                    let first = off.div_ceil(BLOCK) * BLOCK;
                    let end = (off + len) / BLOCK * BLOCK;
                    if end > first {
                        m.write(first, &vec![0u8; end - first]);
                    }
                }
                Ok(())
            }
            Err(e) => self.after_failed_write(&name, id, off, &vec![0u8; len], e),
        }
    }

    fn flush(&mut self) -> Result<(), String> {
        let r = self.pool().flush();
        trace!("flush: {r:?}");
        match r {
            Ok(()) => {
                self.model.flushed();
                Ok(())
            }
            Err(_) if self.devs.iter().any(|d| d.is_dead()) => self.crash_and_verify(),
            Err(e) => Err(format!("flush failed without a crash: {e}")),
        }
    }

    fn read_compare(&mut self) -> Result<(), String> {
        let (name, id, size) = self.any_volume();
        let (off, len) = self.range(size, 128 << 10);
        let mut buf = vec![0u8; len];
        if let Err(e) = self.pool().read(id, off as u64, &mut buf) {
            if self.devs.iter().any(|d| d.is_dead()) {
                return self.crash_and_verify();
            }
            return Err(format!("read failed: {e}"));
        }
        if buf != self.model.vols[&name].current[off..off + len] {
            return Err(format!("live read of {name} at {off}+{len} differs from the model"));
        }
        self.check_block_status(&name, id, off, len)
    }

    /// Whatever block status calls a hole must read as zeros, and the runs
    /// must tile the range from its start without gaps.
    fn check_block_status(&self, name: &str, id: u32, off: usize, len: usize) -> Result<(), String> {
        let runs = self.pool().block_status(id, off as u64, len as u64).map_err(|e| format!("block status: {e}"))?;
        let mut pos = off;
        for r in &runs {
            let end = pos + r.length as usize;
            if end > off + len || r.length == 0 {
                return Err(format!("block status run {r:?} at {pos} leaves {off}+{len}"));
            }
            if !r.allocated && self.model.vols[name].current[pos..end].iter().any(|b| *b != 0) {
                return Err(format!("block status calls {name} {pos}..{end} a hole but it holds data"));
            }
            pos = end;
        }
        if runs.is_empty() {
            return Err("block status returned no runs".into());
        }
        Ok(())
    }

    fn arm_crash(&mut self) -> Result<(), String> {
        let i = self.rng.random_range(0..self.devs.len());
        let calls = self.rng.random_range(0..20);
        self.devs[i].crash_after(calls);
        trace!("arm crash on dev {i} after {calls} calls");
        Ok(())
    }

    fn clean_reopen(&mut self) -> Result<(), String> {
        trace!("clean reopen");
        let pool = self.pool.take().expect("pool open");
        if let Err(e) = pool.close() {
            if self.devs.iter().any(|d| d.is_dead()) {
                self.pool = Some(pool);
                return self.crash_and_verify();
            }
            return Err(format!("close: {e}"));
        }
        drop(pool);
        self.model.flushed();
        if self.devs.iter().any(|d| d.is_dead()) {
            // The cut hit an ignored discard hint after the commit.
            return self.crash_and_verify();
        }
        self.reopen()?;
        self.verify_all_current()
    }

    fn volume_op(&mut self) -> Result<(), String> {
        let roll = self.rng.random_range(0..10);
        if self.model.vols.len() < 3 && (roll < 6 || self.model.vols.is_empty()) {
            let name = format!("v{}", self.rng.random_range(0..5));
            if self.model.vols.contains_key(&name) {
                return Ok(());
            }
            let size = self.rng.random_range(1..=(3 << 20) / BLOCK) * BLOCK;
            self.uncertain_volume = Some((name.clone(), 0, size));
            return match self.pool().create_volume(&name, size as u64) {
                Ok(_) => {
                    self.uncertain_volume = None;
                    self.model.vols.insert(name, VolModel::new(size));
                    self.model.flushed();
                    Ok(())
                }
                Err(e) => self.after_failed_volume_op(e),
            };
        }
        let (name, _, size) = self.any_volume();
        if roll < 8 {
            let new = self.rng.random_range(1..=(3 << 20) / BLOCK) * BLOCK;
            self.uncertain_volume = Some((name.clone(), size, new));
            match self.pool().resize_volume(&name, new as u64, true) {
                Ok(_) => {
                    self.uncertain_volume = None;
                    let m = self.model.vols.get_mut(&name).expect("volume");
                    m.current.resize(new, 0);
                    self.model.flushed();
                    Ok(())
                }
                Err(e) => self.after_failed_volume_op(e),
            }
        } else {
            self.uncertain_volume = Some((name.clone(), size, 0));
            match self.pool().delete_volume(&name, true) {
                Ok(()) => {
                    self.uncertain_volume = None;
                    self.model.vols.remove(&name);
                    self.model.flushed();
                    Ok(())
                }
                Err(e) => self.after_failed_volume_op(e),
            }
        }
    }

    fn after_failed_volume_op(&mut self, e: EngineError) -> Result<(), String> {
        if self.devs.iter().any(|d| d.is_dead()) {
            return self.crash_and_verify();
        }
        Err(format!("volume operation failed without a crash: {e}"))
    }

    /// Power cut now: drop the pool without closing, crash the devices,
    /// reopen, and compare every volume with what the model allows.
    fn crash_and_verify(&mut self) -> Result<(), String> {
        trace!("CRASH");
        self.crashes += 1;
        drop(self.pool.take());
        for d in &self.devs {
            d.crash(&mut self.rng);
        }
        self.reopen()?;
        self.settle_uncertain_volume()?;
        let names: Vec<String> = self.model.vols.keys().cloned().collect();
        for name in names {
            let image = self.read_volume(&name)?;
            let m = self.model.vols.get_mut(&name).expect("volume");
            m.check_after_crash(&image).map_err(|e| format!("after crash, volume {name}: {e}"))?;
            m.current = image;
            m.flushed();
        }
        let mut listed: Vec<String> = self.pool().list_volumes().into_iter().map(|v| v.name).collect();
        listed.sort();
        let expected: Vec<String> = self.model.vols.keys().cloned().collect();
        if listed != expected {
            return Err(format!("after crash the pool lists {listed:?}, the model {expected:?}"));
        }
        Ok(())
    }

    /// A volume op cut by the crash may or may not have happened; adopt
    /// whichever state the pool shows, if it is one of the two.
    fn settle_uncertain_volume(&mut self) -> Result<(), String> {
        let Some((name, before, after)) = self.uncertain_volume.take() else {
            return Ok(());
        };
        let actual = self
            .pool()
            .volume_id(&name)
            .and_then(|id| self.pool().volume_info(id))
            .map(|v| v.size as usize)
            .unwrap_or(0);
        if actual != before && actual != after {
            return Err(format!("volume {name} has size {actual} after a cut operation from {before} to {after}"));
        }
        match (actual, self.model.vols.get_mut(&name)) {
            (0, _) => {
                self.model.vols.remove(&name);
            }
            (n, Some(m)) => {
                m.current.resize(n, 0);
                m.durable.resize(n, 0);
                m.since_flush.retain(|b, _| (b + 1) * BLOCK <= n);
            }
            (n, None) => {
                self.model.vols.insert(name, VolModel::new(n));
            }
        }
        Ok(())
    }

    fn read_volume(&self, name: &str) -> Result<Vec<u8>, String> {
        let pool = self.pool();
        let id = pool.volume_id(name).ok_or(format!("volume {name} missing after reopen"))?;
        let size = pool.volume_info(id).map(|v| v.size as usize).unwrap_or(0);
        let mut image = vec![0u8; size];
        pool.read(id, 0, &mut image).map_err(|e| format!("read {name}: {e}"))?;
        Ok(image)
    }

    fn verify_all_current(&self) -> Result<(), String> {
        for (name, m) in &self.model.vols {
            if self.read_volume(name)? != m.current {
                return Err(format!("after clean reopen, volume {name} differs from the model"));
            }
        }
        Ok(())
    }
}
