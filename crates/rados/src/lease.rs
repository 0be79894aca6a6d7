//! One writer at a time: an exclusive RADOS lock on `PREFIX.lock`, taken
//! with a duration and renewed by a thread, through the same cluster
//! session as the device's I/O (so fencing that session's address stops
//! both). Taking over blocklists the holder first, as RBD's exclusive lock
//! does, so nothing of the old writer lands after the new one starts.

use crate::cluster::{cstr, Ioctx};
use crate::device::RadosDevice;
use crate::error::RadosError;
use std::ffi::c_char;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const LOCK_NAME: &str = "tarn";
/// The lock expires this long after the last renewal (a holder that died
/// without --takeover is free after it).
pub const LEASE: Duration = Duration::from_secs(30);
const RENEW_EVERY: Duration = Duration::from_secs(5);
/// Between two attempts to take a held lock while waiting.
const RETRY: Duration = Duration::from_millis(200);
/// The lock holder list buffers (bytes each): far above one holder's size.
const LIST_BUF: usize = 4096;

pub struct LeaseOptions {
    /// Fence the holder (blocklist it, then break its lock) instead of refusing.
    pub takeover: bool,
    /// How long to wait for a holder to let go before refusing.
    pub wait: Duration,
    /// Called once from the renewal thread when the lease is lost (fenced
    /// by another server, or unrenewable for the lease's duration).
    pub on_lost: Box<dyn Fn(String) + Send>,
}

pub struct Lease {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    io: Arc<Ioctx>,
    oid: String,
    cookie: String,
}

/// A lock holder, as the cluster lists it.
#[derive(Debug, Clone)]
struct Holder {
    client: String,
    cookie: String,
    addr: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at {}, cookie {}", self.client, self.addr, self.cookie)
    }
}

fn lock(io: &Ioctx, oid: &str, cookie: &str, flags: u8) -> i32 {
    let Ok(api) = crate::ffi::api() else { return -libc::ENOSYS };
    let (o, n, c, d) = (cstr(oid), cstr(LOCK_NAME), cstr(cookie), cstr("tarn serve"));
    let (Ok(o), Ok(n), Ok(c), Ok(d)) = (o, n, c, d) else { return -libc::EINVAL };
    let mut tv = libc::timeval { tv_sec: LEASE.as_secs() as libc::time_t, tv_usec: 0 };
    // SAFETY: valid ioctx and NUL-terminated strings; `tv` read during the call.
    unsafe { (api.rados_lock_exclusive)(io.raw(), o.as_ptr(), n.as_ptr(), c.as_ptr(), d.as_ptr(), &mut tv, flags) }
}

fn holders(io: &Ioctx, oid: &str) -> Result<Vec<Holder>, RadosError> {
    let api = crate::ffi::api().map_err(RadosError::Load)?;
    let (o, n) = (cstr(oid)?, cstr(LOCK_NAME)?);
    let mut bufs = [[0 as c_char; LIST_BUF]; 4];
    let mut lens = [LIST_BUF; 4];
    let mut exclusive = 0;
    let [tag, clients, cookies, addrs] = &mut bufs;
    let [tl, cl, kl, al] = &mut lens;
    // SAFETY: four buffers of the lengths passed.
    let rc = unsafe {
        (api.rados_list_lockers)(
            io.raw(),
            o.as_ptr(),
            n.as_ptr(),
            &mut exclusive,
            tag.as_mut_ptr(),
            tl,
            clients.as_mut_ptr(),
            cl,
            cookies.as_mut_ptr(),
            kl,
            addrs.as_mut_ptr(),
            al,
        )
    };
    if rc < 0 {
        return Err(RadosError::call(format!("list the lockers of {oid}"), rc as i64));
    }
    let fields = |b: &[c_char], len: usize| -> Vec<String> {
        let bytes: Vec<u8> = b[..len.min(b.len())].iter().map(|&c| c as u8).collect();
        bytes.split(|&c| c == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect()
    };
    let (c, k, a) = (fields(clients, *cl), fields(cookies, *kl), fields(addrs, *al));
    Ok((0..(rc as usize).min(c.len()).min(k.len()).min(a.len()))
        .map(|i| Holder { client: c[i].clone(), cookie: k[i].clone(), addr: a[i].clone() })
        .collect())
}

/// Blocklist `h`'s session, then break its lock.
fn fence(io: &Ioctx, oid: &str, h: &Holder) -> Result<(), RadosError> {
    log::warn!("takeover: fencing {h} (blocklisting its address) before breaking its lock");
    io.cluster.blocklist(&h.addr)?;
    let api = crate::ffi::api().map_err(RadosError::Load)?;
    let (o, n, c, k) = (cstr(oid)?, cstr(LOCK_NAME)?, cstr(&h.client)?, cstr(&h.cookie)?);
    // SAFETY: valid ioctx and NUL-terminated strings.
    let rc = unsafe { (api.rados_break_lock)(io.raw(), o.as_ptr(), n.as_ptr(), c.as_ptr(), k.as_ptr()) };
    if rc < 0 && rc != -libc::ENOENT {
        return Err(RadosError::call(format!("break the lock of {h}"), rc as i64));
    }
    Ok(())
}

fn hostname() -> String {
    let mut b = [0u8; 256];
    // SAFETY: buffer of the length passed.
    let rc = unsafe { libc::gethostname(b.as_mut_ptr().cast(), b.len()) };
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    if rc == 0 {
        String::from_utf8_lossy(&b[..end]).into_owned()
    } else {
        "unknown-host".into()
    }
}

impl Lease {
    /// Take the lease of `dev`'s prefix (see [`LeaseOptions`]).
    pub fn acquire(dev: &RadosDevice, opts: LeaseOptions) -> Result<Lease, RadosError> {
        let cluster = dev.ioctx().cluster.clone();
        let io = Arc::new(cluster.ioctx(&dev.uri().pool)?);
        let oid = dev.uri().lock_object();
        let cookie = format!("{}:pid{}:{}", hostname(), std::process::id(), cluster.instance_id());
        let deadline = Instant::now() + opts.wait;
        let mut fenced_once = false;
        // Bounded by the deadline, and by one fencing.
        loop {
            let rc = lock(&io, &oid, &cookie, 0);
            if rc >= 0 {
                break;
            }
            if rc != -libc::EBUSY && rc != -libc::EEXIST {
                return Err(RadosError::call(format!("lock {oid}"), rc.into()));
            }
            let held = holders(&io, &oid)?;
            if opts.takeover && !fenced_once {
                for h in &held {
                    fence(&io, &oid, h)?;
                }
                fenced_once = true;
                continue;
            }
            if Instant::now() >= deadline {
                let holder = held.iter().map(|h| h.to_string()).collect::<Vec<_>>().join("; ");
                return Err(RadosError::Held { uri: dev.uri().to_string(), holder });
            }
            std::thread::sleep(RETRY);
        }
        log::info!("lease {oid} taken as {cookie} (session {})", cluster.addrs().unwrap_or_default());
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (io, oid, cookie, stop, fenced) =
                (io.clone(), oid.clone(), cookie.clone(), stop.clone(), dev.fenced_flag());
            std::thread::Builder::new()
                .name("rados-lease".into())
                .spawn(move || renew(&io, &oid, &cookie, &stop, &fenced, opts.on_lost))
                .map_err(|e| RadosError::Load(format!("spawn the lease thread: {e}")))?
        };
        Ok(Lease { stop, thread: Some(thread), io, oid, cookie })
    }
}

/// Renew until told to stop; on loss set the device's fenced flag (no
/// write goes out after) and call `on_lost`.
fn renew(
    io: &Ioctx,
    oid: &str,
    cookie: &str,
    stop: &AtomicBool,
    fenced: &AtomicBool,
    on_lost: Box<dyn Fn(String) + Send>,
) {
    let mut last_ok = Instant::now();
    // Bounded: ends when stopped or when the lease is lost.
    while !stop.load(Ordering::SeqCst) {
        let next = Instant::now() + RENEW_EVERY;
        while Instant::now() < next && !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(100));
        }
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let rc = lock(io, oid, cookie, crate::ffi::LOCK_FLAG_MAY_RENEW);
        if rc >= 0 {
            last_ok = Instant::now();
            continue;
        }
        let err = RadosError::call(format!("renew the lease {oid}"), rc.into());
        let lost = rc == -libc::ESHUTDOWN || rc == -libc::EBUSY || last_ok.elapsed() >= LEASE;
        if lost {
            fenced.store(true, Ordering::SeqCst);
            on_lost(format!("{err}: another server fenced this one or the lease expired"));
            return;
        }
        log::warn!("{err}; retrying");
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let Ok(api) = crate::ffi::api() else { return };
        let (Ok(o), Ok(n), Ok(c)) = (cstr(&self.oid), cstr(LOCK_NAME), cstr(&self.cookie)) else { return };
        // SAFETY: valid ioctx and NUL-terminated strings.
        let rc = unsafe { (api.rados_unlock)(self.io.raw(), o.as_ptr(), n.as_ptr(), c.as_ptr()) };
        if rc < 0 {
            log::warn!("unlock {}: errno {}", self.oid, -rc);
        }
    }
}
