//! Background copies yield to clients (`service::pace`): an evacuation
//! (`Pool::evacuate_device`) paced by `Pace` rests after exactly the steps
//! clients shared (a client request since the step before), and never
//! when no client sent one: the mover's own reads and writes are not
//! counted as a client's; head windows move in batches, a step each.
//! Counted with a recording sleeper, not timed.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;
use tarn_engine::device::mem_device::MemDevice;
use tarn_engine::service::pace::{Pace, MAX_REST};
use tarn_engine::{create_pool, CreateOptions, Device, OpenOptions, Pool};

const MIB: u64 = 1 << 20;
const VOLUME_MIB: u64 = 16;

/// A pool of a 64 MiB primary and a 256 MiB member holding a volume's
/// 16 MiB (allocation takes the roomiest member).
fn pool_with_data_on_member() -> (Pool, u32) {
    let d0: Arc<dyn Device> = Arc::new(MemDevice::new("m0", 64 * MIB, 1));
    create_pool(std::slice::from_ref(&d0), &["m0".to_string()], &CreateOptions::default()).unwrap();
    let pool = Pool::open(vec![d0], OpenOptions::default()).unwrap();
    pool.add_device(Arc::new(MemDevice::new("m1", 256 * MIB, 1)), "m1").unwrap();
    let id = pool.create_volume("v", VOLUME_MIB * MIB).unwrap().id;
    for i in 0..VOLUME_MIB {
        pool.write(id, i * MIB, &vec![i as u8 + 1; MIB as usize], false).unwrap();
    }
    pool.flush().unwrap();
    assert_eq!(pool.live_blocks_on(1).unwrap(), VOLUME_MIB * MIB / 4096, "the volume is on member 1");
    (pool, id)
}

/// Evacuate member 1, `batch` windows a step, a client reading one block
/// before every step `client_before(step)` chooses; (steps, rests
/// recorded, yields).
fn evacuate_with_clients(batch: u64, client_before: &dyn Fn(u64) -> bool) -> (u64, Vec<Duration>, u64) {
    let (pool, id) = pool_with_data_on_member();
    let rests = RefCell::new(Vec::new());
    let mut pace = Pace::with_sleep(&pool, None, Box::new(|d| rests.borrow_mut().push(d)));
    let mut steps = 0u64;
    let mut go_on = |moved: u64, _live: u64| {
        if client_before(steps) {
            let mut b = [0u8; 4096];
            pool.read(id, (steps % VOLUME_MIB) * MIB, &mut b).unwrap();
        }
        steps += 1;
        pace.after_step(moved);
        true
    };
    let r = pool.evacuate_device_batched(1, batch, &mut go_on).unwrap();
    assert_eq!(r.moved_bytes, VOLUME_MIB * MIB, "every live byte moved: {r:?}");
    assert!(r.detached.is_some(), "the member is taken out: {r:?}");
    let yields = pace.yields;
    drop(pace);
    let mut b = vec![0u8; MIB as usize];
    pool.read(id, 5 * MIB, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 6), "data read back after the move");
    (steps, rests.into_inner(), yields)
}

#[test]
fn no_client_no_rest() {
    let (steps, rests, yields) = evacuate_with_clients(1, &|_| false);
    assert!(steps >= VOLUME_MIB, "a step per window: {steps}");
    assert_eq!(yields, 0, "the mover's own I/O is not a client's");
    assert!(rests.is_empty(), "rested {rests:?} with no client");
}

#[test]
fn rests_after_exactly_the_steps_clients_shared() {
    // A client request before every third step.
    let (steps, rests, yields) = evacuate_with_clients(1, &|s| s % 3 == 0);
    let shared = (0..steps).filter(|s| s % 3 == 0).count() as u64;
    assert!(shared >= 5, "{shared} steps shared of {steps}");
    assert_eq!(yields, shared, "a rest after each step a client shared, none after the others");
    assert_eq!(rests.len() as u64, shared);
    assert!(rests.iter().all(|&d| d <= MAX_REST), "rests bounded: {rests:?}");
}

#[test]
fn a_busy_client_makes_every_step_rest() {
    let (steps, rests, yields) = evacuate_with_clients(1, &|_| true);
    assert_eq!(yields, steps);
    assert_eq!(rests.len() as u64, steps);
}

#[test]
fn batches_of_windows_are_one_step_each() {
    // 16 windows of 1 MiB in batches of 4: 4 steps, every byte moved and
    // read back (checked in evacuate_with_clients), a rest after each.
    let (steps, _, yields) = evacuate_with_clients(4, &|_| true);
    assert_eq!(steps, VOLUME_MIB / 4);
    assert_eq!(yields, steps);
    // The default batch (16 windows): the whole volume in one step.
    let (steps, _, _) = evacuate_with_clients(16, &|_| false);
    assert_eq!(steps, 1);
}
