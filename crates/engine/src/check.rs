//! The pool checker: every metadata invariant, verified against the live
//! state (with I/O quiesced) or a read-only open. Checksums of every
//! structure were verified when the pool was opened; this walks the rest.

use crate::pool::Pool;
use crate::space::DeviceSpace;
use tarn_format::{Pba, BLOCK_SIZE};

#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    /// Violated invariants: a clean pool has none.
    pub problems: Vec<String>,
    /// Things worth knowing that are not damage (an old superblock copy
    /// torn by a crash, say).
    pub notes: Vec<String>,
    pub volumes: usize,
    pub extents: usize,
    pub mapped_blocks: u64,
    pub free_blocks: u64,
    pub metadata_blocks: u64,
}

impl CheckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Who holds a physical range (for overlap messages).
#[derive(Debug, Clone)]
struct Owner {
    start: u64,
    len: u64,
    what: String,
}

/// At most this many problems are listed (the count is still exact).
const MAX_LISTED: usize = 100;

impl Pool {
    pub fn check(&self) -> CheckReport {
        // Lock order everywhere: commit, then I/O gate, then pool state (the
        // committer holds the commit lock while it drains the gate).
        let ctl = self.lock_commit();
        let _quiet = self.io_gate.write().unwrap_or_else(|p| p.into_inner());
        let inner = self.read_inner();
        let mut r = CheckReport { notes: ctl.notes.clone(), volumes: inner.state.volumes.len(), ..Default::default() };
        let mut owners: Vec<Vec<Owner>> = vec![Vec::new(); self.devices.len()];
        for v in inner.state.volumes.values() {
            let mut sum = 0;
            let mut prev_end = 0;
            for (lba, e) in v.map.iter() {
                r.extents += 1;
                sum += e.len;
                if e.len == 0 || lba < prev_end || lba + e.len > v.blocks() {
                    problem(
                        &mut r,
                        format!("volume {}: extent {lba}+{} overlaps or exceeds {} blocks", v.name, e.len, v.blocks()),
                    );
                }
                if e.birth > inner.state.epoch || e.birth == 0 {
                    problem(
                        &mut r,
                        format!(
                            "volume {}: extent at {lba} born in epoch {} (current {})",
                            v.name, e.birth, inner.state.epoch
                        ),
                    );
                }
                prev_end = lba + e.len;
                push_owner(&mut owners, e.pba, e.len, format!("volume {} block {lba}", v.name), &mut r.problems);
            }
            if sum != v.map.mapped_blocks() {
                problem(
                    &mut r,
                    format!("volume {}: allocated counter {} != {} blocks mapped", v.name, v.map.mapped_blocks(), sum),
                );
            }
            r.mapped_blocks += sum;
        }
        for &(pba, len) in &ctl.checkpoint_pieces {
            r.metadata_blocks += len;
            push_owner(&mut owners, pba, len, "checkpoint".into(), &mut r.problems);
        }
        for &(pba, len) in &inner.pending_frees {
            push_owner(&mut owners, pba, len, "space awaiting commit".into(), &mut r.problems);
        }
        for (i, ds) in inner.space.devices.iter().enumerate() {
            r.free_blocks += ds.free_blocks();
            for msg in compare_space(i, ds, &mut owners[i]) {
                problem(&mut r, msg);
            }
        }
        if ctl.journal.used > ctl.journal.blocks {
            problem(&mut r, format!("journal uses {} of {} blocks", ctl.journal.used, ctl.journal.blocks));
        }
        let data = inner.space.data_blocks();
        let pending: u64 = inner.pending_frees.iter().map(|f| f.1).sum();
        if r.mapped_blocks + r.metadata_blocks + pending + r.free_blocks != data {
            let msg = format!(
                "space accounting: mapped {} + checkpoint {} + pending {} + free {} != {} data blocks",
                r.mapped_blocks, r.metadata_blocks, pending, r.free_blocks, data
            );
            problem(&mut r, msg);
        }
        r
    }
}

fn problem(r: &mut CheckReport, msg: String) {
    if r.problems.len() < MAX_LISTED {
        r.problems.push(msg);
    }
}

fn push_owner(owners: &mut [Vec<Owner>], pba: Pba, len: u64, what: String, problems: &mut Vec<String>) {
    match owners.get_mut(usize::from(pba.device())) {
        Some(list) => list.push(Owner { start: pba.block(), len, what }),
        None => problems.push(format!("{what}: physical {pba} on a device the pool does not have")),
    }
}

/// Used ranges must not overlap each other, must lie in the data area, and
/// the free ranges must be exactly what is left.
fn compare_space(device: usize, ds: &DeviceSpace, owners: &mut [Owner]) -> Vec<String> {
    let mut out = Vec::new();
    owners.sort_by_key(|o| o.start);
    let mut expected_free = Vec::new();
    let mut pos = ds.data_start;
    let mut last: Option<&Owner> = None;
    for o in owners.iter() {
        if o.start < ds.data_start || o.start + o.len > ds.data_end {
            out.push(format!("device {device}: {} at block {}+{} lies outside the data area", o.what, o.start, o.len));
        }
        if o.start < pos {
            let other = last.map(|l| l.what.as_str()).unwrap_or("the label area");
            out.push(format!("device {device}: {} at block {} shares space with {other}", o.what, o.start));
        } else if o.start > pos {
            expected_free.push((pos, o.start - pos));
        }
        if o.start + o.len > pos {
            pos = o.start + o.len;
            last = Some(o);
        }
    }
    if pos < ds.data_end {
        expected_free.push((pos, ds.data_end - pos));
    }
    let actual: Vec<(u64, u64)> = ds.free_ranges().collect();
    if out.is_empty() && actual != expected_free {
        let first = actual.iter().zip(&expected_free).find(|(a, b)| a != b);
        out.push(format!(
            "device {device}: free space disagrees with the map ({} free ranges, {} expected; first difference {:?}; {} bytes per block)",
            actual.len(),
            expected_free.len(),
            first,
            BLOCK_SIZE
        ));
    }
    let counted: u64 = actual.iter().map(|r| r.1).sum();
    if counted != ds.free_blocks() {
        out.push(format!("device {device}: free counter {} != {} blocks in free ranges", ds.free_blocks(), counted));
    }
    out
}
