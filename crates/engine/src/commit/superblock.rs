//! The primary's superblock between checkpoints: rewriting it (both
//! copies, one at a time), recording mirror leg states before anything
//! relies on them, and the OPEN flag that tells a restart whether the
//! shutdown was clean.

use crate::device::label::write_label_copy;
use crate::device::Device;
use crate::error::{EngineError, Result};
use crate::members::mirror::LegHealth;
use crate::pool::{CommitCtl, Pool};
use tarn_format::superblock::{DeviceEntry, Superblock, FLAG_OPEN};

impl Pool {
    /// Rewrite the superblock with feature `bit` set and member `index`'s
    /// device-table entry changed by `change` (txid + 1; checkpoint and
    /// journal unchanged, as for mirror leg states): how a member's
    /// draining state and default placement are recorded. Durable when it
    /// returns; `ctl` then holds the new superblock.
    pub(crate) fn rewrite_member_entry(
        &self,
        ctl: &mut CommitCtl,
        index: usize,
        bit: u64,
        change: impl FnOnce(&mut DeviceEntry),
    ) -> Result<()> {
        let mut sb = ctl.sb.clone();
        sb.txid += 1;
        sb.incompat |= bit;
        sb.devices = self.device_table(&sb.devices);
        let Some(entry) = sb.devices.get_mut(index) else {
            return Err(EngineError::InvalidArgument(format!("device {index} is not a member of this pool")));
        };
        change(entry);
        self.write_superblock(&sb)?;
        ctl.sb = sb;
        Ok(())
    }

    /// Both copies carry the new state, one at a time with a flush
    /// between: a torn write leaves the other copy (old or new) intact,
    /// and rot in one copy never sends the pool back a checkpoint.
    pub(crate) fn write_superblock(&self, sb: &Superblock) -> Result<()> {
        let primary = &self.devices[0];
        for copy in [(sb.txid % 2) as usize, ((sb.txid + 1) % 2) as usize] {
            write_label_copy(primary.as_ref(), sb, copy)?;
            primary.flush().map_err(|e| EngineError::io("flush superblock", primary.name(), e))?;
        }
        Ok(())
    }

    /// The device table as the next superblock should record it: the
    /// committed one with every mirror's current leg states.
    pub(crate) fn device_table(&self, committed: &[DeviceEntry]) -> Vec<DeviceEntry> {
        let mut table = committed.to_vec();
        for (entry, m) in table.iter_mut().zip(&self.mirrors) {
            if let Some(m) = m {
                entry.legs = m.leg_entries();
            }
        }
        table
    }

    /// If a mirror leg changed state since the superblock was written,
    /// write it again with the new device table (txid + 1; checkpoint and
    /// journal unchanged, so the live journal stays valid).
    pub(crate) fn record_leg_states(&self, ctl: &mut CommitCtl) -> Result<()> {
        let table = self.device_table(&ctl.sb.devices);
        if table == ctl.sb.devices {
            return Ok(());
        }
        let mut sb = ctl.sb.clone();
        sb.txid += 1;
        sb.devices = table;
        self.write_superblock(&sb)?;
        log::info!("device table updated (txid {}): mirror leg states changed", sb.txid);
        ctl.sb = sb;
        Ok(())
    }

    fn has_mirrors(&self) -> bool {
        self.mirrors.iter().any(Option::is_some)
    }

    /// At a writable open of a pool with mirrors: after an unclean shutdown
    /// (FLAG_OPEN found set) every in-sync leg but the first of each mirror
    /// may miss writes a crash cut, so it is resynced (RESILVERING: written,
    /// not read); then FLAG_OPEN is set before anything is written.
    pub(crate) fn mark_open(&self) -> Result<Vec<String>> {
        let mut notes = Vec::new();
        if !self.has_mirrors() || self.options.read_only {
            return Ok(notes);
        }
        let mut ctl = self.lock_commit();
        if ctl.sb.flags & FLAG_OPEN != 0 {
            for (member, m) in self.mirrors.iter().enumerate() {
                let Some(m) = m else { continue };
                let online: Vec<usize> = m
                    .legs()
                    .iter()
                    .enumerate()
                    .filter(|(_, l)| l.health() == LegHealth::Online)
                    .map(|(i, _)| i)
                    .collect();
                for &leg in online.iter().skip(1) {
                    m.set_health(leg, LegHealth::Resilvering).map_err(|e| EngineError::io("resync", m.name(), e))?;
                    notes.push(format!(
                        "member {member}: unclean shutdown; leg {leg} is resynced from leg {}",
                        online[0]
                    ));
                }
            }
        }
        let mut sb = ctl.sb.clone();
        sb.txid += 1;
        sb.flags |= FLAG_OPEN;
        sb.devices = self.device_table(&sb.devices);
        self.write_superblock(&sb)?;
        ctl.sb = sb;
        Ok(notes)
    }

    /// At a clean close (after the final checkpoint): clear FLAG_OPEN.
    pub(crate) fn mark_closed(&self) -> Result<()> {
        if !self.has_mirrors() || self.options.read_only {
            return Ok(());
        }
        let mut ctl = self.lock_commit();
        let mut sb = ctl.sb.clone();
        sb.txid += 1;
        sb.flags &= !FLAG_OPEN;
        sb.devices = self.device_table(&sb.devices);
        self.write_superblock(&sb)?;
        ctl.sb = sb;
        Ok(())
    }
}
