//! Simulation (in progress).
