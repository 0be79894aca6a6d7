//! Types shared by the handshake, the transmission phase and the server:
//! the server's tunables and what a handshake negotiated. Lower than all
//! three, so that they import it and never each other in a loop
//! (server -> handshake, connection -> session).

use std::sync::Arc;

use crate::export::Export;
use crate::meta::MetaContext;
use crate::tls::TlsConfig;

/// Read buffer of the request reader (handshake and transmission).
pub(crate) const READ_BUF: usize = 256 * 1024;

/// Tunables of a [`crate::Server`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Requests queued or being processed per connection before the server
    /// stops reading from that connection (default 64).
    pub max_in_flight_per_conn: usize,
    /// Worker threads per connection, spawned on demand (default 8).
    /// Requests the export answers quickly run on the connection's reading
    /// thread instead (see `CostModel` in `connection.rs`); 0 runs every
    /// request there.
    pub workers_per_conn: usize,
    /// Largest READ/WRITE payload accepted and advertised (default 32 MiB).
    pub max_request_bytes: u32,
    /// Concurrent connections; further ones are closed at once (default 256).
    pub max_connections: usize,
    /// NBD_OPT_STARTTLS: None (default) answers it with ERR_POLICY.
    pub tls: Option<TlsConfig>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_in_flight_per_conn: 64,
            workers_per_conn: 8,
            max_request_bytes: 32 * 1024 * 1024,
            max_connections: 256,
            tls: None,
        }
    }
}

/// Result of a successful handshake.
pub(crate) struct Negotiated {
    pub export: Arc<dyn Export>,
    pub name: String,
    pub size: u64,
    pub transmission_flags: u16,
    /// Structured replies: NBD_OPT_STRUCTURED_REPLY, or implied by
    /// extended headers.
    pub structured: bool,
    /// NBD_OPT_EXTENDED_HEADERS: 32-byte requests and extended replies.
    pub extended: bool,
    /// Metadata contexts selected for this export, in selection order.
    pub meta_contexts: Vec<MetaContext>,
    pub min_block: u32,
    pub max_payload: u32,
}
