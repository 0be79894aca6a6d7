//! tarn's engine: the device seam, free space, volume maps, the commit
//! protocol, the pool API and the checker. See docs/ARCHITECTURE.md.

mod assemble;
pub mod check;
mod checkpoint;
pub mod commit;
pub mod device;
pub mod error;
pub mod extent_map;
pub mod file_device;
mod flatten;
pub mod io;
mod journal;
mod label;
pub mod mirror;
pub mod open;
pub mod placement;
pub mod pool;
pub mod resilver;
pub mod resync;
pub mod scrub;
pub mod snapshot;
pub mod space;
pub mod state;
pub mod sums;
mod superblock;
pub mod verify;
pub mod view;
mod volumes;

pub use check::CheckReport;
pub use device::Device;
pub use error::{EngineError, Result};
pub use file_device::FileDevice;
pub use io::{ChangeRun, StatusRun};
pub use mirror::{LegStatus, MirrorDevice};
pub use open::{create_mirrored_pool, create_pool, CreateOptions};
pub use pool::{DeviceStatus, OpenOptions, Pool, PoolStatus, VolumeInfo};
pub use resilver::ReplaceReport;
pub use snapshot::SnapshotInfo;
pub use view::View;

/// Decode a checkpoint payload into the pool state and its commit sequence,
/// with every check [`Pool::open`] makes after reading and checksumming the
/// segments. Public only for the fuzz targets in `fuzz/`.
#[doc(hidden)]
pub fn decode_checkpoint_state(payload: &[u8]) -> std::result::Result<(state::State, u64), String> {
    checkpoint::decode_state(payload)
}
