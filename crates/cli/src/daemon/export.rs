//! The bridge from NBD to the engine: each volume is a writable export and
//! each snapshot a read-only export named `VOL@SNAP`. Engine errors become
//! NBD errors here and only here.

use crate::metrics::{ExportMetrics, Metrics};
use crate::trace::recorder::Tracer;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tarn_engine::{EngineError, Pool, View};
use tarn_format::trace::{trace_flags, TraceCmd};
use tarn_nbd::{Backend, BlockStatusExtent, ContextExtent, Export, ExportDescription, ExportError};

/// Prefix of the changed-block tracking contexts, one per older snapshot.
const DIRTY_BITMAP: &str = "qemu:dirty-bitmap:";
/// Flag of a changed extent in a dirty-bitmap context.
const DIRTY: u32 = 1;

pub struct PoolBackend {
    pool: Arc<Pool>,
    clients: Arc<Clients>,
    tracer: Option<Arc<Tracer>>,
    metrics: Option<Arc<Metrics>>,
}

impl PoolBackend {
    pub fn new(
        pool: Arc<Pool>,
        clients: Arc<Clients>,
        tracer: Option<Arc<Tracer>>,
        metrics: Option<Arc<Metrics>>,
    ) -> Self {
        PoolBackend { pool, clients, tracer, metrics }
    }
}

/// Open exports per (volume, view), so that an admin request can tell
/// whether clients are looking at what it is about to change.
#[derive(Default)]
pub struct Clients(Mutex<HashMap<(u32, View), usize>>);

impl Clients {
    /// Exports open on this view; includes the short-lived ones a client
    /// opens while negotiating.
    pub fn connected(&self, vol: u32, view: View) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get(&(vol, view)).copied().unwrap_or(0)
    }

    fn add(&self, key: (u32, View), delta: isize) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(key).or_insert(0);
        *n = n.saturating_add_signed(delta);
        if *n == 0 {
            map.remove(&key);
        }
    }
}

impl Backend for PoolBackend {
    fn list(&self) -> Vec<ExportDescription> {
        let mut out = Vec::new();
        for v in self.pool.list_volumes() {
            // older_snapshots of the head is every snapshot, without the
            // space accounting list_snapshots would compute for each.
            let snaps = self.pool.older_snapshots(v.id, View::Head);
            out.push(ExportDescription {
                description: format!("tarn thin volume, {} bytes", v.size),
                name: v.name.clone(),
            });
            out.extend(snaps.into_iter().filter_map(|(snap, epoch)| {
                let size = self.pool.view_size(v.id, View::Snapshot(epoch))?;
                let description = format!("tarn snapshot of {} (read-only), {size} bytes", v.name);
                Some(ExportDescription { name: format!("{}@{snap}", v.name), description })
            }));
        }
        out
    }

    fn open(&self, name: &str) -> Option<Arc<dyn Export>> {
        let (id, view) = self.pool.lookup_view(name)?;
        // Pinned now: a dirty bitmap keeps meaning "since that snapshot" even
        // if a namesake replaces it while the client is connected.
        let bitmaps = self.pool.older_snapshots(id, view);
        self.clients.add((id, view), 1);
        let trace = self.tracer.as_ref().and_then(|t| Some((t.clone(), t.export_id(name)?)));
        let clients = self.clients.clone();
        let metrics = self.metrics.as_ref().map(|m| m.export(name));
        Some(Arc::new(VolumeExport { pool: self.pool.clone(), id, view, bitmaps, clients, trace, metrics }))
    }

    fn default_export(&self) -> Option<String> {
        let vols = self.pool.list_volumes();
        match vols.as_slice() {
            [only] => Some(only.name.clone()),
            _ => vols.iter().find(|v| v.name == "disk0").map(|v| v.name.clone()),
        }
    }
}

/// A volume's head (writable) or one of its snapshots (read-only).
struct VolumeExport {
    pool: Arc<Pool>,
    id: u32,
    view: View,
    /// Older snapshots (name, epoch) offered as dirty bitmaps.
    bitmaps: Vec<(String, u64)>,
    clients: Arc<Clients>,
    /// The server's recorder and this export's id in it.
    trace: Option<(Arc<Tracer>, u32)>,
    /// This export's series when the server serves metrics.
    metrics: Option<ExportMetrics>,
}

impl Drop for VolumeExport {
    fn drop(&mut self) {
        self.clients.add((self.id, self.view), -1);
    }
}

fn nbd_error(e: EngineError) -> ExportError {
    match e {
        // A quota refusal is ENOSPC too (the NBD rule: only on holes), and
        // not logged per request: the writer may retry until space is freed.
        EngineError::NoSpace | EngineError::QuotaExceeded { .. } => ExportError::NoSpace,
        EngineError::OutOfRange { .. } | EngineError::InvalidArgument(_) => ExportError::Invalid,
        EngineError::ReadOnly => ExportError::Perm,
        EngineError::NotSupported(_) => ExportError::NotSupported,
        EngineError::Fenced => ExportError::Shutdown,
        // The volume or snapshot was deleted under a connected client: its
        // requests fail, the server goes on.
        EngineError::VolumeGone(_) | EngineError::NoSuchVolume(_) | EngineError::NoSuchSnapshot { .. } => {
            log::warn!("request on a deleted export: {e}");
            ExportError::Io
        }
        other => {
            log::error!("I/O error served to a client: {other}");
            ExportError::Io
        }
    }
}

impl VolumeExport {
    /// When a request started, if metrics time it (no clock read otherwise).
    fn started(&self) -> Option<Instant> {
        self.metrics.as_ref().map(|_| Instant::now())
    }

    /// Record an answered request when the server traces or counts.
    fn trace(
        &self,
        cmd: TraceCmd,
        flags: u8,
        offset: u64,
        length: u64,
        started: Option<Instant>,
        r: &Result<(), ExportError>,
    ) {
        if let Some((tracer, id)) = &self.trace {
            let flags = if r.is_err() { flags | trace_flags::FAILED } else { flags };
            tracer.request(*id, cmd, flags, offset, length);
        }
        if let (Some(m), Some(t)) = (&self.metrics, started) {
            m.record(cmd, length, t.elapsed(), r.is_err());
        }
    }

    fn writable(&self) -> Result<(), ExportError> {
        // The server refuses writes to read-only exports already; this keeps
        // a snapshot immutable whatever calls it.
        if self.view == View::Head {
            Ok(())
        } else {
            Err(ExportError::Perm)
        }
    }
}

impl Export for VolumeExport {
    fn size(&self) -> u64 {
        self.pool.view_size(self.id, self.view).unwrap_or(0)
    }

    fn read_only(&self) -> bool {
        self.view != View::Head
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        let t = self.started();
        let r = self.pool.read_view(self.id, self.view, offset, buf).map_err(nbd_error);
        self.trace(TraceCmd::Read, 0, offset, buf.len() as u64, t, &r);
        r
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        let t = self.started();
        let r = self.writable().and_then(|()| self.pool.write(self.id, offset, data, fua).map_err(nbd_error));
        self.trace(TraceCmd::Write, if fua { trace_flags::FUA } else { 0 }, offset, data.len() as u64, t, &r);
        r
    }

    fn flush(&self) -> Result<(), ExportError> {
        let t = self.started();
        let r = self.pool.flush().map_err(nbd_error);
        self.trace(TraceCmd::Flush, 0, 0, 0, t, &r);
        r
    }

    fn trim(&self, offset: u64, length: u64, fua: bool) -> Result<(), ExportError> {
        let t = self.started();
        let r = self.writable().and_then(|()| {
            self.pool.trim(self.id, offset, length).map_err(nbd_error)?;
            if fua {
                self.pool.flush().map_err(nbd_error)?;
            }
            Ok(())
        });
        self.trace(TraceCmd::Trim, if fua { trace_flags::FUA } else { 0 }, offset, length, t, &r);
        r
    }

    fn write_zeroes(&self, offset: u64, length: u64, no_hole: bool, fast: bool, fua: bool) -> Result<(), ExportError> {
        let t = self.started();
        let r = self.writable().and_then(|()| {
            self.pool.write_zeroes(self.id, offset, length, no_hole, fast).map_err(nbd_error)?;
            if fua {
                self.pool.flush().map_err(nbd_error)?;
            }
            Ok(())
        });
        let flags = if fua { trace_flags::FUA } else { 0 } | if no_hole { trace_flags::NO_HOLE } else { 0 };
        self.trace(TraceCmd::WriteZeroes, flags, offset, length, t, &r);
        r
    }

    fn block_status(&self, offset: u64, length: u64) -> Result<Vec<BlockStatusExtent>, ExportError> {
        let runs = self.pool.block_status_view(self.id, self.view, offset, length).map_err(nbd_error)?;
        Ok(runs.into_iter().map(|r| BlockStatusExtent { length: r.length, hole: !r.allocated, zero: r.zero }).collect())
    }

    fn meta_contexts(&self) -> Vec<String> {
        self.bitmaps.iter().map(|(name, _)| format!("{DIRTY_BITMAP}{name}")).collect()
    }

    fn context_status(&self, name: &str, offset: u64, length: u64) -> Result<Vec<ContextExtent>, ExportError> {
        let snap = name.strip_prefix(DIRTY_BITMAP).ok_or(ExportError::NotSupported)?;
        let (_, since) = self.bitmaps.iter().find(|(n, _)| n == snap).ok_or(ExportError::NotSupported)?;
        let runs = self.pool.changed_runs(self.id, self.view, *since, offset, length).map_err(|e| match e {
            // The snapshot the bitmap compares with was deleted meanwhile.
            EngineError::NoSuchSnapshot { .. } => {
                log::warn!("dirty bitmap {name:?} of a connected client is gone");
                ExportError::Io
            }
            other => nbd_error(other),
        })?;
        Ok(runs
            .into_iter()
            .map(|r| ContextExtent { length: r.length, flags: if r.changed { DIRTY } else { 0 } })
            .collect())
    }
}
