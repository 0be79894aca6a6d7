//! `tarn serve` and what it runs: the configuration, logging, the control
//! socket, the NBD export bridge, metrics, TLS and socket handover.

pub mod alerts;
pub mod config;
pub mod control;
pub mod export;
pub mod fsmount;
pub mod handover;
pub mod logging;
pub mod metrics;
pub mod serve;
pub mod tls;
