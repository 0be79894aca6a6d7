//! Per-file placement and protection on a file volume (Loris; issue 15
//! item 6, docs/ARCHITECTURE.md *File volumes*, per-file layout): the
//! layout policy kept in the volume (`tarn fs layout-policy`), applied
//! when a regular file's object is made at its first open for writing,
//! and a file's own layout (`user.tarn.layout`). A layout is the object's
//! engine settings (placement, members, stripe), so the engine's format
//! holds it; "mirrored" is "only mirrored members", resolved when the
//! layout is given to an object.

use crate::data::layoutrules::{self, layout_for, LayoutRule, LayoutSpec, MAX_LAYOUT_BYTES};
use crate::error::{FsError, Result};
use crate::history::policy::MAX_RULES;
use crate::history::versions::Versioned;
use crate::namespace::ns::FileVolume;
use crate::{Kind, OBJECT_SIZE};
use std::sync::Arc;
use tarn_engine::ObjectLayout;

impl FileVolume {
    /// The layout rules, in order (empty: none, an older volume among them).
    pub fn layout_policy(&self) -> Result<Vec<LayoutRule>> {
        let object = self.lock().header.layout;
        if object == 0 {
            return Ok(Vec::new());
        }
        layoutrules::decode(&self.read_rule_object(object, layoutrules::body_len)?)
    }

    /// Add rule `text` setting `spec` at the end (first match wins). A bad
    /// rule, one already there, or a layout the pool cannot give (no
    /// mirrored member, an unknown member, a stripe wider than the
    /// members) is refused, nothing written. Durable on return.
    pub fn layout_add(&self, text: &str, spec: LayoutSpec) -> Result<()> {
        let new = LayoutRule::new(text, spec)?;
        if !spec.is_default() {
            self.pool.check_object_layout(&self.engine_layout(&spec)?)?;
        }
        let mut rules = self.layout_policy()?;
        if rules.iter().any(|r| r.rule == new.rule) {
            return Err(FsError::Invalid("the rule is already in the layout policy (remove it first)"));
        }
        if rules.len() >= MAX_RULES {
            return Err(FsError::Invalid("a layout policy has at most 256 rules"));
        }
        rules.push(new);
        self.write_layout_policy(&rules)
    }

    /// Remove rule `text` (refused when not there). Durable on return.
    pub fn layout_remove(&self, text: &str) -> Result<()> {
        let rule = crate::history::policy::Rule::parse(text)?;
        let mut rules = self.layout_policy()?;
        let at =
            rules.iter().position(|r| r.rule == rule).ok_or(FsError::Invalid("no such rule in the layout policy"))?;
        rules.remove(at);
        self.write_layout_policy(&rules)
    }

    fn write_layout_policy(&self, rules: &[LayoutRule]) -> Result<()> {
        let bytes = layoutrules::encode(rules);
        debug_assert!(bytes.len() <= MAX_LAYOUT_BYTES);
        self.write_rule_object(&bytes, |h| &mut h.layout)
    }

    /// The engine layout for `spec` now: "mirrored" becomes the mirrored
    /// members (of `devices`, when it names any).
    fn engine_layout(&self, spec: &LayoutSpec) -> Result<ObjectLayout> {
        let mut devices = spec.devices;
        if spec.mirrored {
            let mirrors = self.pool.mirrored_members();
            if mirrors == 0 {
                return Err(FsError::Invalid("mirrored: the pool has no mirrored member (pool create A --mirror B)"));
            }
            devices = if devices == 0 { mirrors } else { mirrors & devices };
            if devices == 0 {
                return Err(FsError::Invalid("mirrored: none of the given devices is a mirrored member"));
            }
        }
        Ok(ObjectLayout { placement: spec.placement, devices, stripe: spec.stripe })
    }

    /// Give regular file `ino` layout `spec` (what it does not name is
    /// the default): its placement and members apply to data written from
    /// now on, a stripe only before it has data. Queued like every
    /// namespace change: durable at the next commit, with the data
    /// written after it.
    pub fn set_file_layout(&self, ino: u64, spec: &LayoutSpec) -> Result<()> {
        self.writable()?;
        let layout = self.engine_layout(spec)?;
        let mut ns = self.lock();
        let mut i = self.inode(&mut ns, ino)?;
        if i.kind != Kind::File {
            return Err(FsError::Invalid("a layout is for regular files"));
        }
        if i.object != 0 {
            // Data written before the change keeps the old layout.
            self.settle(&mut ns, i.object);
            return Ok(self.pool.set_object_layout(i.object, &layout)?);
        }
        self.before_change(&mut ns, &mut i)?;
        i.object = self.pool.create_object_laid_out(self.id, OBJECT_SIZE, &layout)?;
        self.save(&mut ns, &i)
    }

    /// A rule's layout for file `ino` when it has no object yet (a file
    /// with data keeps its own).
    pub(crate) fn lay_out_new(&self, ino: u64, spec: &LayoutSpec) -> Result<()> {
        let object = self.inode(&mut self.lock(), ino)?.object;
        if object != 0 {
            return Ok(());
        }
        self.set_file_layout(ino, spec)
    }

    /// `user.tarn.layout` of `ino`: its layout as `set_file_layout` takes
    /// it ("default" when it sets nothing), then `blocks=M:N,...`, the 4
    /// KiB blocks of its data on each member M (`none`: no data object).
    pub fn file_layout(&self, ino: u64) -> Result<String> {
        let mut ns = self.lock();
        let i = self.inode(&mut ns, ino)?;
        // Blocks counted where they are, none still queued.
        self.settle(&mut ns, i.object);
        drop(ns);
        if i.kind != Kind::File {
            return Err(FsError::NoData);
        }
        if i.object == 0 {
            return Ok("default blocks=none".to_string());
        }
        let l = self.pool.object_layout(i.object)?;
        let mirrored = l.devices != 0 && l.devices & !self.pool.mirrored_members() == 0;
        let spec = LayoutSpec { placement: l.placement, mirrored, devices: l.devices, stripe: l.stripe };
        let per = self.pool.object_blocks_per_member(i.object)?;
        let blocks: Vec<String> = per.iter().enumerate().map(|(d, n)| format!("{d}:{n}")).collect();
        let text = if spec.is_default() { "default".to_string() } else { spec.text() };
        Ok(format!("{text} blocks={}", blocks.join(",")))
    }
}

impl Versioned {
    /// The layout rules, read once per mount (the pool is locked while
    /// mounted, so `tarn fs layout-policy` cannot change them meanwhile).
    pub(crate) fn layout_rules(&self) -> Result<Arc<Vec<LayoutRule>>> {
        let cached = self.sessions().layout.clone();
        match cached {
            Some(r) => Ok(r),
            None => {
                let r = Arc::new(self.live.layout_policy()?);
                self.sessions().layout = Some(r.clone());
                Ok(r)
            }
        }
    }

    /// The first open for writing of `ino`: a file with no data object
    /// that a layout rule matches gets its object now, laid out by the
    /// rule. No rules: nothing at all is done.
    pub(crate) fn layout_at_open(&self, ino: u64) -> Result<()> {
        let rules = self.layout_rules()?;
        if rules.is_empty() {
            return Ok(());
        }
        let Some((parent, name)) = self.noted_name(ino) else {
            return Ok(());
        };
        let any_subtree = rules.iter().any(|r| r.rule.subtree);
        let Some(path) = self.policy_path(any_subtree, parent, &name)? else {
            return Ok(());
        };
        match layout_for(&rules, &path) {
            Some(spec) => self.live.lay_out_new(ino, spec),
            None => Ok(()),
        }
    }

    /// `setfattr -n user.tarn.layout -v LAYOUT FILE` on the mount.
    pub fn set_layout(&self, x: u64, value: &[u8]) -> Result<()> {
        let ino = self.writable(x)?;
        let text = std::str::from_utf8(value).map_err(|_| FsError::Invalid("layout is not UTF-8"))?;
        self.live.set_file_layout(ino, &LayoutSpec::parse(text)?)
    }

    /// `getfattr -n user.tarn.layout FILE` on the mount (live files only).
    pub fn layout(&self, x: u64) -> Result<Vec<u8>> {
        let ino = self.writable(x).map_err(|_| FsError::NoData)?;
        Ok(self.live.file_layout(ino)?.into_bytes())
    }
}
