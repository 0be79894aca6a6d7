//! The metadata store's nodes on the pool's devices: a node address
//! (`Pba`) names a device of the pool and a 4 KiB block on it. A mirrored
//! device's legs are the node's copies, so the store can read around a
//! damaged leg and rewrite it (tarn_store's `load_clean`).

use crate::device::members::Members;
use crate::device::Device;
use std::io;
use std::sync::Arc;
use tarn_format::node::NODE_SIZE;
use tarn_format::Pba;
use tarn_store::NodeIo;

/// [`NodeIo`] over the pool's devices, indexed by `Pba::device()`.
pub struct DeviceNodeIo {
    /// Shared with the pool: a member added online is seen at once.
    devices: Arc<Members>,
}

impl DeviceNodeIo {
    pub fn new(devices: Arc<Members>) -> DeviceNodeIo {
        DeviceNodeIo { devices }
    }

    /// The device holding `pba` and the node's byte offset on it, checked
    /// before any I/O: an address from disk that is out of range is an
    /// error, never a panic, a write past the end, or a mirror leg faulted
    /// for a read it should not have been asked.
    fn locate(&self, pba: Pba, len: usize) -> io::Result<(&dyn Device, u64)> {
        self.locate_run(pba, len, 1)
    }

    /// `locate` for a run of up to `max_nodes` consecutive nodes.
    fn locate_run(&self, pba: Pba, len: usize, max_nodes: usize) -> io::Result<(&dyn Device, u64)> {
        if len == 0 || !len.is_multiple_of(NODE_SIZE) || len / NODE_SIZE > max_nodes {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{len}-byte buffer for store node {pba}")));
        }
        let dev = self.devices.get(usize::from(pba.device())).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("store node {pba} on unknown device {}", pba.device()))
        })?;
        let offset = pba.byte_offset();
        if offset.checked_add(len as u64).is_none_or(|end| end > dev.size()) {
            let msg = format!("store node {pba} beyond the end of {} ({} bytes)", dev.name(), dev.size());
            return Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
        }
        Ok((dev.as_ref(), offset))
    }
}

impl NodeIo for DeviceNodeIo {
    /// Copy 0 exactly (not a mirror's first healthy leg): the store knows
    /// which copy it read, so it knows which one to heal.
    fn read_node(&self, pba: Pba, buf: &mut [u8]) -> io::Result<()> {
        self.read_node_copy(pba, 0, buf)
    }

    /// Every leg (the device's own fan-out).
    fn write_node(&self, pba: Pba, data: &[u8]) -> io::Result<()> {
        let (dev, offset) = self.locate(pba, data.len())?;
        dev.write_at(data, offset)
    }

    /// Every device's `flush` (what a checkpoint does at its end anyway).
    fn sync(&self) -> io::Result<()> {
        self.devices.iter().try_for_each(|dev| dev.flush())
    }

    /// One device write for the whole run (`locate_run` checks it all).
    fn write_nodes(&self, first: Pba, data: &[u8]) -> io::Result<()> {
        let (dev, offset) = self.locate_run(first, data.len(), usize::MAX)?;
        dev.write_at(data, offset)
    }

    fn device_name(&self, pba: Pba) -> String {
        match self.devices.get(usize::from(pba.device())) {
            Some(dev) => dev.name(),
            None => format!("unknown device {}", pba.device()),
        }
    }

    /// 1 for an unknown device: the store then reads copy 0 and reports
    /// that read's error.
    fn copies(&self, pba: Pba) -> usize {
        self.devices.get(usize::from(pba.device())).map_or(1, |dev| dev.copies())
    }

    fn read_node_copy(&self, pba: Pba, copy: usize, buf: &mut [u8]) -> io::Result<()> {
        let (dev, offset) = self.locate(pba, buf.len())?;
        dev.read_copy(copy, buf, offset)
    }

    fn write_node_copy(&self, pba: Pba, copy: usize, data: &[u8]) -> io::Result<()> {
        let (dev, offset) = self.locate(pba, data.len())?;
        dev.write_copy(copy, data, offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::mem_device::MemDevice;
    use tarn_format::node::RangeValue;
    use tarn_store::cache::MIN_CACHE_BYTES;
    use tarn_store::{NodeAlloc, Store, Tree, Written};

    const SIZE: usize = 64 * NODE_SIZE;

    /// `copies` legs of memory (a mirror's copies).
    fn mem(copies: usize) -> Arc<MemDevice> {
        Arc::new(MemDevice::new(&format!("mem x{copies}"), SIZE as u64, copies))
    }

    fn node_io(a: &Arc<MemDevice>, b: &Arc<MemDevice>) -> DeviceNodeIo {
        DeviceNodeIo::new(Arc::new(crate::device::members::Members::new(vec![
            a.clone() as Arc<dyn Device>,
            b.clone() as Arc<dyn Device>,
        ])))
    }

    #[test]
    fn a_node_is_the_block_its_address_names() {
        let (a, b) = (mem(1), mem(2));
        let io = node_io(&a, &b);
        let pba = Pba::new(1, 5);
        io.write_node(pba, &[7; NODE_SIZE]).unwrap();
        assert_eq!(b.block(0, 5), vec![7; NODE_SIZE]);
        assert_eq!(b.block(1, 5), vec![7; NODE_SIZE], "every copy written");
        assert_eq!(a.block(0, 5), vec![0; NODE_SIZE], "the other device untouched");
        let mut buf = vec![0; NODE_SIZE];
        io.read_node(pba, &mut buf).unwrap();
        assert_eq!(buf, vec![7; NODE_SIZE]);
        assert_eq!((io.copies(Pba::new(0, 5)), io.copies(pba)), (1, 2));
        assert_eq!(io.device_name(pba), "mem x2");
    }

    #[test]
    fn copies_are_the_device_copies() {
        let (a, b) = (mem(1), mem(2));
        let io = node_io(&a, &b);
        let pba = Pba::new(1, 3);
        io.write_node(pba, &[1; NODE_SIZE]).unwrap();
        io.write_node_copy(pba, 1, &[2; NODE_SIZE]).unwrap();
        let mut buf = vec![0; NODE_SIZE];
        io.read_node(pba, &mut buf).unwrap();
        assert_eq!(buf, vec![1; NODE_SIZE], "read_node is copy 0");
        io.read_node_copy(pba, 1, &mut buf).unwrap();
        assert_eq!(buf, vec![2; NODE_SIZE]);
        assert!(io.read_node_copy(pba, 2, &mut buf).is_err());
        assert!(io.write_node_copy(Pba::new(0, 3), 1, &buf).is_err(), "an unmirrored device has one copy");
    }

    /// Bug guarded: a run of nodes was refused as "not a node-sized
    /// buffer" and every checkpoint silently fell back to one write per node.
    #[test]
    fn a_run_of_nodes_is_one_write_checked_whole() {
        let (a, b) = (mem(1), mem(2));
        let io = node_io(&a, &b);
        let run: Vec<u8> = (0..3u8).flat_map(|i| [i + 1; NODE_SIZE]).collect();
        io.write_nodes(Pba::new(1, 10), &run).unwrap();
        for i in 0..3u8 {
            assert_eq!(b.block(1, 10 + u64::from(i)), vec![i + 1; NODE_SIZE], "node {i} of the run, every copy");
        }
        let last = SIZE as u64 / NODE_SIZE as u64;
        assert!(io.write_nodes(Pba::new(0, last - 2), &run).is_err(), "a run past the end");
        assert!(io.write_nodes(Pba::new(0, 0), &run[..NODE_SIZE + 1]).is_err(), "not whole nodes");
        assert!(io.write_node(Pba::new(0, 0), &run).is_err(), "write_node takes one node");
    }

    #[test]
    fn bad_addresses_are_errors() {
        let (a, b) = (mem(1), mem(2));
        let io = node_io(&a, &b);
        let mut buf = vec![0; NODE_SIZE];
        let unknown = Pba::new(2, 0);
        assert_eq!(io.read_node(unknown, &mut buf).unwrap_err().kind(), io::ErrorKind::NotFound);
        assert!(io.write_node(unknown, &buf).is_err());
        assert!(io.write_node_copy(unknown, 0, &buf).is_err());
        assert_eq!((io.copies(unknown), io.device_name(unknown)), (1, "unknown device 2".to_string()));
        let past_end = Pba::new(0, SIZE as u64 / NODE_SIZE as u64);
        assert!(io.read_node(past_end, &mut buf).is_err());
        assert!(io.write_node(past_end, &buf).is_err());
        assert!(io.read_node(Pba::new(0, (1 << 48) - 1), &mut buf).is_err(), "the largest block number");
        assert!(io.read_node(Pba::new(0, 1), &mut buf[..100]).is_err(), "not a node-sized buffer");
    }

    struct Blocks(u64);

    impl NodeAlloc for Blocks {
        fn alloc_node(&mut self) -> Option<Pba> {
            self.0 += 1;
            Some(Pba::new(1, self.0))
        }
    }

    /// The store over a two-copy device: a damaged copy 0 is read around
    /// and rewritten on the device.
    #[test]
    fn the_store_heals_a_damaged_copy_on_the_device() {
        let (a, b) = (mem(1), mem(2));
        let io: Arc<dyn NodeIo> = Arc::new(node_io(&a, &b));
        let store = Store::new(io.clone(), MIN_CACHE_BYTES).unwrap();
        let mut tree: Tree<RangeValue> = Tree::new(3);
        for k in 0..2000 {
            tree.insert(&store, k * 2, RangeValue { len: 1 }, &mut Vec::new()).unwrap();
        }
        let root = tree.freeze().write(&store, &mut Blocks(0), 1, &mut Written::default()).unwrap();
        b.bytes(0).unwrap()[root.pba.byte_offset() as usize + 100] ^= 1;
        let cold = Store::new(io, MIN_CACHE_BYTES).unwrap();
        let tree: Tree<RangeValue> = Tree::open(3, root).unwrap();
        assert_eq!(tree.get_le(&cold, 1001).unwrap(), Some((1000, RangeValue { len: 1 })));
        assert_eq!(cold.healed_nodes(), 1);
        assert_eq!(b.block(0, root.pba.block()), b.block(1, root.pba.block()), "copy 0 rewritten");
    }
}
