//! What a volume is for, as recorded on disk: the `role` byte of op 16
//! (VolRole) and of a catalog volume entry with the ROLE flag
//! (docs/FORMAT.md *File volumes*). A volume without a role is a block
//! volume. File volumes and their objects are hidden from the block
//! volume commands (list, snapshot, export): only tarn-fs reaches them.

/// The role of a volume that is not a plain block volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VolumeRole {
    /// A file volume: its own map holds the inode table (`tarn fs create`).
    FileVolume,
    /// A file's, directory's or long symlink's data object, owned by the
    /// file volume of that id.
    Object { owner: u32 },
}

/// Role byte of a file volume (owner 0).
pub const ROLE_FILE_VOLUME: u8 = 1;
/// Role byte of an object (owner = the file volume's id, ≥ 1).
pub const ROLE_OBJECT: u8 = 2;

impl VolumeRole {
    /// The `role u8`, `owner u32` pair it is written as.
    pub fn to_parts(self) -> (u8, u32) {
        match self {
            VolumeRole::FileVolume => (ROLE_FILE_VOLUME, 0),
            VolumeRole::Object { owner } => (ROLE_OBJECT, owner),
        }
    }

    /// The role a `(role, owner)` pair names; None for any other pair
    /// (an unknown byte, a file volume with an owner, an object without).
    pub fn from_parts(role: u8, owner: u32) -> Option<VolumeRole> {
        match (role, owner) {
            (ROLE_FILE_VOLUME, 0) => Some(VolumeRole::FileVolume),
            (ROLE_OBJECT, o) if o != 0 => Some(VolumeRole::Object { owner: o }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_round_trip_and_bad_pairs_are_refused() {
        for r in [VolumeRole::FileVolume, VolumeRole::Object { owner: 7 }] {
            let (b, o) = r.to_parts();
            assert_eq!(VolumeRole::from_parts(b, o), Some(r));
        }
        assert_eq!(VolumeRole::from_parts(1, 3), None);
        assert_eq!(VolumeRole::from_parts(2, 0), None);
        assert_eq!(VolumeRole::from_parts(0, 0), None);
        assert_eq!(VolumeRole::from_parts(3, 1), None);
    }
}
