//! Replies that wait for a commit (fsync, fsyncdir, a volume snapshot or
//! its delete by setxattr), answered by one `fuse-commit` thread instead
//! of the thread that took the request.
//!
//! Why: the kernel hands each CPU's requests to that CPU's ring queue
//! (`uring.rs`). A queue thread that made the commit itself stopped
//! serving its other entries for the commit's device flush: in PostMark
//! with a volume snapshot every 2 s, each snapshot's commit (0.6-1.2 s
//! while the pool file's disk was busy) held up whichever PostMark
//! request came on the same CPU, 9 s of a 40 s run. The commit thread
//! makes the commit, then hands the reply to an `answer` that sends it
//! (a /dev/fuse write, or a ring queue's mailbox: `uring.rs`).

use crate::reply::Reply;
use std::io;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::JoinHandle;

/// Deferred replies queued at most; a request thread that finds the queue
/// full waits (each holds one of the kernel's bounded request slots, so
/// this bound is seldom reached: 8 ring entries per CPU and the /dev/fuse
/// thread's one).
const QUEUE: usize = 256;

/// The work a deferred reply waits for (the commit; its reply, or the
/// commit's error) and what sends that reply.
struct Job {
    work: Box<dyn FnOnce() -> Reply + Send>,
    answer: Box<dyn FnOnce(Reply) + Send>,
}

/// The commit thread; ends once every `Deferrer` is dropped.
pub(crate) struct Committer {
    tx: Option<SyncSender<Job>>,
    thread: Option<JoinHandle<()>>,
}

/// A request thread's handle to queue a deferred reply.
#[derive(Clone)]
pub(crate) struct Deferrer {
    tx: SyncSender<Job>,
}

impl Committer {
    pub fn start() -> io::Result<Committer> {
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let thread = std::thread::Builder::new().name("fuse-commit".into()).spawn(move || run(rx))?;
        Ok(Committer { tx: Some(tx), thread: Some(thread) })
    }

    pub fn deferrer(&self) -> Option<Deferrer> {
        self.tx.as_ref().map(|tx| Deferrer { tx: tx.clone() })
    }

    /// Waits for every queued reply's work (the request threads, which
    /// hold the other senders, have ended).
    pub fn stop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One job after another, in the order queued: each sends its reply once
/// its work is done. The first of several waiting fsyncs commits for
/// all; the later ones find nothing new to commit and answer at once.
fn run(rx: Receiver<Job>) {
    while let Ok(job) = rx.recv() {
        let reply = (job.work)();
        (job.answer)(reply);
    }
}

impl Deferrer {
    /// Queue `work`; `answer` gets its reply on the commit thread. When
    /// the thread is gone (never, while a request thread runs), both run
    /// here.
    pub fn defer(&self, work: impl FnOnce() -> Reply + Send + 'static, answer: impl FnOnce(Reply) + Send + 'static) {
        let job = Job { work: Box::new(work), answer: Box::new(answer) };
        if let Err(mpsc::SendError(job)) = self.tx.send(job) {
            log::error!("the fuse commit thread is gone: committing on the request thread");
            (job.answer)((job.work)());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;
    use std::time::Duration;

    /// A reply whose work blocks does not hold up the thread that queued
    /// it, and arrives once the work is done; jobs answer in order.
    #[test]
    fn a_blocked_commit_holds_up_only_its_own_reply() {
        let mut c = Committer::start().unwrap();
        let d = c.deferrer().unwrap();
        let (release, blocked) = channel::<()>();
        let (answered, answers) = channel::<(u32, Reply)>();
        let (queued, both_queued) = channel::<()>();
        let a = answered.clone();
        let queuer = std::thread::spawn(move || {
            d.defer(
                move || {
                    blocked.recv().unwrap();
                    Reply::Empty
                },
                move |r| a.send((1, r)).unwrap(),
            );
            d.defer(|| Reply::Error(libc::EIO), move |r| answered.send((2, r)).unwrap());
            queued.send(()).unwrap();
        });
        // The queuing thread goes on while the first job's work is
        // blocked; nothing is answered meanwhile (the second job waits
        // behind the first).
        let went_on = both_queued.recv_timeout(Duration::from_secs(10));
        let early = answers.try_recv();
        release.send(()).unwrap();
        assert!(went_on.is_ok(), "the queuing thread waited for the blocked work");
        assert!(early.is_err(), "answered before its work was done: {early:?}");
        assert_eq!(answers.recv_timeout(Duration::from_secs(10)).unwrap(), (1, Reply::Empty));
        assert_eq!(answers.recv_timeout(Duration::from_secs(10)).unwrap(), (2, Reply::Error(libc::EIO)));
        queuer.join().unwrap();
        c.stop();
    }

    /// `stop` runs what is still queued before it returns.
    #[test]
    fn stop_finishes_the_queued_replies() {
        let mut c = Committer::start().unwrap();
        let d = c.deferrer().unwrap();
        let (answered, answers) = channel::<Reply>();
        for _ in 0..3 {
            let a = answered.clone();
            d.defer(
                || {
                    std::thread::sleep(Duration::from_millis(20));
                    Reply::Empty
                },
                move |r| a.send(r).unwrap(),
            );
        }
        drop(d);
        c.stop();
        assert_eq!(answers.try_iter().count(), 3);
    }
}
