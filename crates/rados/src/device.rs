//! A tarn pool device on RADOS: `size` bytes as objects of `object_size`
//! named `PREFIX.%016x` in one Ceph pool, described by a header object
//! `PREFIX.header` (docs/FORMAT.md, *RADOS devices*).

use crate::cluster::{CephConfig, Cluster, Ioctx, Op};
use crate::combine::{Combiner, Queued, MAX_COMBINED_WRITE};
use crate::error::RadosError;
use crate::layout::{plan_discard, split};
use crate::uri::RadosUri;
use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tarn_engine::Device;

/// Objects of 4 MiB, as RBD's default data objects.
pub const OBJECT_ORDER: u32 = 22;
const HEADER_MAGIC: &[u8; 8] = b"TARNRDOS";
const HEADER_VERSION: u32 = 1;
const HEADER_LEN: usize = 24;
/// At most this many object operations in flight per call (a bound on the
/// queue librados holds for one request).
const MAX_IN_FLIGHT: usize = 64;
/// ESHUTDOWN: what librados returns once this client is blocklisted.
const EBLOCKLISTED: i32 = libc::ESHUTDOWN;

pub struct RadosDevice {
    uri: RadosUri,
    io: Ioctx,
    /// Bytes the header records; grows (pool expansion), never shrinks.
    size: AtomicU64,
    object_size: u64,
    fenced: Arc<AtomicBool>,
    /// Small writes that arrive while the cluster is busy, sent together.
    combiner: Combiner,
}

/// The header object: magic, version, object order, size (little endian).
pub fn encode_header(object_order: u32, size: u64) -> [u8; HEADER_LEN] {
    let mut b = [0u8; HEADER_LEN];
    b[0..8].copy_from_slice(HEADER_MAGIC);
    b[8..12].copy_from_slice(&HEADER_VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&object_order.to_le_bytes());
    b[16..24].copy_from_slice(&size.to_le_bytes());
    b
}

/// (object order, size) from a header, validated.
pub fn decode_header(b: &[u8]) -> Result<(u32, u64), String> {
    if b.len() != HEADER_LEN {
        return Err(format!("{} bytes, want {HEADER_LEN}", b.len()));
    }
    if &b[0..8] != HEADER_MAGIC {
        return Err("bad magic (not a tarn RADOS device)".into());
    }
    let word = |r: std::ops::Range<usize>| b[r].iter().rev().fold(0u64, |a, &x| (a << 8) | u64::from(x));
    let (version, order, size) = (word(8..12), word(12..16), word(16..24));
    if version != u64::from(HEADER_VERSION) {
        return Err(format!("version {version}, this tarn reads {HEADER_VERSION}"));
    }
    if !(12..=26).contains(&order) {
        return Err(format!("object order {order} outside 12..=26"));
    }
    if size == 0 || size % 4096 != 0 {
        return Err(format!("size {size} is not a positive multiple of 4096"));
    }
    Ok((order as u32, size))
}

impl RadosDevice {
    /// Open the device at `uri`; with `create_size`, create it first (an
    /// existing one is an error: two pools must not share a prefix).
    pub fn open(uri: &str, cfg: &CephConfig, create_size: Option<u64>) -> Result<RadosDevice, RadosError> {
        let uri = RadosUri::parse(uri)?;
        let cluster = Cluster::connect(cfg)?;
        let io = cluster.ioctx(&uri.pool)?;
        let header = uri.header_object();
        if let Some(size) = create_size {
            let size = size / 4096 * 4096;
            if size == 0 {
                return Err(RadosError::BadHeader { uri: uri.to_string(), why: "size below 4096 bytes".into() });
            }
            match io.write_full(&header, &encode_header(OBJECT_ORDER, size), true) {
                Err(e) if e.errno() == Some(libc::EEXIST) => {
                    return Err(RadosError::Exists { uri: uri.to_string(), pool: uri.pool, prefix: uri.prefix })
                }
                r => r?,
            }
        }
        let mut b = [0u8; HEADER_LEN + 1];
        let n = io
            .read(&header, &mut b, 0)?
            .ok_or_else(|| RadosError::NoDevice { uri: uri.to_string(), object: header.clone() })?;
        let (order, size) =
            decode_header(&b[..n]).map_err(|why| RadosError::BadHeader { uri: uri.to_string(), why })?;
        Ok(RadosDevice {
            uri,
            io,
            size: AtomicU64::new(size),
            object_size: 1 << order,
            fenced: Arc::new(AtomicBool::new(false)),
            combiner: Combiner::default(),
        })
    }

    /// Remove the device: every data object, then the header (so a
    /// half-removed device is still named by its header and can be
    /// removed again). `tarn dev add` uses it to undo a device it created
    /// and the pool then refused.
    pub fn destroy(self) -> Result<(), RadosError> {
        if let Err(e) = self.discard(0, self.size()) {
            return Err(RadosError::Call {
                what: format!("remove {}", self.uri),
                errno: libc::EIO,
                errno_text: e.to_string(),
            });
        }
        self.io.remove(&self.uri.header_object())
    }

    pub fn uri(&self) -> &RadosUri {
        &self.uri
    }

    pub fn ioctx(&self) -> &Ioctx {
        &self.io
    }

    /// Set once the cluster refused us as blocklisted (another server
    /// fenced this one): every later call fails without touching RADOS.
    pub fn fenced_flag(&self) -> Arc<AtomicBool> {
        self.fenced.clone()
    }

    fn check_range(&self, offset: u64, len: usize) -> io::Result<()> {
        if self.fenced.load(Ordering::SeqCst) {
            return Err(io::Error::other(format!("{}: fenced by another tarn server; not writing", self.uri)));
        }
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.size() => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: I/O at {offset}+{len} beyond the device size {}", self.uri, self.size()),
            )),
        }
    }

    /// Send a batch of queued writes: one operation per object, holding
    /// that object's writes in queue order. One result per write.
    fn send_combined(&self, batch: &[Queued]) -> Vec<i32> {
        let mut by_object: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for (i, q) in batch.iter().enumerate() {
            by_object.entry(q.object).or_default().push(i);
        }
        let groups: Vec<(u64, Vec<usize>)> = by_object.into_iter().collect();
        let mut rcs = vec![-libc::EIO; batch.len()];
        for chunk in groups.chunks(MAX_IN_FLIGHT) {
            let mut ops = self.io.batch();
            let mut started = Vec::with_capacity(chunk.len());
            for (object, writes) in chunk {
                let op = Op::WriteMany(writes.iter().map(|&i| (&batch[i].data[..], batch[i].offset)).collect());
                match ops.start(&self.uri.data_object(*object), op) {
                    Ok(()) => started.push(writes),
                    Err(e) => log::warn!("{}: {e}", self.uri),
                }
            }
            for (writes, rc) in started.into_iter().zip(ops.wait()) {
                for &i in writes {
                    rcs[i] = rc.min(0);
                }
            }
        }
        rcs
    }

    fn result(&self, what: &str, object: u64, rc: i32) -> io::Result<()> {
        if rc == -EBLOCKLISTED {
            self.fenced.store(true, Ordering::SeqCst);
        }
        let oid = self.uri.data_object(object);
        Err(RadosError::call(format!("{what} {oid} of {}", self.uri), rc.into()).into())
    }
}

impl Device for RadosDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check_range(offset, buf.len())?;
        let pieces = split(offset, buf.len(), self.object_size);
        let mut rest: &mut [u8] = buf;
        let mut chunks = Vec::with_capacity(pieces.len());
        for p in &pieces {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(p.len);
            chunks.push(head);
            rest = tail;
        }
        for (group, bufs) in pieces.chunks(MAX_IN_FLIGHT).zip(chunks.chunks_mut(MAX_IN_FLIGHT)) {
            let mut batch = self.io.batch();
            for (p, chunk) in group.iter().zip(bufs.iter_mut()) {
                batch.start(&self.uri.data_object(p.object), Op::Read(chunk, p.offset))?;
            }
            let rcs = batch.wait();
            for ((p, rc), chunk) in group.iter().zip(rcs).zip(bufs.iter_mut()) {
                // A missing object, or the part past its end, reads as zeros
                // (never written, or discarded).
                let filled = match rc {
                    n if n >= 0 => (n as usize).min(p.len),
                    e if e == -libc::ENOENT => 0,
                    e => return self.result("read", p.object, e),
                };
                chunk[filled..].fill(0);
            }
        }
        Ok(())
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.check_range(offset, data.len())?;
        let pieces = split(offset, data.len(), self.object_size);
        if let [p] = pieces.as_slice() {
            if data.len() < MAX_COMBINED_WRITE {
                return match self.combiner.write(p.object, p.offset, data, &|b| self.send_combined(b)) {
                    rc if rc < 0 => self.result("write", p.object, rc),
                    _ => Ok(()),
                };
            }
        }
        for group in pieces.chunks(MAX_IN_FLIGHT) {
            let mut batch = self.io.batch();
            for p in group {
                let chunk = &data[p.buf_offset..p.buf_offset + p.len];
                batch.start(&self.uri.data_object(p.object), Op::Write(chunk, p.offset))?;
            }
            for (p, rc) in group.iter().zip(batch.wait()) {
                if rc < 0 {
                    return self.result("write", p.object, rc);
                }
            }
        }
        Ok(())
    }

    /// A RADOS write completes only once it is durable on every replica
    /// the pool's rule requires, and `write_at` waits for completion: so
    /// the barrier has nothing left to wait for beyond librados' own queue.
    fn flush(&self) -> io::Result<()> {
        self.check_range(0, 0)?;
        self.io.flush().map_err(io::Error::from)
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check_range(offset, usize::try_from(len).unwrap_or(usize::MAX))?;
        let plan = plan_discard(offset, len, self.object_size);
        for group in plan.remove.chunks(MAX_IN_FLIGHT) {
            let mut batch = self.io.batch();
            for &object in group {
                batch.start(&self.uri.data_object(object), Op::Remove)?;
            }
            for (&object, rc) in group.iter().zip(batch.wait()) {
                if rc < 0 && rc != -libc::ENOENT {
                    return self.result("remove", object, rc);
                }
            }
        }
        for &(object, off, n) in &plan.zero {
            self.io.zero(&self.uri.data_object(object), off, n).map_err(io::Error::from)?;
        }
        Ok(())
    }

    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    /// Growing is rewriting the header with the new size: objects are made
    /// by their first write, so the new range needs nothing else. RADOS
    /// applies a whole-object write atomically, so a crash leaves the old
    /// size or the new one; a header larger than the pool's superblock
    /// records is harmless (the pool uses what its superblock says, as
    /// with a file grown before a crash).
    fn grow(&self, size: u64) -> io::Result<()> {
        let size = size / 4096 * 4096;
        if size <= self.size() {
            return Ok(());
        }
        self.check_range(0, 0)?;
        let order = self.object_size.trailing_zeros();
        let header = encode_header(order, size);
        self.io.write_full(&self.uri.header_object(), &header, false).map_err(io::Error::from)?;
        self.size.store(size, Ordering::Release);
        Ok(())
    }

    fn name(&self) -> String {
        self.uri.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_header_bytes() {
        let b = encode_header(22, 1 << 30);
        assert_eq!(
            b,
            [b'T', b'A', b'R', b'N', b'R', b'D', b'O', b'S', 1, 0, 0, 0, 22, 0, 0, 0, 0, 0, 0, 0x40, 0, 0, 0, 0]
        );
        assert_eq!(decode_header(&b), Ok((22, 1 << 30)));
    }

    #[test]
    fn bad_headers_are_refused() {
        let good = encode_header(22, 1 << 30);
        assert!(decode_header(&good[..23]).is_err());
        let mut b = good;
        b[0] = b'X';
        assert!(decode_header(&b).is_err());
        let mut b = good;
        b[8] = 2;
        assert!(decode_header(&b).is_err());
        assert!(decode_header(&encode_header(40, 1 << 30)).is_err());
        assert!(decode_header(&encode_header(22, 4095)).is_err());
        assert!(decode_header(&encode_header(22, 0)).is_err());
    }
}
