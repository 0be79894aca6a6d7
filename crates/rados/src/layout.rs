//! How a device byte range maps onto fixed-size RADOS objects: pure
//! arithmetic, unit-tested apart from any cluster.

/// One object's share of a device range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Object index (its name is `PREFIX.%016x` of it).
    pub object: u64,
    /// Byte offset inside the object.
    pub offset: u64,
    /// Byte offset inside the caller's buffer.
    pub buf_offset: usize,
    pub len: usize,
}

/// Split `len` bytes at device `offset` into per-object pieces, in order.
/// `object_size` must be non-zero (the header decoder guarantees it).
pub fn split(offset: u64, len: usize, object_size: u64) -> Vec<Piece> {
    let mut pieces = Vec::with_capacity(len / object_size.max(1) as usize + 2);
    let mut done = 0usize;
    // Bounded: every turn consumes at least one byte of `len`.
    while done < len {
        let pos = offset + done as u64;
        let object = pos / object_size;
        let inside = pos % object_size;
        let room = (object_size - inside).min((len - done) as u64) as usize;
        pieces.push(Piece { object, offset: inside, buf_offset: done, len: room });
        done += room;
    }
    pieces
}

/// What a discard of `[offset, offset+len)` does: whole objects to remove
/// and partial ranges to zero, as (object, offset inside, length).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DiscardPlan {
    pub remove: Vec<u64>,
    pub zero: Vec<(u64, u64, u64)>,
}

pub fn plan_discard(offset: u64, len: u64, object_size: u64) -> DiscardPlan {
    let mut plan = DiscardPlan::default();
    let end = offset.saturating_add(len);
    let mut pos = offset;
    // Bounded: every turn advances `pos` by at least one byte toward `end`.
    while pos < end {
        let object = pos / object_size;
        let inside = pos % object_size;
        let stop = ((object + 1) * object_size).min(end);
        if inside == 0 && stop - pos == object_size {
            plan.remove.push(object);
        } else {
            plan.zero.push((object, inside, stop - pos));
        }
        pos = stop;
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    const MIB4: u64 = 4 << 20;

    #[test]
    fn inside_one_object() {
        assert_eq!(split(4096, 8192, MIB4), vec![Piece { object: 0, offset: 4096, buf_offset: 0, len: 8192 }]);
        let last = MIB4 - 4096;
        assert_eq!(split(MIB4 + last, 4096, MIB4), vec![Piece { object: 1, offset: last, buf_offset: 0, len: 4096 }]);
    }

    #[test]
    fn straddling_and_spanning() {
        let p = split(MIB4 - 4096, 8192, MIB4);
        assert_eq!(
            p,
            vec![
                Piece { object: 0, offset: MIB4 - 4096, buf_offset: 0, len: 4096 },
                Piece { object: 1, offset: 0, buf_offset: 4096, len: 4096 },
            ]
        );
        let p = split(MIB4 - 1, (2 * MIB4 + 2) as usize, MIB4);
        assert_eq!(p.len(), 4);
        assert_eq!(p.iter().map(|x| x.len).sum::<usize>(), (2 * MIB4 + 2) as usize);
        assert_eq!((p[1].object, p[1].offset, p[1].len), (1, 0, MIB4 as usize));
        assert_eq!((p[3].object, p[3].offset, p[3].len, p[3].buf_offset), (3, 0, 1, (2 * MIB4 + 1) as usize));
        assert!(split(123, 0, MIB4).is_empty());
    }

    #[test]
    fn discard_plans() {
        assert_eq!(plan_discard(0, MIB4, MIB4), DiscardPlan { remove: vec![0], zero: vec![] });
        let p = plan_discard(4096, 2 * MIB4, MIB4);
        assert_eq!(p.remove, vec![1]);
        assert_eq!(p.zero, vec![(0, 4096, MIB4 - 4096), (2, 0, 4096)]);
        assert_eq!(plan_discard(8192, 4096, MIB4).zero, vec![(0, 8192, 4096)]);
        assert_eq!(plan_discard(5, 0, MIB4), DiscardPlan::default());
    }

    /// The superblock copies (blocks 0 and 16) never straddle two objects,
    /// whatever the object size tarn accepts (2^12..2^26).
    #[test]
    fn superblocks_stay_in_one_object() {
        for order in 12..=26 {
            for block in [0u64, 16] {
                assert_eq!(split(block * 4096, 4096, 1 << order).len(), 1);
            }
        }
    }
}
