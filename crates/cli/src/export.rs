//! The bridge from NBD to the engine: each volume is an export. Engine
//! errors become NBD errors here and only here.

use std::sync::Arc;
use tarn_engine::{EngineError, Pool};
use tarn_nbd::{Backend, BlockStatusExtent, Export, ExportDescription, ExportError};

pub struct PoolBackend {
    pool: Arc<Pool>,
}

impl PoolBackend {
    pub fn new(pool: Arc<Pool>) -> Self {
        PoolBackend { pool }
    }
}

impl Backend for PoolBackend {
    fn list(&self) -> Vec<ExportDescription> {
        self.pool
            .list_volumes()
            .into_iter()
            .map(|v| ExportDescription { description: format!("tarn thin volume, {} bytes", v.size), name: v.name })
            .collect()
    }

    fn open(&self, name: &str) -> Option<Arc<dyn Export>> {
        let id = self.pool.volume_id(name)?;
        Some(Arc::new(VolumeExport { pool: self.pool.clone(), id }))
    }

    fn default_export(&self) -> Option<String> {
        let vols = self.pool.list_volumes();
        match vols.as_slice() {
            [only] => Some(only.name.clone()),
            _ => vols.iter().find(|v| v.name == "disk0").map(|v| v.name.clone()),
        }
    }
}

struct VolumeExport {
    pool: Arc<Pool>,
    id: u32,
}

fn nbd_error(e: EngineError) -> ExportError {
    match e {
        EngineError::NoSpace => ExportError::NoSpace,
        EngineError::OutOfRange { .. } | EngineError::InvalidArgument(_) => ExportError::Invalid,
        EngineError::ReadOnly => ExportError::Perm,
        EngineError::NotSupported(_) => ExportError::NotSupported,
        EngineError::Fenced => ExportError::Shutdown,
        other => {
            log::error!("I/O error served to a client: {other}");
            ExportError::Io
        }
    }
}

impl Export for VolumeExport {
    fn size(&self) -> u64 {
        self.pool.volume_info(self.id).map(|v| v.size).unwrap_or(0)
    }

    fn read_only(&self) -> bool {
        false
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.pool.read(self.id, offset, buf).map_err(nbd_error)
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        self.pool.write(self.id, offset, data, fua).map_err(nbd_error)
    }

    fn flush(&self) -> Result<(), ExportError> {
        self.pool.flush().map_err(nbd_error)
    }

    fn trim(&self, offset: u64, length: u64, fua: bool) -> Result<(), ExportError> {
        self.pool.trim(self.id, offset, length).map_err(nbd_error)?;
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, length: u64, no_hole: bool, fast: bool, fua: bool) -> Result<(), ExportError> {
        self.pool.write_zeroes(self.id, offset, length, no_hole, fast).map_err(nbd_error)?;
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    fn block_status(&self, offset: u64, length: u64) -> Result<Vec<BlockStatusExtent>, ExportError> {
        let runs = self.pool.block_status(self.id, offset, length).map_err(nbd_error)?;
        Ok(runs
            .into_iter()
            .map(|r| BlockStatusExtent { length: r.length, hole: !r.allocated, zero: !r.allocated })
            .collect())
    }
}
