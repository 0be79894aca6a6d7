//! A short scheduler slice for the FUSE session thread
//! (docs/ARCHITECTURE.md, *The pmt slice*). Every request of an
//! application like PostMark waits for this one thread, and each request
//! is short (tens of microseconds of CPU): what it waits for, on a busy
//! machine, is the thread's turn on a CPU after the request woke it.
//! Linux's EEVDF scheduler (6.12 and later) takes a per-thread slice
//! (`sched_setattr`, `sched_runtime` of a SCHED_OTHER thread): a shorter
//! one gives the thread an earlier deadline, so a wake-up preempts sooner.
//! It does not raise the thread's share of the CPU (its weight, the nice
//! value, is unchanged). Older kernels ignore the field.

use std::io;
use std::time::Duration;

/// `struct sched_attr` of sched_setattr(2), its first version
/// (SCHED_ATTR_SIZE_VER0, 48 bytes: no utilization clamps).
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

const ATTR_SIZE: u32 = std::mem::size_of::<SchedAttr>() as u32;

/// The calling thread's scheduling attributes.
fn current() -> io::Result<SchedAttr> {
    let mut attr = SchedAttr::default();
    // SAFETY: the kernel writes at most ATTR_SIZE bytes into `attr`.
    let rc = unsafe { libc::syscall(libc::SYS_sched_getattr, 0, &mut attr as *mut SchedAttr, ATTR_SIZE, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(attr)
}

/// Ask for `slice` for the calling thread, keeping its policy and nice
/// value; a thread someone put in another policy (batch, idle, real
/// time) is left as it is.
pub(crate) fn ask(slice: Duration) -> io::Result<()> {
    let mut attr = current()?;
    if attr.policy != libc::SCHED_OTHER as u32 {
        return Ok(());
    }
    attr.size = ATTR_SIZE;
    attr.flags = 0;
    attr.runtime = u64::try_from(slice.as_nanos()).unwrap_or(u64::MAX);
    // SAFETY: the kernel reads ATTR_SIZE bytes of `attr`.
    let rc = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slice the kernel keeps for the calling thread (0 on kernels
    /// without per-thread slices).
    fn slice_now() -> u64 {
        current().expect("sched_getattr").runtime
    }

    #[test]
    fn the_asked_slice_is_the_threads() {
        let (before, after) = std::thread::spawn(|| {
            let before = slice_now();
            ask(Duration::from_micros(100)).expect("sched_setattr");
            (before, slice_now())
        })
        .join()
        .expect("thread");
        // Per-thread slices came with Linux 6.12: on an older kernel this
        // fails (the field reads back 0), it does not pass unchecked.
        assert_eq!(after, 100_000, "the slice read back (was {before})");
    }

    #[test]
    fn a_batch_thread_is_left_alone() {
        let (before, after, policy) = std::thread::spawn(|| {
            let mut batch = current().expect("sched_getattr");
            batch.size = ATTR_SIZE;
            batch.policy = libc::SCHED_BATCH as u32;
            // SAFETY: the kernel reads ATTR_SIZE bytes of `batch`.
            let rc = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &batch as *const SchedAttr, 0) };
            assert_eq!(rc, 0, "{}", io::Error::last_os_error());
            let before = slice_now();
            ask(Duration::from_micros(100)).expect("ask");
            (before, slice_now(), current().expect("sched_getattr").policy)
        })
        .join()
        .expect("thread");
        assert_eq!(policy, libc::SCHED_BATCH as u32);
        assert_eq!(after, before);
    }
}
