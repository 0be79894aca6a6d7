//! The change gate: a commit never takes the queued ops while a caller's
//! multi-write change (a tarn-fs namespace change: inode, entries,
//! directory blocks) is half written.
//!
//! Why: a commit makes durable every op queued when it takes the queue.
//! tarn-fs keeps its own commits out of a change with its namespace lock,
//! and its own back-pressure commits with `make_room_for`; but under `tarn
//! serve --mount` other threads commit the same pool (an NBD FLUSH, the
//! service's timed commit, a block writer's back-pressure commit, a
//! checkpoint), and a crash after one that fell inside a rename keeps the
//! file under two names.
//!
//! How: a thread making changes holds a *share* (tarn-fs: for as long as
//! it holds its namespace lock). Taking the commit lock first *closes*
//! the gate: it waits, holding no pool lock, until no share is held, and
//! keeps new shares out until the commit has taken its ops
//! (`Pool::flush_then`, back-pressure) or the commit lock is released. A
//! thread that holds a share takes the commit lock without closing (its
//! own commits fall between its own changes, which its caller orders),
//! and once it has made room for a change (`make_room_for`) its writes
//! make no back-pressure commit until the share ends: other writers may
//! have filled the queue meanwhile, and such a commit would fall inside
//! the change. Closers are served before new shares, except a helper's
//! (`enter(false)`), taken where a share holder may wait for its taker:
//! tarn-fs's write-behind thread around each write, a partial block
//! write around its stripe lock, a parity write around its row locks. A
//! commit a helper makes (a full pool) does not wait for changes.
//!
//! Lock order: a share is taken after the caller's own locks (tarn-fs's
//! namespace lock) and before every pool lock. A closer waits holding no
//! pool lock, and keeps the gate closed only while it holds the commit
//! lock, closing it once per hold: a share holder may wait for the commit
//! lock (its holder never waits for shares), and waits for a closer only
//! on entry, holding no share.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::ThreadId;

/// Threads holding shares at once: far above any caller's (a mount's
/// request threads and its commit, write-behind and readahead threads).
const MAX_HOLDERS: usize = 1024;

#[derive(Default)]
pub struct ChangeGate {
    state: Mutex<GateState>,
    turn: Condvar,
}

#[derive(Default)]
struct GateState {
    /// A commit lock holder keeps shares out.
    closed: bool,
    /// Threads waiting to close: new shares wait for them.
    closers: usize,
    holders: Vec<Holder>,
}

struct Holder {
    thread: ThreadId,
    /// Nested shares of one thread.
    depth: u32,
    /// Room was made for a change: no back-pressure commit until it ends.
    changing: bool,
}

impl GateState {
    fn holder(&mut self, thread: ThreadId) -> Option<&mut Holder> {
        self.holders.iter_mut().find(|h| h.thread == thread)
    }
}

/// A share of the gate: changes may be made while it is held.
pub struct ChangeShare<'a> {
    gate: &'a ChangeGate,
    /// Its holder (a share is not `Send`: it ends on this thread).
    thread: ThreadId,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for ChangeShare<'_> {
    fn drop(&mut self) {
        self.gate.exit(self.thread);
    }
}

/// The gate closed by a commit lock holder; open again when dropped.
pub(crate) struct Closed<'a> {
    gate: &'a ChangeGate,
}

impl Drop for Closed<'_> {
    fn drop(&mut self) {
        let mut s = self.gate.lock();
        debug_assert!(s.closed, "an open gate reopened");
        s.closed = false;
        drop(s);
        self.gate.turn.notify_all();
    }
}

impl ChangeGate {
    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A share for the calling thread (nested: counted). Waits while the
    /// gate is closed, and while a closer waits when `yield_to_closers`.
    pub(crate) fn enter(&self, yield_to_closers: bool) -> ChangeShare<'_> {
        let me = std::thread::current().id();
        let mut s = self.lock();
        loop {
            if let Some(h) = s.holder(me) {
                h.depth += 1;
                break;
            }
            let kept_out = s.closed || (yield_to_closers && s.closers > 0);
            if !kept_out {
                assert!(s.holders.len() < MAX_HOLDERS, "change gate: more than {MAX_HOLDERS} threads hold shares");
                s.holders.push(Holder { thread: me, depth: 1, changing: false });
                break;
            }
            s = self.turn.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        ChangeShare { gate: self, thread: me, _not_send: std::marker::PhantomData }
    }

    fn exit(&self, me: ThreadId) {
        let mut s = self.lock();
        let Some(at) = s.holders.iter().position(|h| h.thread == me) else {
            debug_assert!(false, "a change share without its holder");
            return;
        };
        s.holders[at].depth -= 1;
        if s.holders[at].depth == 0 {
            s.holders.swap_remove(at);
            let empty = s.holders.is_empty();
            drop(s);
            if empty {
                self.turn.notify_all();
            }
        }
    }

    /// Close the gate for a commit lock holder: None when the calling
    /// thread holds a share (it commits between its own changes).
    pub(crate) fn close(&self) -> Option<Closed<'_>> {
        let me = std::thread::current().id();
        let mut s = self.lock();
        if s.holder(me).is_some() {
            return None;
        }
        s.closers += 1;
        while s.closed || !s.holders.is_empty() {
            s = self.turn.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.closers -= 1;
        s.closed = true;
        Some(Closed { gate: self })
    }

    /// The calling thread begins a change it makes room for: its writes
    /// make no back-pressure commit until its share ends. Returns whether
    /// it was inside one already. No-op (false) without a share.
    pub(crate) fn mark_changing(&self) -> bool {
        let mut s = self.lock();
        let Some(h) = s.holder(std::thread::current().id()) else { return false };
        std::mem::replace(&mut h.changing, true)
    }

    /// Whether the calling thread is inside a change it made room for.
    pub(crate) fn changing_here(&self) -> bool {
        self.lock().holder(std::thread::current().id()).is_some_and(|h| h.changing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    #[test]
    fn a_closer_waits_for_shares_and_keeps_new_ones_out() {
        let gate = ChangeGate::default();
        let closed = AtomicBool::new(false);
        std::thread::scope(|s| {
            let share = gate.enter(true);
            let closer = s.spawn(|| {
                let c = gate.close();
                closed.store(true, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(50));
                closed.store(false, Ordering::SeqCst);
                drop(c);
            });
            std::thread::sleep(Duration::from_millis(50));
            assert!(!closed.load(Ordering::SeqCst), "closed with a share held");
            drop(share);
            // A new share waits for the closer that was waiting.
            while !closed.load(Ordering::SeqCst) && !closer.is_finished() {
                std::thread::yield_now();
            }
            let again = gate.enter(true);
            assert!(!closed.load(Ordering::SeqCst), "a share entered a closed gate");
            drop(again);
            closer.join().unwrap();
        });
    }

    #[test]
    fn a_share_holder_neither_closes_nor_waits_for_itself() {
        let gate = ChangeGate::default();
        let outer = gate.enter(true);
        let inner = gate.enter(true);
        assert!(gate.close().is_none());
        assert!(!gate.mark_changing());
        assert!(gate.mark_changing(), "a second mark finds the change");
        assert!(gate.changing_here());
        drop(inner);
        assert!(gate.changing_here(), "the outer share still holds the change");
        drop(outer);
        assert!(!gate.changing_here());
        assert!(gate.close().is_some());
    }

    #[test]
    fn a_helper_enters_past_a_waiting_closer() {
        let gate = ChangeGate::default();
        std::thread::scope(|s| {
            let share = gate.enter(true);
            let closer = s.spawn(|| drop(gate.close()));
            while gate.lock().closers == 0 {
                std::thread::yield_now();
            }
            // The share holder waits for a helper: the helper must get in.
            let helper = s.spawn(|| drop(gate.enter(false)));
            helper.join().unwrap();
            drop(share);
            closer.join().unwrap();
        });
    }
}
