//! tarn's engine: the device seam, members, the in-memory state, free
//! space, on-disk metadata, the pool and its locks, integrity, the commit,
//! data I/O, volume administration and the service that runs a pool. See
//! docs/ARCHITECTURE.md (*Layers*): folders import only folders below them.

// Layers, lowest first: error, device, members, map, space, meta, pool,
// integrity, commit, io, volumes, service. `scripts/engine_deps.py` checks
// that every folder imports only folders below it.
pub mod commit;
pub mod device;
pub mod error;
pub mod integrity;
pub mod io;
pub mod map;
pub mod members;
pub(crate) mod meta;
pub mod pool;
pub mod service;
pub mod space;
pub mod volumes;

// Module paths of the flat layout that the CLI, sim and fuzz targets use.
pub use integrity::scrub;
pub use map::{extent_map, state, sums};

pub use commit::grow::{GrowReport, Growth};
pub use commit::room::OpsRoom;
pub use commit::spare::{DropReport, TakeReport};
pub use device::file_device::FileDevice;
pub use device::Device;
pub use error::{EngineError, Result};
pub use integrity::check::CheckReport;
pub use io::{ChangeRun, PhysicalRun, StatusRun};
pub use map::view::View;
pub use members::mirror::{LegStatus, MirrorDevice};
pub use pool::{DeviceStatus, OpenOptions, Pool, PoolStatus, VolumeInfo, DEFAULT_METADATA_CACHE};
pub use service::grow::AddReport;
pub use service::open::{create_mirrored_pool, create_pool, CreateOptions};
pub use service::rebuild::RebuildReport;
pub use service::replace::CopyReport;
pub use service::resilver::ReplaceReport;
pub use service::{Service, ServiceOptions};
pub use space::expansion::Expansion;
pub use space::placement::PlacementKind;
pub use space::AllocationStart;
pub use tarn_format::superblock::FORMAT_VERSION;
pub use tarn_store::cache::MIN_CACHE_BYTES as MIN_METADATA_CACHE;
pub use volumes::files::FileVolumeInfo;
pub use volumes::hints::{blocks_covering, HintReport, HintTarget};
pub use volumes::layout::{DeviceLayout, HeldRun, Holder};
pub use volumes::members_snap::{MemberSnapshot, ObjectSnapshots};
pub use volumes::object_layout::ObjectLayout;
pub use volumes::parity::{ParityReport, DEFAULT_PARITY_UNIT};
pub use volumes::reclaim::ReclaimCount;
pub use volumes::snapshot::SnapshotInfo;
pub use volumes::stripe::DEFAULT_STRIPE_UNIT;
pub use volumes::VolumeOptions;

/// Decode a checkpoint payload into the pool state and its commit sequence,
/// with every check [`Pool::open`] makes after reading and checksumming the
/// segments. Public only for the fuzz targets in `fuzz/`.
#[doc(hidden)]
pub fn decode_checkpoint_state(payload: &[u8]) -> std::result::Result<(state::State, u64), String> {
    let store = std::sync::Arc::new(tarn_store::Store::memory());
    meta::checkpoint::decode_state(payload, store).map_err(|e| e.to_string())
}
