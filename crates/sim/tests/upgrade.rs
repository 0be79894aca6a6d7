//! `tarn pool upgrade` on pools written by older formats: format 1
//! (whole-state checkpoints) and format 2 (a one-sided journal); the images
//! in tests/data/format1 and format2 were made by those releases with the
//! same writes, with journal records after the checkpoint and an overwrite
//! region open at a crash. An open in the current format refuses them with
//! a clear error and changes nothing; the upgrade keeps every volume,
//! snapshot and clone exactly; a crash at any write of the upgrade leaves a
//! pool that is either still in the old format (and upgrades again) or in
//! the current one, never anything else.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use tarn_engine::{Device, EngineError, OpenOptions, Pool, FORMAT_VERSION};
use tarn_sim::SimDevice;

const MIB: usize = 1 << 20;
const BS: usize = 4096;

/// The image an older format wrote, decompressed with the system's gzip.
fn image(format: u32) -> Vec<u8> {
    let path = format!("{}/../../tests/data/format{format}/pool.img.gz", env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new("gzip").arg("-dc").arg(&path).output().expect("run gzip -dc");
    assert!(out.status.success(), "gzip -dc {path}: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout.len(), 64 * MIB, "the format {format} image is a 64 MiB device");
    out.stdout
}

/// A simulated device holding `image` durably (zero blocks are skipped).
fn device(image: &[u8]) -> Arc<SimDevice> {
    let sim = Arc::new(SimDevice::new("sim0", image.len() as u64));
    for (i, block) in image.chunks(BS).enumerate() {
        if block.iter().any(|&b| b != 0) {
            sim.write_at(block, (i * BS) as u64).unwrap();
        }
    }
    sim.flush().unwrap();
    sim
}

fn open(sim: &Arc<SimDevice>, upgrade: bool) -> Result<Pool, EngineError> {
    Pool::open(vec![sim.clone() as Arc<dyn Device>], OpenOptions { upgrade, ..Default::default() })
}

/// What each view holds, from the writes that made the images (see
/// tests/data/format1/README.md; format 2's are the same).
fn expected() -> Vec<(&'static str, Vec<u8>)> {
    fn fill(v: &mut [u8], at: usize, len: usize, byte: u8) {
        v[at..at + len].fill(byte);
    }
    let mut s1 = vec![0u8; 16 * MIB];
    fill(&mut s1, 0, 4 * MIB, 0x11);
    fill(&mut s1, 8 * MIB, 64 << 10, 0x22);
    let mut a = s1.clone();
    fill(&mut a, 2 * MIB, MIB, 0x44);
    fill(&mut a, 12 * MIB, BS, 0x55);
    let mut c = s1.clone();
    fill(&mut c, 0, 64 << 10, 0x66);
    let mut b = vec![0u8; 8 * MIB];
    fill(&mut b, MIB, MIB, 0x33);
    fill(&mut b, 3 * MIB, BS, 0x88);
    fill(&mut b, 5 * MIB, 128 << 10, 0x78);
    fill(&mut b, 7 * MIB, BS, 0x98);
    vec![("a", a.clone()), ("a@s1", s1), ("a@s2", a), ("b", b), ("c", c)]
}

/// Every view reads exactly as expected and the checker finds nothing.
fn verify(pool: &Pool) -> Result<(), String> {
    for (name, want) in expected() {
        let (vol, view) = pool.lookup_view(name).ok_or(format!("{name} missing"))?;
        let mut got = vec![0u8; want.len()];
        pool.read_view(vol, view, 0, &mut got).map_err(|e| format!("read {name}: {e}"))?;
        if got != want {
            let at = got.iter().zip(&want).position(|(g, w)| g != w).unwrap_or(0);
            return Err(format!("{name} differs at byte {at}"));
        }
    }
    let report = pool.check();
    if !report.is_clean() {
        return Err(format!("checker: {:?}", report.problems));
    }
    Ok(())
}

fn upgrade(sim: &Arc<SimDevice>) -> Result<(), EngineError> {
    let pool = open(sim, true)?;
    pool.close()
}

#[test]
fn older_formats_are_refused_with_a_clear_error_and_left_alone() {
    for format in [1, 2] {
        let image = image(format);
        let sim = device(&image);
        let err = open(&sim, false).err().expect("an older format is not opened as is");
        assert!(matches!(err, EngineError::NeedsUpgrade { version, .. } if version == format), "{err}");
        assert!(err.to_string().contains("tarn pool upgrade"), "{err}");
        let ro =
            Pool::open(vec![sim.clone() as Arc<dyn Device>], OpenOptions { read_only: true, ..Default::default() });
        assert!(matches!(ro, Err(EngineError::NeedsUpgrade { .. })), "read-only too");
        let mut now = vec![0u8; image.len()];
        sim.read_at(&mut now, 0).unwrap();
        assert!(now == image, "a refused open of format {format} wrote to the device");
    }
}

#[test]
fn upgrade_keeps_every_view_and_is_idempotent() {
    for format in [1, 2] {
        let sim = device(&image(format));
        upgrade(&sim).unwrap();
        let pool = open(&sim, false).expect("the upgraded pool opens");
        assert_eq!(pool.format_version(), FORMAT_VERSION);
        verify(&pool).unwrap_or_else(|e| panic!("from format {format}: {e}"));
        // Writable and consistent after the upgrade: write, close, reopen.
        let (b, _) = pool.lookup_view("b").unwrap();
        pool.write(b, 0, &vec![0x5a; 2 * BS], false).unwrap();
        // An older pool has no coarse sums until its first long write,
        // which sets COARSE_SUMS by a commit of its own first.
        assert!(!pool.status().coarse_sums, "from format {format}: coarse before any long write");
        pool.write(b, 6 * MIB as u64, &vec![0x6b; 64 * BS], false).unwrap();
        let st = pool.status();
        assert!(
            st.coarse_sums && st.coarse_groups >= 1,
            "from format {format}: checksums {} coarse {} groups {}",
            st.checksums,
            st.coarse_sums,
            st.coarse_groups
        );
        pool.close().unwrap();
        let pool = open(&sim, true).expect("an upgrade open of the current format is a plain open");
        let mut buf = vec![0u8; 2 * BS];
        pool.read(b, 0, &mut buf).unwrap();
        assert!(buf.iter().all(|&x| x == 0x5a));
        assert!(pool.status().coarse_sums, "COARSE_SUMS is durable");
        let mut long = vec![0u8; 64 * BS];
        pool.read(b, 6 * MIB as u64, &mut long).unwrap();
        assert!(long.iter().all(|&x| x == 0x6b));
        assert!(pool.check().is_clean());
    }
}

/// A crash after every possible number of writes and flushes of the
/// upgrade: the pool opens in the old format (and then upgrades) or in the
/// current one, with every view intact.
fn crash_at_any_point_of_the_upgrade(format: u32) {
    let image = image(format);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let (mut as_old, mut as_new) = (0, 0);
    for calls in 0..400 {
        let sim = device(&image);
        sim.crash_after(calls);
        let finished = upgrade(&sim).is_ok() && !sim.is_dead();
        sim.crash(&mut rng);
        let pool = match open(&sim, false) {
            Ok(pool) => {
                as_new += 1;
                pool
            }
            Err(EngineError::NeedsUpgrade { .. }) => {
                as_old += 1;
                upgrade(&sim).unwrap_or_else(|e| panic!("crash after {calls} calls: upgrade again: {e}"));
                open(&sim, false).unwrap_or_else(|e| panic!("crash after {calls} calls: open: {e}"))
            }
            Err(e) => panic!("format {format}, crash after {calls} calls: neither format opens: {e}"),
        };
        verify(&pool).unwrap_or_else(|e| panic!("format {format}, crash after {calls} calls: {e}"));
        if finished {
            assert!(as_old > 0 && as_new > 0, "crashes left format {format} {as_old} and the new {as_new} times");
            return;
        }
    }
    panic!("the upgrade of format {format} did not finish within 400 writes and flushes");
}

#[test]
fn a_crash_at_any_point_of_the_upgrade_from_format_1_loses_nothing() {
    crash_at_any_point_of_the_upgrade(1);
}

#[test]
fn a_crash_at_any_point_of_the_upgrade_from_format_2_loses_nothing() {
    crash_at_any_point_of_the_upgrade(2);
}
