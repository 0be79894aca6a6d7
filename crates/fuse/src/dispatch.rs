//! A decoded request to its handler: the one path both transports
//! (`dev.rs`, `uring.rs`) take into `TarnFs`.

use crate::decode::{self, Header, Op};
use crate::deferred::Deferrer;
use crate::reply::Reply;
use crate::tarnfs::{CommitAfter, TarnFs};
use std::sync::{Arc, Mutex, MutexGuard};

/// The handlers, shared by the /dev/fuse loop and the ring queues.
pub(crate) type Shared = Arc<Mutex<TarnFs>>;

/// The handlers' lock; a handler that panicked aborted the process
/// (panic = "abort"), so a poisoned lock holds a whole state.
pub(crate) fn lock(fs: &Shared) -> MutexGuard<'_, TarnFs> {
    fs.lock().unwrap_or_else(|p| p.into_inner())
}

/// A request's answer: now, or once a commit is made (`deferred.rs`).
pub(crate) enum Served {
    Now(Reply),
    AfterCommit(Reply, CommitAfter),
}

/// Serves one decoded request that is not INIT.
pub(crate) fn serve(fs: &Shared, h: &Header, op: Result<Op<'_>, decode::Malformed>) -> Served {
    match op {
        Ok(Op::Destroy) => Served::Now(Reply::Empty),
        Ok(op) => {
            let mut fs = lock(fs);
            let reply = fs.handle(h, op);
            match fs.commit_after.take() {
                None => Served::Now(reply),
                Some(commit) => Served::AfterCommit(reply, commit),
            }
        }
        Err(decode::Malformed) => {
            log::warn!("malformed FUSE request (opcode {}, {} bytes)", h.opcode, h.len);
            Served::Now(Reply::Error(libc::EIO))
        }
    }
}

impl Served {
    /// The reply: now, or sent by `answer` on the commit thread once the
    /// commit is made (None then).
    pub(crate) fn reply_or_defer(
        self,
        deferrer: &Deferrer,
        answer: impl FnOnce(Reply) + Send + 'static,
    ) -> Option<Reply> {
        match self {
            Served::Now(reply) => Some(reply),
            Served::AfterCommit(reply, commit) => {
                deferrer.defer(move || commit.run(reply), answer);
                None
            }
        }
    }
}
