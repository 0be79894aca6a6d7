//! tarn pool devices on Ceph RADOS (`rados://CEPHPOOL/PREFIX`), and the
//! exclusive lease that keeps one writer on them at a time.

pub mod cluster;
mod combine;
pub mod device;
pub mod error;
mod ffi;
pub mod layout;
pub mod lease;
pub mod uri;

pub use cluster::CephConfig;
pub use device::RadosDevice;
pub use error::RadosError;
pub use lease::{Lease, LeaseOptions};
pub use uri::{is_rados_uri, RadosUri};
