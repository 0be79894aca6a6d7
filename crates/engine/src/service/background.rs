//! The threads a served pool runs beside its clients: the background
//! committer (so clients that never flush lose at most `commit_interval`),
//! the checkpointer (writes the checkpoints commits freeze, while later
//! commits go on), the resync of overwrite regions a crash left open, and the resync of
//! mirror legs after an unclean shutdown, and the idle-time compactor
//! (re-lays out scattered data while no client writes), and the evacuation
//! of members left draining (`tarn dev remove`). `Service::start` starts what the
//! pool needs; `stop` (or dropping the service) wakes every thread and
//! joins it. Each loop does a bounded step (a tick, or 1 MiB of resync)
//! between looks at the stop flag, so stopping takes at most one step.

use crate::pool::Pool;
use crate::service::pace::Pace;
use crate::volumes::clean::CleanPass;
use crate::volumes::relayout::RelayoutCursor;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Receives the service's operator notices.
pub type Notice = Arc<dyn Fn(&str) + Send + Sync>;

/// How the service runs.
#[derive(Clone)]
pub struct ServiceOptions {
    /// Commit whatever changed at least this often.
    pub commit_interval: Duration,
    /// How often the committer looks for work: a write redirected until an
    /// overwrite region opens waits at most this long for the commit.
    pub tick: Duration,
    /// Told of what an operator wants to see whatever the log level (the
    /// CLI prints it): a mirror resync starting and finishing.
    pub notice: Option<Notice>,
    /// Re-lay out scattered data (`Pool::relayout_step`) once no client
    /// wrote for this long; None: never in the background.
    pub compact_idle: Option<Duration>,
    /// Also while clients write, slowly (one 1 MiB window per tick), when
    /// the block volumes hold more than this many extents per GiB mapped
    /// (a fragmentation threshold); None: only when idle.
    pub compact_at: Option<u64>,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        ServiceOptions {
            commit_interval: Duration::from_secs(5),
            tick: Duration::from_millis(100),
            notice: None,
            compact_idle: Some(Duration::from_secs(10)),
            compact_at: None,
        }
    }
}

impl std::fmt::Debug for ServiceOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceOptions")
            .field("commit_interval", &self.commit_interval)
            .field("tick", &self.tick)
            .field("compact_idle", &self.compact_idle)
            .field("compact_at", &self.compact_at)
            .finish_non_exhaustive()
    }
}

/// The stop flag, with a condition variable so a sleeping thread wakes at once.
#[derive(Default)]
struct Stop {
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl Stop {
    fn set(&self) {
        *self.stopped.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.wake.notify_all();
    }

    fn is_set(&self) -> bool {
        *self.stopped.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sleep up to `timeout`; true if stopping.
    fn wait(&self, timeout: Duration) -> bool {
        let guard = self.stopped.lock().unwrap_or_else(|p| p.into_inner());
        let (guard, _) = self.wake.wait_timeout_while(guard, timeout, |s| !*s).unwrap_or_else(|p| p.into_inner());
        *guard
    }
}

/// A pool's background threads; stopped and joined by `stop` or on drop.
pub struct Service {
    pool: Arc<Pool>,
    stop: Arc<Stop>,
    threads: Vec<JoinHandle<()>>,
}

impl Service {
    /// Start the committer, and the resyncs the pool needs (regions left
    /// open by a crash, mirror legs after an unclean shutdown). A resync
    /// thread that cannot start is logged; its work waits for the next
    /// checkpoint (regions) or start (legs).
    pub fn start(pool: Arc<Pool>, opts: ServiceOptions) -> Service {
        let mut service = Service { pool, stop: Arc::new(Stop::default()), threads: Vec::new() };
        let committer_opts = opts.clone();
        service.spawn("committer", move |pool, stop| run_committer(pool, &committer_opts, stop));
        service.spawn("checkpointer", run_checkpointer);
        let when = Compaction { idle: opts.compact_idle, at: opts.compact_at };
        if (when.idle.is_some() || when.at.is_some()) && !service.pool.is_read_only() {
            service.spawn("compactor", move |pool, stop| run_compactor(pool, when, stop));
        }
        if service.pool.needs_resync() {
            let notice = opts.notice.clone();
            service.spawn("mirror-resync", move |pool, stop| run_leg_resync(pool, notice.as_deref(), stop));
        }
        let draining = service.pool.draining_members();
        if !draining.is_empty() && !service.pool.is_read_only() {
            service.spawn("evacuate", move |pool, stop| run_evacuation(pool, &draining, stop));
        }
        let rebuilding = service.pool.rebuilding_members();
        if !rebuilding.is_empty() && !service.pool.is_read_only() {
            service.spawn("rebuild", move |pool, stop| run_rebuild(pool, &rebuilding, stop));
        }
        let replacing = service.pool.replacing_members();
        if !replacing.is_empty() && !service.pool.is_read_only() {
            service.spawn("replace", move |pool, stop| run_replace(pool, &replacing, stop));
        }
        let pending = service.pool.resync_pending();
        if pending > 0 {
            service.spawn("resync", move |pool, stop| run_region_resync(pool, pending, stop));
        }
        service
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Wake every thread and wait for it to finish its current step.
    pub fn stop(mut self) {
        self.stop_and_join();
    }

    fn spawn(&mut self, name: &str, body: impl FnOnce(&Pool, &Stop) + Send + 'static) {
        let (pool, stop) = (self.pool.clone(), self.stop.clone());
        match std::thread::Builder::new().name(name.into()).spawn(move || body(&pool, &stop)) {
            Ok(handle) => self.threads.push(handle),
            Err(e) => log::error!("cannot start the {name} thread: {e}"),
        }
    }

    fn stop_and_join(&mut self) {
        self.stop.set();
        self.pool.wake_checkpointer();
        for t in self.threads.drain(..) {
            let name = t.thread().name().unwrap_or("service").to_string();
            if t.join().is_err() {
                log::error!("the {name} thread panicked");
            }
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// Commit whatever changed every `commit_interval`, and within a tick when
/// writes wait for an overwrite region to open; grow the pool each tick
/// its usage is past the expansion threshold (`commit/grow.rs`).
fn run_committer(pool: &Pool, opts: &ServiceOptions, stop: &Stop) {
    let tick = opts.tick.max(Duration::from_millis(1));
    let mut waited = Duration::ZERO;
    while !stop.wait(tick) {
        waited += tick;
        if !pool.is_fenced() && !pool.is_read_only() {
            if let Err(e) = pool.expand_if_needed(false) {
                log::error!("pool expansion failed: {e}");
            }
        }
        // Writes waiting for an overwrite region to open are redirected
        // meanwhile: open it within a tick.
        if waited < opts.commit_interval && !pool.wants_commit() {
            continue;
        }
        waited = Duration::ZERO;
        if pool.is_dirty() && !pool.is_fenced() {
            if let Err(e) = pool.flush() {
                log::error!("background commit failed: {e}");
            }
        }
    }
}

/// The longest the checkpointer sleeps: a safety net only. A commit that
/// freezes a checkpoint wakes it at once, and so does stopping (it used
/// to poll every 2 ms: ~480 wake-ups a second of an idle server, ~2 % of
/// a warm 1M read's server CPU in a profile).
const CHECKPOINT_WAIT: Duration = Duration::from_secs(60);

/// Write each checkpoint a commit froze, so that FLUSH never waits for one.
fn run_checkpointer(pool: &Pool, stop: &Stop) {
    while !stop.is_set() {
        if !pool.wait_checkpoint_frozen(CHECKPOINT_WAIT, || stop.is_set()) || stop.is_set() {
            continue;
        }
        if pool.is_fenced() {
            // The frozen checkpoint stays: sleep, not spin, until stopped.
            stop.wait(Duration::from_millis(100));
            continue;
        }
        if let Err(e) = pool.checkpoint_work() {
            log::error!("background checkpoint failed: {e}");
            // Still frozen: try again later, not in a loop of errors.
            stop.wait(Duration::from_millis(100));
        }
    }
}

/// How often the compactor looks, and how many 1 MiB windows it examines
/// per look: at most 8 MiB moved per 100 ms, and a client write waits at
/// most one step for it to yield.
const COMPACT_TICK: Duration = Duration::from_millis(100);
const COMPACT_WINDOWS: usize = 8;

/// When clients write, a pass of the threshold mode that moved nothing
/// makes the compactor rest this long before it looks again.
const BUSY_REST: Duration = Duration::from_secs(10);

/// When the background compactor runs (`ServiceOptions`).
#[derive(Debug, Clone, Copy)]
struct Compaction {
    idle: Option<Duration>,
    at: Option<u64>,
}

/// Background compaction: once no client wrote for `idle`, walk every
/// volume a few windows per tick, moving scattered ones (`relayout_step`);
/// the first client write pauses it, and a pass that moved nothing makes
/// it rest until the next write. With a threshold `at`, it also walks
/// while clients write, one window per tick, as long as the volumes are
/// more fragmented than that; a pass that moved nothing rests
/// `BUSY_REST`.
fn run_compactor(pool: &Pool, when: Compaction, stop: &Stop) {
    let mut cursor = RelayoutCursor::default();
    let writes = || pool.write_gen.load(Ordering::SeqCst);
    let (mut seen, mut quiet_since) = (writes(), Instant::now());
    let (mut moved_in_pass, mut rest_at, mut busy_rest) = (0u64, None, Instant::now());
    let (mut cleaning, mut cleaned_at) = (None, None);
    while !stop.wait(COMPACT_TICK) {
        let now = writes();
        let written = now != seen;
        if written {
            (seen, quiet_since) = (now, Instant::now());
        }
        let quiet = !written && when.idle.is_some_and(|i| quiet_since.elapsed() >= i);
        if quiet && rest_at == Some(now) && cleaned_at != Some(now) && !pool.is_fenced() {
            // The volumes are compact and clients idle: clean the regions
            // left behind. Its own moves are not a client's writes.
            let finished = clean_tick(pool, &mut cleaning);
            seen = writes();
            rest_at = Some(seen);
            if finished {
                cleaned_at = Some(seen);
            }
            continue;
        }
        let idle = quiet && rest_at != Some(now);
        let busy = !idle && Instant::now() >= busy_rest && when.at.is_some_and(|at| fragmented(pool, at));
        if !(idle || busy) || pool.is_fenced() {
            continue;
        }
        match pool.relayout_step(&mut cursor, if idle { COMPACT_WINDOWS } else { 1 }) {
            Ok(step) => {
                // Its own moves count as writes: not a client's.
                seen = writes();
                moved_in_pass += step.windows_moved;
                if step.wrapped {
                    let nothing = moved_in_pass == 0;
                    rest_at = nothing.then_some(seen);
                    if nothing && busy {
                        busy_rest = Instant::now() + BUSY_REST;
                    }
                    moved_in_pass = 0;
                }
            }
            Err(e) => {
                log::warn!("background compaction: {e}");
                (quiet_since, busy_rest) = (Instant::now(), Instant::now() + BUSY_REST);
            }
        }
    }
}

/// One step of the idle cleaning pass (started if none is under way):
/// up to `COMPACT_WINDOWS` runs moved. Whether the pass is over (done, or
/// failed: logged, and left until clients write again).
fn clean_tick(pool: &Pool, cleaning: &mut Option<CleanPass>) -> bool {
    let step = |pass: &mut Option<CleanPass>| -> crate::error::Result<bool> {
        let p = match pass {
            Some(p) => p,
            None => pass.insert(pool.start_idle_cleaning()?),
        };
        pool.clean_step(p, COMPACT_WINDOWS)?;
        match pass.take_if(|p| p.done()) {
            Some(done) => {
                let r = pool.finish_cleaning(done)?;
                if r.blocks_moved > 0 {
                    log::info!(
                        "idle cleaning: {} of {} partly used regions freed, {} MiB moved; {} whole free regions",
                        r.regions_freed,
                        r.candidates,
                        r.blocks_moved >> 8,
                        r.free_regions_after
                    );
                }
                Ok(true)
            }
            None => Ok(false),
        }
    };
    step(cleaning).unwrap_or_else(|e| {
        log::warn!("idle cleaning: {e}");
        *cleaning = None;
        true
    })
}

/// Whether the block volumes hold more than `at` extents per GiB they
/// map (at least 64 MiB of it: a few extents of a nearly empty pool are
/// not fragmentation).
fn fragmented(pool: &Pool, at: u64) -> bool {
    let (extents, bytes) = pool.list_volumes().iter().fold((0u64, 0u64), |(e, b), v| (e + v.extents, b + v.allocated));
    bytes >= 64 << 20 && u128::from(extents) << 30 > u128::from(at) * u128::from(bytes)
}

/// Bring RESILVERING mirror legs in sync while clients work.
fn run_leg_resync(pool: &Pool, notice: Option<&(dyn Fn(&str) + Send + Sync)>, stop: &Stop) {
    let say = |msg: &str| match notice {
        Some(f) => f(msg),
        None => log::info!("{msg}"),
    };
    say("resyncing mirror legs in the background");
    match pool.resync_legs_until(&mut |_, _| {}, &|| stop.is_set()) {
        Ok(_) if stop.is_set() => {
            log::warn!("mirror resync stopped; legs not done stay RESILVERING until the next start")
        }
        Ok(bytes) => say(&format!("mirror resync done ({} MiB copied)", bytes >> 20)),
        Err(e) => log::error!("mirror resync failed (legs stay RESILVERING until the next start): {e}"),
    }
}

/// Go on evacuating the members a crash or a stop left draining (`tarn
/// dev remove`), with no rate but yielding to clients (`service::pace`),
/// until done, stopped, or cancelled (`dev
/// remove --cancel` clears the member's draining state). A `dev remove`
/// run meanwhile moves the same runs safely: each move checks, under the
/// pool lock, that its run is still where it was.
fn run_evacuation(pool: &Pool, members: &[usize], stop: &Stop) {
    for &i in members {
        log::warn!("member {i} is being removed: evacuation resumes in the background");
        let mut pace = Pace::new(pool, None);
        let mut go_on = |moved: u64, _| {
            pace.after_step(moved);
            !stop.is_set() && pool.is_draining(i)
        };
        match pool.evacuate_device(i, &mut go_on) {
            Ok(r) if r.remaining_bytes == 0 => log::warn!(
                "member {i}: evacuation done in the background ({} MiB moved); {}",
                r.moved_bytes >> 20,
                if r.detached.is_some() { "removed from the pool" } else { "no live data left on it" }
            ),
            Ok(r) => log::warn!("member {i}: evacuation stopped, {} MiB of live data left", r.remaining_bytes >> 20),
            Err(e) => log::error!("member {i}: background evacuation failed (run `tarn dev remove {i}`): {e}"),
        }
    }
}

/// Go on rebuilding the members a crash or a stop left half rebuilt from
/// parity rows (`tarn pool replace`), with no rate but yielding to
/// clients, until done or stopped.
fn run_rebuild(pool: &Pool, members: &[usize], stop: &Stop) {
    for &i in members {
        log::warn!("member {i} is being rebuilt from parity rows: the rebuild resumes in the background");
        let mut pace = Pace::new(pool, None);
        let mut go_on = |done: u64, _| {
            pace.after_step(done * 4096);
            !stop.is_set()
        };
        match pool.rebuild_member(i, &mut go_on) {
            Ok(r) if !r.stopped => {
                log::warn!("member {i}: rebuilt in the background ({} MiB)", (r.rebuilt * 4096) >> 20)
            }
            Ok(_) => log::warn!("member {i}: rebuild stopped; it resumes at the next start"),
            Err(e) => log::error!("member {i}: background rebuild failed (run `tarn pool replace {i} DEVICE`): {e}"),
        }
    }
}

/// Go on copying the members a crash or a stop left half replaced (`tarn
/// pool replace` of a present member), with no rate but yielding to
/// clients, until done or stopped.
fn run_replace(pool: &Pool, members: &[usize], stop: &Stop) {
    for &i in members {
        log::warn!("member {i} is being replaced: the copy resumes in the background");
        let mut pace = Pace::new(pool, None);
        let mut go_on = |done: u64, _| {
            pace.after_step(done * 4096);
            !stop.is_set()
        };
        match pool.copy_member(i, &mut go_on) {
            Ok(r) if !r.stopped => {
                log::warn!("member {i}: replaced in the background ({} MiB copied)", (r.copied * 4096) >> 20)
            }
            Ok(_) => log::warn!("member {i}: replace stopped; it resumes at the next start"),
            Err(e) => log::error!("member {i}: background replace failed (run `tarn pool replace {i} DEVICE`): {e}"),
        }
    }
}

/// Resync the overwrite regions a crash left open, while clients work
/// (reads there resync what they touch first).
fn run_region_resync(pool: &Pool, pending: usize, stop: &Stop) {
    let started = Instant::now();
    match pool.resync_until(&|| stop.is_set()) {
        Ok(Some(n)) => {
            log::info!("resync of {pending} regions done in {:.1?}: {n} checksums renewed", started.elapsed())
        }
        Ok(None) => log::info!("resync of overwrite regions stopped; the closing checkpoint finishes it"),
        Err(e) => log::error!("resync failed: {e}"),
    }
}
