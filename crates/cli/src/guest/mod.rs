//! What tarn does with what a volume holds: the guest's ext2/3/4 read from
//! below (reclaim, hints) and the volume as a plain image (export, import).

pub mod guestfs;
pub mod hint;
pub mod image;
pub mod reclaim;
