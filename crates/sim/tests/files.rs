//! File volumes and objects (op 16, catalog flag ROLE): hidden from the
//! block commands, durable through journal replay and checkpoints.

use std::sync::Arc;
use tarn_engine::{EngineError, Pool};
use tarn_sim::device::SimDevice;
use tarn_sim::fixture::{one_device_pool, reopen};

const MIB: u64 = 1 << 20;

/// Drop the pool without closing it (its journal is replayed) and open again.
fn again(sim: &Arc<SimDevice>, pool: Pool) -> Pool {
    drop(pool);
    reopen(sim).unwrap()
}

fn hidden(pool: &Pool, fv: &str, obj: u32) {
    assert!(pool.list_volumes().is_empty(), "no block volume listed");
    assert!(pool.volume_id(fv).is_none() && pool.lookup_view(fv).is_none());
    assert!(pool.volume_id(&format!("~{obj}")).is_none());
    assert!(pool.list_snapshots(None).unwrap().is_empty());
    assert!(matches!(pool.delete_volume(fv, true), Err(EngineError::NoSuchVolume(_))));
    assert!(matches!(pool.create_snapshot(fv, "s"), Err(EngineError::NoSuchVolume(_))));
}

#[test]
fn roles_survive_replay_and_checkpoint_and_stay_hidden() {
    let (sim, pool) = one_device_pool(64 * MIB);
    let fv = pool.create_file_volume("home", 16 * MIB).unwrap();
    let obj = pool.create_object(fv.id, 1 << 40, None).unwrap();
    pool.write(obj, 4096, &[7u8; 4096], false).unwrap();
    pool.flush().unwrap();
    hidden(&pool, "home", obj);
    assert!(matches!(pool.create_volume("home", MIB), Err(EngineError::VolumeExists(_))));
    assert!(matches!(pool.create_volume("~9", MIB), Err(EngineError::InvalidArgument(_))));
    assert!(pool.create_object(obj, MIB, None).is_err(), "an object owns no object");
    // Replay (no checkpoint written since), then a checkpoint, then reopen.
    let pool = again(&sim, pool);
    hidden(&pool, "home", obj);
    let list = pool.file_volumes();
    assert_eq!(list.len(), 1);
    assert_eq!((list[0].objects, list[0].allocated), (1, 4096));
    pool.checkpoint().unwrap();
    let pool = again(&sim, pool);
    assert_eq!(pool.file_volume("home").unwrap().objects, 1);
    let mut buf = [0u8; 4096];
    pool.read(obj, 4096, &mut buf).unwrap();
    assert_eq!(buf, [7u8; 4096]);
    pool.delete_object(obj).unwrap();
    pool.flush().unwrap();
    assert_eq!(pool.file_volume("home").unwrap().objects, 0);
    let second = pool.create_object(fv.id, MIB, None).unwrap();
    pool.flush().unwrap();
    pool.delete_file_volume("home").unwrap();
    assert!(pool.file_volumes().is_empty() && pool.object_allocated(second).is_none());
    let pool = again(&sim, pool);
    assert!(pool.file_volumes().is_empty());
    pool.close().unwrap();
}
