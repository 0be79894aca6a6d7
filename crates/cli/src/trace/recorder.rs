//! The recorder behind `tarn serve --trace FILE`: every request an export
//! answers becomes a 32-byte record (tarn_format::trace), handed to a
//! writer thread through a bounded queue. A full queue drops the record
//! and counts it, so tracing never holds a request up (its cost on the
//! I/O path is a clock read, a name lookup and a channel send).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tarn_format::trace::{encode_header, TraceCmd, TraceRecord, MAX_TRACE_EXPORTS};

/// Records queued for the writer at most (~2 MiB).
const QUEUE: usize = 1 << 16;

pub struct Tracer {
    start: Instant,
    /// Taken (closed) by `finish`; read-locked per record (uncontended).
    tx: RwLock<Option<SyncSender<TraceRecord>>>,
    /// Export name -> id; a name record is queued when an id is assigned.
    ids: Mutex<HashMap<String, u32>>,
    recorded: AtomicU64,
    dropped: AtomicU64,
    writer: Mutex<Option<JoinHandle<std::io::Result<()>>>>,
}

impl Tracer {
    /// Create (truncate) `path` and start the writer thread.
    pub fn create(path: &Path) -> std::io::Result<Arc<Tracer>> {
        let mut out = BufWriter::with_capacity(1 << 20, File::create(path)?);
        let unix_ns = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        out.write_all(&encode_header(unix_ns))?;
        let (tx, rx) = sync_channel(QUEUE);
        let writer = std::thread::Builder::new().name("trace-writer".into()).spawn(move || write_all(rx, out))?;
        Ok(Arc::new(Tracer {
            start: Instant::now(),
            tx: RwLock::new(Some(tx)),
            ids: Mutex::new(HashMap::new()),
            recorded: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            writer: Mutex::new(Some(writer)),
        }))
    }

    /// The id of export `name`, naming it in the trace the first time.
    pub fn export_id(&self, name: &str) -> Option<u32> {
        let mut ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&id) = ids.get(name) {
            return Some(id);
        }
        let id = u32::try_from(ids.len()).ok().filter(|&i| i < MAX_TRACE_EXPORTS)?;
        ids.insert(name.to_string(), id);
        // Queued under the lock, so the name goes before any request of
        // it, and never dropped (a request of an unnamed export would make
        // the trace unreadable): this waits for room, once per export.
        let tx = self.tx.read().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = tx.as_ref() {
            match tx.send(TraceRecord::Name { export: id, name: name.to_string() }) {
                Ok(()) => self.recorded.fetch_add(1, Ordering::Relaxed),
                Err(_) => {
                    // The writer is gone (an I/O error): this export goes unrecorded.
                    ids.remove(name);
                    return None;
                }
            };
        }
        Some(id)
    }

    /// Record one request (stamped now, as it is answered).
    pub fn request(&self, export: u32, cmd: TraceCmd, flags: u8, offset: u64, length: u64) {
        let t_ns = self.start.elapsed().as_nanos() as u64;
        self.push(TraceRecord::Request { t_ns, export, cmd, flags, offset, length });
    }

    fn push(&self, rec: TraceRecord) {
        let tx = self.tx.read().unwrap_or_else(|p| p.into_inner());
        let Some(tx) = tx.as_ref() else { return };
        match tx.try_send(rec) {
            Ok(()) => self.recorded.fetch_add(1, Ordering::Relaxed),
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => self.dropped.fetch_add(1, Ordering::Relaxed),
        };
    }

    /// Stop recording, write out what is queued; returns (recorded, dropped).
    pub fn finish(&self) -> std::io::Result<(u64, u64)> {
        drop(self.tx.write().unwrap_or_else(|p| p.into_inner()).take());
        if let Some(w) = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take() {
            w.join().map_err(|_| std::io::Error::other("trace writer panicked"))??;
        }
        Ok((self.recorded.load(Ordering::Relaxed), self.dropped.load(Ordering::Relaxed)))
    }
}

fn write_all(rx: Receiver<TraceRecord>, mut out: BufWriter<File>) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(64);
    for rec in rx {
        buf.clear();
        rec.encode(&mut buf);
        out.write_all(&buf)?;
    }
    out.flush()?;
    out.into_inner().map_err(|e| e.into_error())?.sync_all()
}
