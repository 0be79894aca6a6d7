//! redb over a narrow backend: its pages go through `StorageBackend` to a
//! plain file with pread / pwrite / fdatasync, which stands in for a region
//! of a pool device (tarn would hand redb a byte range of its devices).

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use redb::{Builder, Database, ReadOnlyTable, ReadableDatabase, ReadableTable, StorageBackend, Table, TableDefinition};

use crate::store::{apply, key, MetaStore, Ordered, Val};
use crate::store::Extent;

const MAP: TableDefinition<u128, [u8; 20]> = TableDefinition::new("map");

/// The pool-device stand-in.
#[derive(Debug)]
pub struct DeviceRegion {
    file: File,
}

impl DeviceRegion {
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        Ok(DeviceRegion { file })
    }
}

impl StorageBackend for DeviceRegion {
    fn len(&self) -> Result<u64, io::Error> {
        Ok(self.file.metadata()?.len())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.file.read_exact_at(out, offset)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.file.set_len(len)
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        self.file.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.file.write_all_at(data, offset)
    }
}

pub struct RedbStore {
    db: Database,
    path: std::path::PathBuf,
    /// Inserts since the last commit: applied in the commit's write transaction.
    pending: Vec<(u32, u64, u32, u64, u64)>,
    reader: RefCell<Option<ReadOnlyTable<u128, [u8; 20]>>>,
}

impl RedbStore {
    pub fn open(dir: &Path, cache_bytes: usize) -> RedbStore {
        let path = dir.join("redb.dev");
        let backend = DeviceRegion::open(&path).expect("open device file");
        let db = Builder::new().set_cache_size(cache_bytes).create_with_backend(backend).expect("redb open");
        let txn = db.begin_write().unwrap();
        txn.open_table(MAP).unwrap();
        txn.commit().unwrap();
        RedbStore { db, path, pending: Vec::new(), reader: RefCell::new(None) }
    }
}

struct T<'a, 't>(&'a mut Table<'t, u128, [u8; 20]>);

impl Ordered for T<'_, '_> {
    fn pred(&mut self, k: u128) -> Option<(u128, Val)> {
        self.0.range(..=k).unwrap().next_back().map(|r| {
            let (a, b) = r.unwrap();
            (a.value(), Val::decode(&b.value()))
        })
    }
    fn succ(&mut self, k: u128) -> Option<(u128, Val)> {
        self.0.range(k..).unwrap().next().map(|r| {
            let (a, b) = r.unwrap();
            (a.value(), Val::decode(&b.value()))
        })
    }
    fn put(&mut self, k: u128, v: Val) {
        self.0.insert(k, v.encode()).unwrap();
    }
    fn del(&mut self, k: u128) {
        self.0.remove(k).unwrap();
    }
}

impl MetaStore for RedbStore {
    fn insert_extent(&mut self, vol: u32, lba: u64, len: u32, pba: u64, birth: u64) {
        self.pending.push((vol, lba, len, pba, birth));
    }

    fn lookup(&self, vol: u32, lba: u64) -> Option<crate::store::Extent> {
        let mut r = self.reader.borrow_mut();
        if r.is_none() {
            *r = Some(self.db.begin_read().unwrap().open_table(MAP).unwrap());
        }
        let t = r.as_ref().unwrap();
        let k = key(vol, lba);
        let (ek, ev) = t.range(..=k).unwrap().next_back().map(|x| {
            let (a, b) = x.unwrap();
            (a.value(), Val::decode(&b.value()))
        })?;
        let e: Extent = ev.extent(ek);
        ((ek >> 64) as u32 == vol && e.lba + e.len as u64 > lba).then_some(e)
    }

    fn commit(&mut self) {
        // durability Immediate (redb's default): on the device when commit returns
        let txn = self.db.begin_write().unwrap();
        {
            let mut table = txn.open_table(MAP).unwrap();
            let mut t = T(&mut table);
            for (vol, lba, len, pba, birth) in self.pending.drain(..) {
                apply(&mut t, vol, lba, len, pba, birth);
            }
        }
        txn.commit().unwrap();
        *self.reader.borrow_mut() = None;
    }

    fn entries(&self) -> u64 {
        use redb::ReadableTableMetadata;
        self.db.begin_read().unwrap().open_table(MAP).unwrap().len().unwrap()
    }

    fn device_bytes(&self) -> u64 {
        std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0)
    }
}
