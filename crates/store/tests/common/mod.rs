//! Shared test scaffolding: a deterministic RNG and an allocator that
//! frees superseded blocks only when the protocol allows it.
#![allow(dead_code)]

use tarn_format::Pba;
use tarn_store::NodeAlloc;

pub struct Rng(pub u64);

impl Rng {
    pub fn step(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.step() % n
    }
}

/// Node blocks from a counter and a free list (reused first, so a block
/// freed too early is overwritten at once and the next read catches it).
#[derive(Default)]
pub struct TestAlloc {
    pub next: u64,
    pub free: Vec<Pba>,
    pub allocated: u64,
}

impl NodeAlloc for TestAlloc {
    fn alloc_node(&mut self) -> Option<Pba> {
        self.allocated += 1;
        Some(self.free.pop().unwrap_or_else(|| {
            self.next += 1;
            Pba::new(0, 1000 + self.next)
        }))
    }
}
