//! The expansion policy (`tarn serve --expand-at --expand-step
//! --expand-max --expand-device`): when to grow which member and by how
//! much. The growing itself is the commit protocol's (`commit/grow.rs`).

/// Free blocks (1 MiB) a write that found the pool full takes as room
/// again, rather than growing it once more.
pub(crate) const ROOM_BLOCKS: u64 = 256;

/// How a pool grows (`tarn serve --expand-at --expand-step --expand-max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expansion {
    /// Grow once this much of the pool's data space is in use (1..=99).
    pub at_percent: u8,
    /// Bytes added per growth.
    pub step: u64,
    /// The grown member's largest size in bytes.
    pub max: u64,
    /// The member that grows (a regular file: its length is extended).
    pub device: usize,
}

impl Expansion {
    /// The reasons a policy cannot be used, for the CLI to print.
    pub fn check(&self) -> std::result::Result<(), String> {
        if !(1..=99).contains(&self.at_percent) {
            return Err(format!("an expansion threshold of {}%: give 1 to 99", self.at_percent));
        }
        if self.step < 1 << 20 {
            return Err(format!("an expansion step of {} bytes: give at least 1 MiB", self.step));
        }
        Ok(())
    }
}
