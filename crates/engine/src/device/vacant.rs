//! The device of a removed slot (`tarn dev remove`) or of a missing spare
//! (a missing member is `rebuild_slot.rs`): nothing is opened for it,
//! and nothing may be read or written there (its data area is empty, so
//! no block address names it). Flushes succeed: a checkpoint flushes
//! every member.

use crate::device::Device;
use std::io;
use tarn_format::superblock::LABEL_BLOCKS;
use tarn_format::BLOCK_SIZE;

/// Why a slot has no device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Absent {
    /// Taken out by `tarn dev remove`.
    Removed,
    /// A spare that could not be opened (`members/spare.rs`).
    Spare,
}

pub struct Vacant {
    pub index: usize,
    pub why: Absent,
}

impl Vacant {
    fn refuse(&self) -> io::Error {
        let why = match &self.why {
            Absent::Spare => "is a spare that is missing",
            Absent::Removed => "was removed from the pool",
        };
        io::Error::new(io::ErrorKind::NotFound, format!("member {} {why}", self.index))
    }
}

impl Device for Vacant {
    fn read_at(&self, _buf: &mut [u8], _offset: u64) -> io::Result<()> {
        Err(self.refuse())
    }
    fn write_at(&self, _data: &[u8], _offset: u64) -> io::Result<()> {
        Err(self.refuse())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn discard(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    fn size(&self) -> u64 {
        LABEL_BLOCKS * BLOCK_SIZE
    }
    fn name(&self) -> String {
        match &self.why {
            Absent::Spare => format!("(missing spare {})", self.index),
            Absent::Removed => format!("(removed member {})", self.index),
        }
    }
    fn present(&self) -> bool {
        false
    }
}
