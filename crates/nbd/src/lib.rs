//! NBD protocol and server (in progress).
