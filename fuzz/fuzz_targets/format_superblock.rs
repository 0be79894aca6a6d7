//! `Superblock::decode` on arbitrary bytes. First byte: bit 0 reseals the
//! checksum (so the fields behind it are reached), bit 1 reads it as copy 1
//! (block 16) instead of copy 0. A decoded superblock must encode, and
//! decode again to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tarn_format::superblock::{Superblock, SUPERBLOCK_COPIES};
use tarn_fuzz::reseal;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut buf = rest.to_vec();
    if flags & 1 != 0 {
        reseal::superblock(&mut buf);
    }
    let copy = SUPERBLOCK_COPIES[usize::from(flags >> 1 & 1)];
    if let Ok(sb) = Superblock::decode(&buf, copy) {
        let again = sb.encode(copy);
        assert_eq!(Superblock::decode(&again, copy), Ok(sb));
    }
});
