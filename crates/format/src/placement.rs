//! A volume's placement policy as recorded on disk: the `policy` byte of
//! op 15 (VolPlacement) and of a catalog volume entry with the PLACEMENT
//! flag (docs/FORMAT.md *Placement*). What each policy does is the
//! engine's (crates/engine/src/space/placement.rs); the format only names
//! them, so a code is never reused for another policy.

/// The placement policies a volume may record. A volume without one
/// follows the pool's default (`tarn serve --placement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PolicyCode {
    /// Next-fit from a cursor; overwrites in place; a sequential write
    /// over scattered data re-laid in new space.
    Linear = 1,
    /// Next-fit for new space; every overwrite in place (no re-layout).
    Inplace = 2,
    /// Every write, new or overwrite, to the head of the log.
    Append = 3,
    /// Dense regions: a block goes at its offset in its region's home.
    Contiguous = 4,
}

impl PolicyCode {
    pub const ALL: [PolicyCode; 4] =
        [PolicyCode::Linear, PolicyCode::Inplace, PolicyCode::Append, PolicyCode::Contiguous];

    pub fn from_byte(b: u8) -> Option<PolicyCode> {
        PolicyCode::ALL.into_iter().find(|p| *p as u8 == b)
    }

    pub fn name(self) -> &'static str {
        match self {
            PolicyCode::Linear => "linear",
            PolicyCode::Inplace => "inplace",
            PolicyCode::Append => "append",
            PolicyCode::Contiguous => "contiguous",
        }
    }

    pub fn parse(name: &str) -> Option<PolicyCode> {
        PolicyCode::ALL.into_iter().find(|p| p.name() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_the_documented_bytes_and_round_trip() {
        let bytes: Vec<u8> = PolicyCode::ALL.iter().map(|p| *p as u8).collect();
        assert_eq!(bytes, [1, 2, 3, 4]);
        for p in PolicyCode::ALL {
            assert_eq!(PolicyCode::from_byte(p as u8), Some(p));
            assert_eq!(PolicyCode::parse(p.name()), Some(p));
        }
        assert_eq!(PolicyCode::from_byte(0), None);
        assert_eq!(PolicyCode::from_byte(5), None);
        assert_eq!(PolicyCode::parse("fast"), None);
    }
}
