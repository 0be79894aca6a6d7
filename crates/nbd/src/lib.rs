//! NBD protocol and server for tarn; knows nothing of maps.
//!
//! The engine implements [`Export`] (one block device) and [`Backend`] (the
//! set of exports); [`Server`] serves them over TCP and Unix sockets with the
//! fixed-newstyle handshake, structured replies (holes sent as
//! `OFFSET_HOLE`), extended headers (64-bit lengths), block status, and many
//! requests in flight per connection.
//!
//! Block status covers `base:allocation` ([`Export::block_status`]) and any
//! further metadata contexts an export offers ([`Export::meta_contexts`],
//! [`Export::context_status`]), such as qemu's changed-block tracking
//! convention `qemu:dirty-bitmap:NAME` (flag [`protocol::NBD_STATE_DIRTY`]),
//! which qemu-img (`x-dirty-bitmap`), nbdinfo `--map=CONTEXT` and libnbd
//! read as they are. A request gets one chunk per negotiated context.
//!
//! ```no_run
//! use std::sync::Arc;
//! use tarn_nbd::{memory::{MemoryBackend, MemoryExport}, Server, ServerConfig};
//! let backend = MemoryBackend::new().with_export("mem", "", Arc::new(MemoryExport::new(64 << 20)));
//! let server = Server::new(Arc::new(backend), ServerConfig::default());
//! let addr = server.listen_tcp("127.0.0.1:10809").unwrap();
//! # let _ = addr;
//! server.shutdown();
//! ```
//!
//! Modules: [`protocol`] (constants and pure encoders/decoders), `session`
//! (config and negotiated state shared by the layers above), `handshake`
//! (option haggling), `meta` (metadata context names, queries and IDs),
//! `request` (request validation), `read` (read replies, holes as
//! OFFSET_HOLE), `status` (block status descriptors),
//! `congestion` (TCP congestion control of connections from this host),
//! `connection` (transmission phase: reader, workers),
//! `writer` (combining reply writer), `transport` (plain socket or TLS
//! session), [`tls`] (certificates, modes, allow-list),
//! [`server`] (listeners and shutdown),
//! [`export`] (traits), [`error`], [`memory`] (in-memory export for tests).

pub mod error;
pub mod export;
pub mod memory;
pub mod protocol;
pub mod server;
pub mod tls;

mod congestion;
mod connection;
mod handshake;
mod meta;
mod read;
mod request;
mod session;
mod status;
mod stream;
mod transport;
mod util;
mod writer;

pub use error::{ExportError, NbdError, ProtocolError};
pub use export::{Backend, BlockStatusExtent, ContextExtent, Export, ExportDescription};
pub use server::{Server, ServerConfig, MAX_ADOPTED};
pub use tls::{AllowList, ClientIdentity, TlsConfig, TlsError, TlsMode};
