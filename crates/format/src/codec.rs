//! Bounds-checked little-endian cursor helpers shared by every decoder.

use crate::error::{FormatError, Result};

/// Appends little-endian fields to a byte vector.
#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn with_capacity(n: usize) -> Self {
        Writer { buf: Vec::with_capacity(n) }
    }
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn bytes(&mut self, v: &[u8]) {
        self.buf.extend_from_slice(v);
    }
    /// LEB128 unsigned varint.
    pub fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }
    /// Zig-zag signed varint, for deltas that may go backwards.
    pub fn varint_signed(&mut self, v: i64) {
        self.varint(((v << 1) ^ (v >> 63)) as u64);
    }
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// A varint from bytes this process encoded itself (a leaf kept in memory,
/// validated when it was read from a device): no error path; past the end
/// it reads zeros rather than panic.
#[inline]
pub fn trusted_varint(buf: &[u8], pos: &mut usize) -> u64 {
    let mut v = 0u64;
    for i in 0..10 {
        let b = buf.get(*pos).copied().unwrap_or(0);
        *pos += 1;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            break;
        }
    }
    v
}

/// Zig-zag form of [`trusted_varint`].
#[inline]
pub fn trusted_varint_signed(buf: &[u8], pos: &mut usize) -> i64 {
    let z = trusted_varint(buf, pos);
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

/// Reads little-endian fields; every read is bounds-checked.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, pos: 0, what }
    }
    pub fn position(&self) -> usize {
        self.pos
    }
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }
    pub fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.remaining() < n {
            return Err(FormatError::Truncated { what: self.what, needed: self.pos + n, had: self.buf.len() });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    /// LEB128 unsigned varint of at most 10 bytes.
    pub fn varint(&mut self) -> Result<u64> {
        // Fast path: one byte (most deltas in a leaf).
        if let Some(&b) = self.buf.get(self.pos) {
            if b < 0x80 {
                self.pos += 1;
                return Ok(u64::from(b));
            }
        }
        let mut v: u64 = 0;
        for i in 0..10 {
            let b = self.u8()?;
            let part = u64::from(b & 0x7f);
            if i == 9 && b > 1 {
                return Err(FormatError::BadField { what: self.what, field: "varint", value: u64::from(b) });
            }
            v |= part << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(FormatError::BadField { what: self.what, field: "varint", value: v })
    }
    pub fn varint_signed(&mut self) -> Result<i64> {
        let z = self.varint()?;
        Ok(((z >> 1) as i64) ^ -((z & 1) as i64))
    }
    pub fn bad(&self, field: &'static str, value: u64) -> FormatError {
        FormatError::BadField { what: self.what, field, value }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_at_the_edges() {
        let vals = [0u64, 1, 127, 128, 300, u32::MAX as u64, u64::MAX - 1, u64::MAX];
        let signed = [0i64, -1, 1, i64::MIN, i64::MAX, -300];
        let mut w = Writer::default();
        vals.iter().for_each(|v| w.varint(*v));
        signed.iter().for_each(|v| w.varint_signed(*v));
        let mut r = Reader::new(&w.buf, "test");
        for v in vals {
            assert_eq!(r.varint().unwrap(), v);
        }
        for v in signed {
            assert_eq!(r.varint_signed().unwrap(), v);
        }
        assert!(r.is_empty());
    }

    #[test]
    fn truncated_and_overlong_varints_are_errors() {
        assert!(Reader::new(&[0x80], "t").varint().is_err());
        assert!(Reader::new(&[0xff; 11], "t").varint().is_err());
        assert!(Reader::new(&[1, 2, 3], "t").u32().is_err());
    }
}
