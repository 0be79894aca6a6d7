//! A decoded request to its handler: the one path both transports
//! (`dev.rs`, `uring.rs`) take into `TarnFs`.

use crate::decode::{self, Header, Op};
use crate::reply::Reply;
use crate::tarnfs::TarnFs;
use std::sync::{Arc, Mutex, MutexGuard};

/// The handlers, shared by the /dev/fuse loop and the ring queues.
pub(crate) type Shared = Arc<Mutex<TarnFs>>;

/// The handlers' lock; a handler that panicked aborted the process
/// (panic = "abort"), so a poisoned lock holds a whole state.
pub(crate) fn lock(fs: &Shared) -> MutexGuard<'_, TarnFs> {
    fs.lock().unwrap_or_else(|p| p.into_inner())
}

/// Serves one decoded request that is not INIT.
pub(crate) fn serve(fs: &Shared, h: &Header, op: Result<Op<'_>, decode::Malformed>) -> Reply {
    match op {
        Ok(Op::Destroy) => Reply::Empty,
        Ok(op) => {
            let mut fs = lock(fs);
            let reply = fs.handle(h, op);
            match fs.commit_after.take() {
                None => reply,
                Some(commit) => {
                    drop(fs);
                    commit.run(reply)
                }
            }
        }
        Err(decode::Malformed) => {
            log::warn!("malformed FUSE request (opcode {}, {} bytes)", h.opcode, h.len);
            Reply::Error(libc::EIO)
        }
    }
}
