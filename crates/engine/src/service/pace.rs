//! The pace of a background copy (member evacuation, the member copy of
//! `pool replace`, a parity rebuild): at most `rate` bytes per second
//! when the user asked for a rate, and, at any rate, yielding to clients.
//!
//! Yielding works like md's resync between `sync_speed_min` and
//! `sync_speed_max`, or ZFS's scan I/O below client I/O: after each step
//! the copier looks whether clients sent requests since the last step
//! (`Pool::client_ops`, bumped by every client read, write, trim and
//! zeroing, never by the movers); if they did, it rests `YIELD_RATIO`
//! times as long as that step took, so with clients busy it holds the
//! devices, the CPUs and the pool's locks at most a third of the time and
//! clients keep most of their rate. With no client it never rests: an
//! idle evacuation runs at full speed. A step is at most a batch of 16
//! windows (16 MiB), so rests are short and the copy always goes on.

use crate::pool::Pool;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Rest after a step clients shared, as a multiple of the step's time.
pub const YIELD_RATIO: u32 = 2;

/// The longest rest after one step: a step slowed by something else (a
/// commit, a slow device) does not stop the copy for long.
pub const MAX_REST: Duration = Duration::from_secs(1);

/// The pace of one background copy; `after_step` after every step.
pub struct Pace<'a> {
    pool: &'a Pool,
    rate: Option<u64>,
    started: Instant,
    step_from: Instant,
    seen: u64,
    sleep: Box<dyn FnMut(Duration) + 'a>,
    /// Steps after which the copy rested for clients.
    pub yields: u64,
    /// The time rested for clients, in all.
    pub rested: Duration,
}

impl<'a> Pace<'a> {
    /// At most `rate` bytes per second (None: no bound), yielding to
    /// clients of `pool` (the default of every background copy).
    pub fn new(pool: &'a Pool, rate: Option<u64>) -> Self {
        Self::with_sleep(pool, rate, Box::new(std::thread::sleep))
    }

    /// [`Pace::new`] resting through `sleep` (tests count the rests).
    pub fn with_sleep(pool: &'a Pool, rate: Option<u64>, sleep: Box<dyn FnMut(Duration) + 'a>) -> Self {
        let now = Instant::now();
        let seen = pool.client_ops.load(Ordering::Relaxed);
        Pace { pool, rate, started: now, step_from: now, seen, sleep, yields: 0, rested: Duration::ZERO }
    }

    /// Call after each step, `done` bytes copied so far: holds the rate,
    /// then rests if clients sent requests since the last step.
    pub fn after_step(&mut self, done: u64) {
        let worked = self.step_from.elapsed();
        crate::integrity::scrub::throttle(self.rate, done, self.started);
        let now = self.pool.client_ops.load(Ordering::Relaxed);
        // Requests during the last rest count too: clients still busy.
        let busy = now != self.seen;
        self.seen = now;
        if busy {
            let rest = rest_after(worked);
            (self.sleep)(rest);
            self.yields += 1;
            self.rested += rest;
        }
        self.step_from = Instant::now();
    }
}

/// The rest after a step that took `worked` while clients were busy.
pub fn rest_after(worked: Duration) -> Duration {
    (worked * YIELD_RATIO).min(MAX_REST)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rest_is_proportional_and_bounded() {
        assert_eq!(rest_after(Duration::from_millis(3)), Duration::from_millis(6));
        assert_eq!(rest_after(Duration::ZERO), Duration::ZERO);
        assert_eq!(rest_after(Duration::from_secs(5)), MAX_REST);
    }
}
