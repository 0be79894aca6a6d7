//! `tarn`: thin pools, volumes and an NBD server, with nouns like LVM and ZFS.

mod admin;
mod daemon;
mod devices;
mod fs_layout;
mod fs_versions;
mod guest;
mod members;
mod mirror;
mod picture;
mod poolfile;
mod progress;
mod size;
mod snapshots;
mod spec;
mod text;
mod trace;

use daemon::{alerts, config, control, export, handover, logging, metrics, serve, tls};
use guest::{guestfs, hint, image, reclaim};
use picture::layout;

use admin::{Ctx, Request};
use anyhow::{bail, Context, Result};
use clap::{Args, CommandFactory, Parser, Subcommand};
use serde_json::Value;
use spec::{SnapSpec, ViewSpec};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tarn_engine::{create_mirrored_pool, CreateOptions, Device, OpenOptions};

#[derive(Parser)]
#[command(
    name = "tarn",
    version,
    about = "Thin pools, volumes with snapshots and clones, and an NBD server",
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    ceph: devices::CephArgs,
}

#[derive(Args, Clone)]
pub(crate) struct PoolArg {
    /// The pool's primary device (file or block device).
    #[arg(short = 'p', long = "pool", env = "TARN_POOL")]
    pub(crate) pool: PathBuf,
    /// Member devices, when they moved from the paths the pool recorded.
    #[arg(long = "device")]
    devices: Vec<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Create, inspect and check pools.
    #[command(subcommand)]
    Pool(PoolCmd),
    /// Create, list, resize, clone and delete thin volumes.
    #[command(subcommand)]
    Vol(VolCmd),
    /// Add member devices to a pool, online (through `tarn serve`) or not.
    #[command(subcommand)]
    Dev(DevCmd),
    /// Create, list and destroy file volumes (mounted with `tarn mount`).
    #[command(subcommand)]
    Fs(FsCmd),
    /// Mount a file volume through FUSE, in the foreground, on an offline
    /// pool; NAME@SNAP mounts a volume snapshot read-only.
    Mount {
        name: String,
        dir: PathBuf,
        /// Seconds between commits of what was written (fsync, fdatasync
        /// and unmount commit at once); 0: commit at every close instead
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=3600))]
        commit_interval: u64,
        /// Send every write(2) to tarn as it comes (no kernel writeback
        /// cache): slower for small writes, but ENOSPC and EDQUOT are
        /// returned by write(2) itself
        #[arg(long)]
        no_writeback_cache: bool,
        /// Keep the space of deleted data allocated in the pool's files
        /// (as ext4 without `-o discard`): no hole is punched per freed
        /// range, each punch costing about a millisecond of the commit
        /// that frees it, under the namespace lock; the space is reused
        /// by tarn all the same
        #[arg(long)]
        no_discard: bool,
        /// Write large data through the page cache as other commands do
        /// (by default writes of 64 KiB and more go to the pool file
        /// with O_DIRECT, skipping the copy into new page-cache pages:
        /// 6-10% faster at full-size PostMark on a VM, 11% slower when
        /// the data fits in cache; docs/ARCHITECTURE.md *The pmd slice*)
        #[arg(long)]
        no_direct_writes: bool,
        /// Microseconds of the FUSE session thread's scheduler slice
        /// (Linux 6.12+; 100 is the kernel's least): a short slice lets
        /// each request preempt other work sooner, without more CPU
        /// (docs/ARCHITECTURE.md *The pmt slice*); 0: the kernel's default
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(0..=100_000))]
        session_slice_us: u64,
        /// The FUSE transport: io_uring queues, one per CPU, serve each
        /// request on the CPU of its caller (Linux 6.14+ with the fuse
        /// module's enable_uring=Y; docs/ARCHITECTURE.md *FUSE
        /// transport*); auto: when the kernel offers them, on: refuse to
        /// mount without, off: /dev/fuse only
        #[arg(long, value_enum, default_value = "auto")]
        fuse_uring: FuseUring,
        /// Per-file readahead: a file read sequentially whose blocks lie
        /// scattered in the pool (written at random) gets its next
        /// window's blocks asked of the disk at once by a thread of the
        /// mount; windows grow from 128 KiB, doubling, to this size
        /// (docs/ARCHITECTURE.md *File readahead*); 0: off
        #[arg(long, default_value = "4M", value_parser = size::parse_size_or_zero)]
        readahead: u64,
        /// Write file data behind: a WRITE is answered once copied, and a
        /// thread of the mount writes it to the pool, up to this many
        /// bytes queued (reads, fsync, versions and snapshots wait for
        /// what they need; a write lost behind fails the file's next
        /// fsync; docs/ARCHITECTURE.md *Write-behind*); 0: off, every
        /// WRITE waits for the pool
        #[arg(long, default_value = "32M", value_parser = size::parse_size_or_zero)]
        write_behind: u64,
        /// Let every user reach the mount (FUSE's allow_other: root, or
        /// user_allow_other in /etc/fuse.conf); permissions are checked
        /// by the kernel against the mode and POSIX access control lists.
        /// Without it only the user who mounted reaches it
        #[arg(long)]
        allow_other: bool,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// Create, list, delete and roll back to snapshots of volumes.
    #[command(subcommand)]
    Snap(SnapCmd),
    /// Byte ranges changed since a snapshot (in a newer snapshot, or the head).
    Diff(DiffCmd),
    /// Serve every volume (writable) and snapshot (read-only, VOL@SNAP) of a pool over NBD.
    Serve(Box<ServeCmd>),
    /// The main job: create a pool with a default volume on first run, then serve it.
    Run(RunCmd),
    /// Request traces (`serve --trace`): print, convert, replay against a placement.
    #[command(subcommand)]
    Trace(TraceSub),
    #[command(flatten)]
    Gen(GenCmd),
    /// Draw each device's layout: blocks by volume (snapshots' space
    /// lighter or hatched), free, metadata, journal; fragmentation per device.
    Map(MapArgs),
}

/// The pool, the files to draw and the form of the answer, for `tarn map`
/// and `tarn vol map`.
#[derive(Args)]
struct MapArgs {
    #[command(flatten)]
    pool: PoolArg,
    #[command(flatten)]
    out: picture::Output,
    /// Answer in JSON: the picture's description (files, size, legend
    /// colours, where each device's grid lies); `vol map` without
    /// --png/--svg: its runs.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum DevCmd {
    /// Add a device to the pool: its space is usable by every volume at
    /// once. Refuses a device of another pool, one already a member, one
    /// too small or read-only.
    Add {
        /// The new device (a file is created with --size if missing).
        path: PathBuf,
        /// Size of the file to create when PATH does not exist.
        #[arg(long, value_parser = size::parse_size)]
        size: Option<u64>,
        /// Add it as a spare: labelled, never allocated from, taken whole
        /// as a member when the pool expands (`serve --expand-at`) and the
        /// growing member is at its --expand-max
        #[arg(long)]
        spare: bool,
        #[command(flatten)]
        pool: PoolArg,
        #[arg(long)]
        json: bool,
    },
    /// Remove a member (a spare is just dropped, its label wiped): allocation avoids it, then every live block on it
    /// (held by a volume, snapshot or clone) moves to the other members,
    /// keeping snapshot sharing. Online through a running server, or
    /// offline. Refuses the primary, the last device, a mirrored member,
    /// an unknown index, and live data the other members cannot hold.
    Remove {
        /// The member's index, as `pool status` shows it.
        index: usize,
        /// Bytes moved per second at most (say 50M).
        #[arg(long, value_parser = size::parse_size)]
        rate: Option<u64>,
        /// Stop a running removal: the member becomes a normal one.
        #[arg(long)]
        cancel: bool,
        #[command(flatten)]
        pool: PoolArg,
        #[arg(long)]
        json: bool,
    },
    /// Give a member a default placement for data on it of volumes that
    /// name none of their own (per-device layout): append on one member,
    /// inplace on another. Data already there stays where it is.
    Set {
        /// The member's index, as `pool status` shows it.
        index: usize,
        /// linear, inplace, append, contiguous, or default (none: the
        /// pool's default applies).
        #[arg(long, value_parser = parse_placement_or_default)]
        placement: String,
        #[command(flatten)]
        pool: PoolArg,
        #[arg(long)]
        json: bool,
    },
    /// Grow a member to a new size (a regular file is extended): the new
    /// space is usable by every volume at once, and durable. Online
    /// through a running server, or offline.
    Grow {
        /// The member: its index (0: the primary) as `dev add` and `pool
        /// status` show it.
        index: usize,
        /// The member's new size (larger than now).
        #[arg(long, value_parser = size::parse_size)]
        size: u64,
        #[command(flatten)]
        pool: PoolArg,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum FsCmd {
    /// A new, empty file volume (thin: it takes space as files are written).
    Create {
        name: String,
        /// Space its files may take (e.g. 10G; default: the pool's).
        #[arg(long, value_parser = size::parse_size)]
        quota: Option<u64>,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// File volumes with their objects and the space they use.
    List {
        #[command(flatten)]
        pool: PoolArg,
        #[arg(long)]
        json: bool,
    },
    /// Delete a file volume and every file in it.
    Destroy {
        name: String,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// A writable file volume NEW from volume snapshot FS@SNAP (offline):
    /// nothing copied (engine clones of its table and objects); the two
    /// change independently.
    Clone {
        /// The file volume and its volume snapshot, FS@SNAP.
        source: String,
        new: String,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// Make a clone independent of the file volume it was cloned from
    /// (offline): what its table and files still share is copied, so the
    /// origin (and the snapshot it came from) can be destroyed.
    Flatten {
        name: String,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// Volume snapshots of a file volume (offline): create, list, delete.
    #[command(subcommand)]
    Snap(fs_versions::FsSnapCmd),
    /// Open-close versioning (offline): rules for the files whose every
    /// modified close takes a version, and how many are kept.
    VersionPolicy(fs_versions::FsPolicyArgs),
    /// Per-file placement and protection (offline): rules giving the
    /// files they match a placement, members (or mirrored members only)
    /// and a stripe of their own. On a mount, `user.tarn.layout` sets
    /// and shows one file's.
    LayoutPolicy(fs_layout::FsLayoutArgs),
    /// Check a file volume's namespace (offline): every inode reachable,
    /// every entry to an allocated inode, link counts; exit 0 clean, 1 not.
    Check {
        name: String,
        #[command(flatten)]
        pool: PoolArg,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum TraceSub {
    /// One line per request: seconds, export, command, offset, length, flags.
    Print {
        file: PathBuf,
        /// At most this many requests.
        #[arg(long)]
        limit: Option<usize>,
    },
    /// A kernel block trace (blkparse's default text output, `Q` events)
    /// to a tarn trace.
    Convert {
        /// The blkparse text.
        input: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
        /// Name the (single) device's export (default dev<MAJ>-<MIN>).
        #[arg(long)]
        export: Option<String>,
    },
    /// Play a trace against a scratch pool with a placement and measure
    /// the layout it leaves: seeks and density per region, read time.
    Replay {
        file: PathBuf,
        #[arg(long, default_value = "linear", value_parser = parse_placement)]
        placement: tarn_engine::PlacementKind,
        /// Scratch pool size (default: twice what the exports span).
        #[arg(long, value_parser = size::parse_size)]
        pool_size: Option<u64>,
        /// Where the scratch pool goes.
        #[arg(long, default_value = "/var/tmp")]
        dir: PathBuf,
        /// Keep the scratch pool (replay-pool.img in --dir).
        #[arg(long)]
        keep: bool,
        /// Snapshot every volume each time this many seconds of trace pass.
        #[arg(long)]
        snapshot_every: Option<f64>,
        /// Region size of the layout figures, and of `contiguous` placement.
        #[arg(long, default_value = "256K", value_parser = size::parse_size)]
        region: u64,
        /// Where `contiguous` searches a region's first home from (as `serve --region-start`).
        #[arg(long, value_enum, default_value = "cursor")]
        region_start: config::RegionStart,
        /// Files over the exports (JSON list of {export, extents: [[offset,
        /// length]...], rewritten}): figures per file too.
        #[arg(long)]
        files: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum PoolCmd {
    /// Write a new pool on one or more devices.
    Create {
        /// Primary device: an existing block device or file, or a file to create (with --size).
        primary: PathBuf,
        /// Size of the file to create when the primary does not exist.
        #[arg(long, value_parser = size::parse_size)]
        size: Option<u64>,
        /// Further member devices; `mirror:A,B` makes a mirrored member.
        #[arg(long = "device", value_name = "PATH|mirror:PATH,PATH")]
        devices: Vec<String>,
        /// Mirror the primary onto this device too (repeat for 3+ legs).
        #[arg(long = "mirror", value_name = "PATH")]
        mirror: Vec<PathBuf>,
        /// Journal size (default: 1/64 of the primary, 1 to 64 MiB).
        #[arg(long, value_parser = size::parse_size)]
        journal_size: Option<u64>,
        /// Overwrite devices that already hold a tarn pool.
        #[arg(long)]
        force: bool,
        /// Keep no data checksums (data errors then go undetected).
        #[arg(long)]
        no_checksums: bool,
        /// Where new data starts on each device: front (default) or middle
        /// (Virtual Allocation's: it wraps around to the front at the end).
        #[arg(long, value_enum, default_value = "front")]
        start: StartArg,
    },
    /// Change pool-wide settings.
    Set {
        /// RATIO (e.g. 2.0) or none: creating or growing a volume past
        /// RATIO × the pool's size (sum of virtual sizes) needs --force.
        #[arg(long, value_parser = parse_ratio_or_none, allow_hyphen_values = true)]
        overcommit: u32,
        #[command(flatten)]
        pool: PoolArg,
        #[arg(long)]
        json: bool,
    },
    /// Usage: size, used, free, metadata, overcommit.
    Status {
        #[command(flatten)]
        pool: PoolArg,
        #[arg(long)]
        json: bool,
    },
    /// Replace a mirror leg (failed, missing or healthy) and resilver onto the new device, a
    /// missing member (UNAVAIL) and rebuild its parity volumes' blocks onto it, or a present
    /// member and copy everything on it onto the new device (which then takes its index; the
    /// old one loses its pool label), online and resumable.
    Replace {
        /// The leg to replace (its path as `pool status` shows it, or its uuid), or the member
        /// (its index or recorded path; missing or present).
        old: String,
        /// The new device (a file is created with --size if missing).
        new: PathBuf,
        /// Size of the file to create when NEW does not exist.
        #[arg(long, value_parser = size::parse_size)]
        size: Option<u64>,
        /// Bytes rebuilt or copied per second at most (a member's rebuild or copy; e.g. 50M).
        #[arg(long, value_parser = size::parse_size)]
        rate: Option<u64>,
        #[command(flatten)]
        pool: PoolArg,
        #[arg(long)]
        json: bool,
    },
    /// Convert a pool written by an older tarn (format 1) to the current
    /// format. Crash-safe: until the last step the old pool is untouched.
    Upgrade {
        #[command(flatten)]
        pool: PoolArg,
    },
    /// Verify every metadata invariant. Exit 0 clean, 1 problems, 2 could not check.
    Check {
        #[command(flatten)]
        pool: PoolArg,
        #[arg(long)]
        json: bool,
    },
    /// Read and verify every copy of every block, rewrite bad copies from good
    /// ones, list the volume ranges no copy holds. Exit 0 clean or repaired, 1 data lost.
    Scrub(ScrubArgs),
    /// Scrub, and also rewrite damaged superblock copies from the good one.
    /// Exit 0 when nothing is lost, 1 when ranges are lost (listed).
    Repair(ScrubArgs),
    /// Re-lay out volumes online so scattered data reads sequentially again:
    /// every 1 MiB whose data lies in short runs moves to one new run (blocks
    /// snapshots or clones share move for all of them). Without --volume, then
    /// clean the pool: live data of 4 MiB regions at most half used moves into
    /// whole free regions, so free space is in long runs again.
    Compact {
        /// Only this volume (default: every volume).
        #[arg(long)]
        volume: Option<String>,
        /// At most this many bytes of volume looked at per second (K, M, G).
        #[arg(long, value_parser = size::parse_size)]
        rate: Option<u64>,
        #[command(flatten)]
        pool: PoolArg,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
struct ScrubArgs {
    #[command(flatten)]
    pool: PoolArg,
    /// Read at most this many bytes per second (e.g. 200M).
    #[arg(long, value_parser = size::parse_size)]
    rate: Option<u64>,
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum VolCmd {
    /// Create a thin volume (its size may exceed the pool).
    Create {
        name: String,
        #[arg(long, value_parser = size::parse_size)]
        size: u64,
        /// Where the volume's new data goes: linear, inplace, append or
        /// contiguous (default: the pool's, `serve --placement`).
        #[arg(long, value_parser = parse_placement)]
        placement: Option<tarn_engine::PlacementKind>,
        /// Bytes of pool space the volume and its snapshots may hold
        /// (writes to holes past it fail with ENOSPC).
        #[arg(long, value_parser = parse_quota)]
        quota: Option<u64>,
        /// Create it even past the pool's overcommit ratio.
        #[arg(long)]
        force: bool,
        /// Members its new data goes to, by index (`0,2`; default: any).
        /// With no placement of its own, it follows the first of them
        /// that has one (`dev set --placement`).
        #[arg(long, value_parser = members::parse_device_list)]
        devices: Option<u16>,
        /// Stripe its data (RAID-0) over N members (of --devices, if
        /// given), unit k of the volume on the (k mod N)-th, in units of
        /// UNIT bytes (a power of two from 4K to 64M; default 64K)
        #[arg(long, value_name = "N[:UNIT]", value_parser = parse_stripe)]
        stripe: Option<(u32, u64)>,
        /// Keep single parity (RAID-5) over N data members plus one (of
        /// --devices, if given), in units of UNIT bytes (a power of two
        /// from 4K to 64K; default 16K). Every write is copy-on-write; a
        /// read through a failing member is rebuilt from the others
        #[arg(long, value_name = "N[:UNIT]", value_parser = parse_parity, conflicts_with = "stripe")]
        parity: Option<(u32, u64)>,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// Change a volume's settings.
    Set {
        name: String,
        /// linear, inplace, append, contiguous, or default (the pool's).
        /// Applies to data written from now on.
        #[arg(long, value_parser = parse_placement_or_default)]
        placement: Option<String>,
        /// Members its new data goes to (`0,2`), or any. Applies to data
        /// written from now on.
        #[arg(long, value_parser = members::parse_device_list)]
        devices: Option<u16>,
        /// SIZE, or none: bytes of pool space the volume and its snapshots
        /// may hold (refused below what they hold now).
        #[arg(long, value_parser = parse_quota_or_none, allow_hyphen_values = true)]
        quota: Option<u64>,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// Give back the space of blocks the volume's ext2/3/4 file system
    /// freed but never discarded (read from a snapshot; blocks written
    /// since are kept). The file system must be unmounted or frozen.
    Reclaim {
        name: String,
        /// Only count what would be reclaimed.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        pool: PoolArg,
        #[arg(long)]
        json: bool,
    },
    /// Find the metadata of the volume's ext2/3/4 file system (from a
    /// snapshot): bytes per kind.
    Classify {
        name: String,
        /// List every run (with --json: offset, length, kind in bytes).
        #[arg(long)]
        runs: bool,
        #[command(flatten)]
        pool: PoolArg,
        #[arg(long)]
        json: bool,
    },
    /// Move file-system metadata together: the given byte ranges, or what
    /// `vol classify` finds. To one clustered run of the roomiest device,
    /// or onto a device set aside for metadata (blocks a snapshot shares
    /// stay where they are).
    Hint {
        name: String,
        /// OFFSET:LENGTH in bytes (suffixes K, M, G); repeatable.
        #[arg(long = "metadata", value_parser = parse_byte_range)]
        ranges: Vec<(u64, u64)>,
        /// A pool device (index or path) for metadata only: faster storage.
        #[arg(long)]
        metadata_device: Option<String>,
        #[command(flatten)]
        pool: PoolArg,
        #[arg(long)]
        json: bool,
    },
    /// Move hinted metadata (the ranges given, or what `vol classify`
    /// finds) back where the volume's placement puts data: no lock-in.
    Unhint {
        name: String,
        #[arg(long = "metadata", value_parser = parse_byte_range)]
        ranges: Vec<(u64, u64)>,
        #[command(flatten)]
        pool: PoolArg,
        #[arg(long)]
        json: bool,
    },
    /// Write a volume (or VOL@SNAP) to a file or block device as a plain
    /// raw image (a file stays sparse), read from a snapshot so a volume
    /// in use is copied as one point in time.
    Export {
        #[arg(value_name = "VOL[@SNAP]", value_parser = spec::parse_view)]
        view: ViewSpec,
        /// A new file, or a block device at least the volume's size.
        dest: PathBuf,
        /// Replace an existing regular file.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        pool: PoolArg,
        #[arg(long)]
        json: bool,
    },
    /// Create a volume from an image file: raw, or any format qemu-img
    /// reads (qcow2, vmdk, vdi, vhdx, qed; converted to a sparse raw file
    /// first); blocks of zeros are not allocated.
    Import {
        src: PathBuf,
        name: String,
        /// raw, or auto (default: a qemu image format by its magic bytes, else raw).
        #[arg(long, default_value = "auto", value_parser = ["auto", "raw"])]
        format: String,
        #[command(flatten)]
        pool: PoolArg,
        #[arg(long)]
        json: bool,
    },
    /// List volumes with their allocated bytes.
    List {
        #[command(flatten)]
        pool: PoolArg,
        #[arg(long)]
        json: bool,
    },
    /// Where a volume's (or a snapshot's, VOL@SNAP) blocks lie on the
    /// devices: one line per run, `lba len device block` in 4 KiB blocks;
    /// with --png/--svg a picture (offset in the volume against place on
    /// the devices) and its description.
    Map {
        name: String,
        #[command(flatten)]
        args: MapArgs,
    },
    /// Grow or shrink a volume (shrinking discards the tail).
    Resize {
        name: String,
        #[arg(long, value_parser = size::parse_size)]
        size: u64,
        #[arg(long)]
        allow_shrink: bool,
        /// Grow even past the pool's overcommit ratio.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// Delete a volume and return its space to the pool.
    Delete {
        name: String,
        /// Also delete the volume's snapshots (refused without it when it has some).
        #[arg(short = 'r', long)]
        recursive: bool,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// A writable volume starting as a copy of a snapshot; nothing is copied.
    Clone {
        /// The snapshot to clone.
        #[arg(value_name = "VOL@SNAP", value_parser = spec::parse_snap)]
        origin: SnapSpec,
        /// Name of the new volume.
        #[arg(value_name = "NEWVOL")]
        name: String,
        /// Create it even past the pool's overcommit ratio.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        pool: PoolArg,
        #[arg(long)]
        json: bool,
    },
    /// Copy what a clone still shares with its origin, so the origin snapshot can go.
    Flatten {
        name: String,
        #[command(flatten)]
        pool: PoolArg,
    },
}

#[derive(Subcommand)]
enum SnapCmd {
    /// Snapshot a volume: holds every write answered before it; nothing is copied.
    Create {
        #[arg(value_name = "VOL@NAME", value_parser = spec::parse_snap)]
        snap: SnapSpec,
        #[command(flatten)]
        pool: PoolArg,
        #[arg(long)]
        json: bool,
    },
    /// Snapshots (of one volume, or all) with the space each holds.
    List {
        /// Only this volume's snapshots.
        #[arg(value_name = "VOL")]
        volume: Option<String>,
        #[command(flatten)]
        pool: PoolArg,
        #[arg(long)]
        json: bool,
    },
    /// Delete a snapshot and return the space only it held.
    Delete {
        #[arg(value_name = "VOL@NAME", value_parser = spec::parse_snap)]
        snap: SnapSpec,
        #[command(flatten)]
        pool: PoolArg,
        #[arg(long)]
        json: bool,
    },
    /// Make the volume's contents those of the snapshot again (connected clients see the change).
    Rollback {
        #[arg(value_name = "VOL@NAME", value_parser = spec::parse_snap)]
        snap: SnapSpec,
        /// Delete the snapshots newer than this one (refused without it).
        #[arg(long)]
        destroy_newer: bool,
        #[command(flatten)]
        pool: PoolArg,
    },
}

#[derive(Args)]
struct DiffCmd {
    /// The older snapshot.
    #[arg(value_name = "VOL@OLD", value_parser = spec::parse_snap)]
    from: SnapSpec,
    /// A newer snapshot of the same volume, or the volume itself (its head; the default).
    #[arg(value_name = "VOL@NEW|VOL", value_parser = spec::parse_view)]
    to: Option<ViewSpec>,
    #[command(flatten)]
    pool: PoolArg,
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ServeCmd {
    /// Read options from this TOML file (keys: the flags' names without
    /// the dashes, e.g. `commit-interval = 5`); flags given here win.
    #[arg(long, value_name = "FILE", env = "TARN_CONFIG")]
    config: Option<PathBuf>,
    #[command(flatten)]
    opts: config::ServeOpts,
}

#[derive(Subcommand)]
enum GenCmd {
    /// Shell completion script for bash, zsh, fish, elvish or powershell on stdout.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// The manual page (roff) on stdout, or with --dir one page per command
    /// (tarn.1, tarn-serve.1, tarn-pool-create.1, ...) into DIR.
    Man {
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

/// A quota: a size above 0 (`vol create --quota`).
fn parse_quota(s: &str) -> std::result::Result<u64, String> {
    match size::parse_size(s)? {
        0 => Err(format!("quota {s:?} is 0: give a size (or none with vol set to remove it)")),
        q => Ok(q),
    }
}

/// A quota or "none" (0: remove it).
fn parse_quota_or_none(s: &str) -> std::result::Result<u64, String> {
    if s == "none" {
        return Ok(0);
    }
    parse_quota(s)
}

/// An overcommit ratio above 0 and at most 1000, or "none" (0), in thousandths.
fn parse_ratio_or_none(s: &str) -> std::result::Result<u32, String> {
    if s == "none" {
        return Ok(0);
    }
    let r: f64 = s.trim().parse().map_err(|_| format!("overcommit ratio {s:?} is not a number (or none)"))?;
    if !r.is_finite() || r <= 0.0 || r > 1000.0 {
        return Err(format!("overcommit ratio {s:?} must be above 0 and at most 1000 (or none)"));
    }
    match (r * 1000.0).round() as u32 {
        0 => Err(format!("overcommit ratio {s:?} is below 0.001")),
        m => Ok(m),
    }
}

/// A placement name or "default" (checked here, applied by the pool).
fn parse_placement_or_default(name: &str) -> std::result::Result<String, String> {
    if name == "default" {
        return Ok(name.to_string());
    }
    parse_placement(name).map(|p| p.name().to_string())
}

fn parse_placement(name: &str) -> std::result::Result<tarn_engine::PlacementKind, String> {
    tarn_engine::PlacementKind::parse(name)
        .ok_or_else(|| format!("unknown placement {name:?}: {}", tarn_engine::PlacementKind::NAMES.join(", ")))
}

#[derive(Args)]
struct RunCmd {
    /// Where the default pool lives.
    #[arg(long, default_value = "tarn-data")]
    data_dir: PathBuf,
    /// Size of the pool file created on first run (sparse).
    #[arg(long, default_value = "32G", value_parser = size::parse_size)]
    pool_size: u64,
    /// Name of the default volume.
    #[arg(long, default_value = "disk0")]
    volume: String,
    /// Size of the default volume created on first run.
    #[arg(long, default_value = "16G", value_parser = size::parse_size)]
    volume_size: u64,
    #[arg(long, default_value = "127.0.0.1:10809")]
    listen: String,
    #[arg(long)]
    strict: bool,
    /// Memory for metadata nodes (default 256M).
    #[arg(long, value_parser = size::parse_size)]
    metadata_cache: Option<u64>,
}

/// glibc gives every thread that allocates its own malloc arena (up to 8
/// per core), and memory freed in one arena is not reused by the others:
/// metadata nodes copied by writers and freed by the committer then grow
/// resident memory far past what is live (the aging benchmark: 352 MiB
/// VmHWM at 3.2 M extents with 8 arenas, 120 MiB at 2.4 M with 2). Two
/// arenas, before any thread starts.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; no thread runs yet.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

fn main() {
    limit_malloc_arenas();
    logging::init();
    let cli = Cli::parse();
    devices::set_ceph(cli.ceph);
    match dispatch(cli.command) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            logging::fatal(&format!("{e:#}"));
            std::process::exit(2);
        }
    }
}

fn dispatch(cmd: Command) -> Result<i32> {
    match cmd {
        Command::Pool(PoolCmd::Create { primary, size, devices, mirror, journal_size, force, no_checksums, start }) => {
            let mut slots = vec![std::iter::once(primary).chain(mirror).collect::<Vec<_>>()];
            for d in &devices {
                slots.push(mirror::parse_member(d).map_err(anyhow::Error::msg)?);
            }
            let opts = CreateOptions { journal_bytes: journal_size, force, no_checksums };
            pool_create(&slots, size, &opts)?;
            if start == StartArg::Middle {
                let opened = poolfile::open_pool(&slots[0][0], &[], OpenOptions::default())?;
                opened.pool.start_allocation_at(tarn_engine::AllocationStart::Middle)?;
                opened.pool.close()?;
            }
            Ok(0)
        }
        Command::Dev(DevCmd::Add { path, size, spare, pool, json }) => {
            let v = members::add(&pool, &path, size, spare)?;
            print(json, &v, members::added);
            Ok(0)
        }
        Command::Dev(DevCmd::Remove { index, rate, cancel, pool, json }) => with_bar(
            &pool,
            &format!("remove device {index}"),
            &Request::DevRemove { index, rate, cancel },
            json,
            members::removed,
        ),
        Command::Dev(DevCmd::Set { index, placement, pool, json }) => {
            let v = admin(&pool, &Request::DevSet { index, placement })?;
            if json {
                print_json(&v);
            } else {
                out(&members::placement_set(&v, index));
            }
            Ok(0)
        }
        Command::Dev(DevCmd::Grow { index, size, pool, json }) => {
            let v = admin(&pool, &Request::DevGrow { index, size })?;
            print(json, &v, members::grown);
            Ok(0)
        }
        Command::Pool(PoolCmd::Replace { old, new, size, rate, pool, json }) => {
            let v = mirror::replace(&pool, &old, &new, size, rate)?;
            print(json, &v, text::replaced);
            Ok(0)
        }
        Command::Pool(PoolCmd::Status { pool, json }) => {
            let v = admin(&pool, &Request::Status)?;
            print(json, &v, text::status);
            Ok(0)
        }
        Command::Pool(PoolCmd::Upgrade { pool }) => pool_upgrade(&pool),
        Command::Pool(PoolCmd::Check { pool, json }) => {
            let mut bar = progress::Progress::counting("check", "extents");
            let result = admin_progress(&pool, &Request::Check, &mut |d, t| bar.update(d, t));
            bar.finish();
            let v = result?;
            print(json, &v, text::check);
            Ok(if v["clean"].as_bool() == Some(true) { 0 } else { 1 })
        }
        Command::Pool(PoolCmd::Scrub(a)) => scrub_cmd(&a, false),
        Command::Pool(PoolCmd::Repair(a)) => scrub_cmd(&a, true),
        Command::Pool(PoolCmd::Compact { volume, rate, pool, json }) => {
            let mut bar = progress::Progress::new("compact");
            let result = admin_progress(&pool, &Request::Compact { volume, rate }, &mut |d, t| bar.update(d, t));
            bar.finish();
            print(json, &result?, text::compacted);
            Ok(0)
        }
        Command::Vol(VolCmd::Create { name, size, placement, quota, force, devices, stripe, parity, pool }) => {
            let placement = placement.map(|p| p.name().to_string());
            let devices = devices.unwrap_or(0);
            let req = Request::VolCreate { name, size, placement, quota, force, devices, stripe, parity };
            let v = admin(&pool, &req)?;
            let (name, size) = text::name_and_size(&v);
            let striped = match text::stripe(&v).as_str() {
                "-" => String::new(),
                s if v["parity"].is_object() => format!(", parity {s}"),
                s => format!(", striped {s}"),
            };
            println!("created volume {name} ({size} thin, placement {}{striped})", text::placement(&v));
            Ok(0)
        }
        Command::Vol(VolCmd::Set { name, placement, quota, devices, pool }) => {
            let v = admin(&pool, &Request::VolSet { name, placement, quota, devices })?;
            println!(
                "volume {}: placement {}, quota {}, devices {}",
                v["name"].as_str().unwrap_or("?"),
                text::placement(&v),
                text::quota(&v),
                text::devices(&v)
            );
            Ok(0)
        }
        Command::Pool(PoolCmd::Set { overcommit, pool, json }) => {
            let v = admin(&pool, &Request::PoolSet { overcommit })?;
            print(json, &v, |v| format!("overcommit limit {}\n", text::overcommit_limit(v)));
            Ok(0)
        }
        Command::Vol(VolCmd::Map { name, args: MapArgs { pool, out, json } }) => {
            if out.wanted() {
                print(json, &picture::vol_map(&pool, &name, &out)?, picture::text);
            } else {
                print(json, &admin(&pool, &Request::VolMap { name })?, text::runs);
            }
            Ok(0)
        }
        Command::Vol(VolCmd::Reclaim { name, dry_run, pool, json }) => {
            let mut bar = progress::Progress::new(&format!("reclaim {name}"));
            let v = admin_progress(&pool, &Request::VolReclaim { name, dry_run }, &mut |d, t| bar.update(d, t));
            bar.finish();
            print(json, &v?, text::reclaim);
            Ok(0)
        }
        Command::Vol(VolCmd::Classify { name, runs, pool, json }) => {
            print(json, &admin(&pool, &Request::VolClassify { name, runs })?, text::classified);
            Ok(0)
        }
        Command::Vol(VolCmd::Hint { name, ranges, metadata_device, pool, json }) => {
            let target = metadata_device.unwrap_or_else(|| "cluster".into());
            vol_hint(&pool, Request::VolHint { name, ranges, target }, json)
        }
        Command::Vol(VolCmd::Unhint { name, ranges, pool, json }) => {
            vol_hint(&pool, Request::VolHint { name, ranges, target: "natural".into() }, json)
        }
        Command::Vol(VolCmd::Export { view, dest, force, pool, json }) => {
            let path = absolute(&dest);
            let req = Request::VolExport { view: view.to_string(), path, force };
            with_bar(&pool, &format!("export {view}"), &req, json, text::image)
        }
        Command::Vol(VolCmd::Import { src, name, format, pool, json }) => vol_import(&pool, &src, name, &format, json),
        Command::Vol(VolCmd::List { pool, json }) => {
            let v = admin(&pool, &Request::VolList)?;
            print(json, &v, text::volumes);
            Ok(0)
        }
        Command::Vol(VolCmd::Resize { name, size, allow_shrink, force, pool }) => {
            let v = admin(&pool, &Request::VolResize { name, size, allow_shrink, force })?;
            let (name, size) = text::name_and_size(&v);
            println!("volume {name} is now {size}");
            Ok(0)
        }
        Command::Vol(VolCmd::Delete { name, recursive, pool }) => snapshots::vol_delete(&pool, name, recursive),
        Command::Vol(VolCmd::Clone { origin, name, force, pool, json }) => {
            snapshots::vol_clone(&pool, origin, name, force, json)
        }
        Command::Vol(VolCmd::Flatten { name, pool }) => snapshots::vol_flatten(&pool, name),
        Command::Fs(cmd) => fs_cmd(cmd),
        Command::Mount {
            name,
            dir,
            commit_interval,
            no_writeback_cache,
            no_discard,
            no_direct_writes,
            session_slice_us,
            fuse_uring,
            readahead,
            write_behind,
            allow_other,
            pool,
        } => {
            if !no_direct_writes {
                devices::use_direct_writes();
            }
            let durability = tarn_fuse::Durability {
                commit_interval: std::time::Duration::from_secs(commit_interval),
                writeback_cache: !no_writeback_cache,
            };
            let transport = tarn_fuse::Transport {
                session_slice: std::time::Duration::from_micros(session_slice_us),
                uring: fuse_uring.into(),
                report: |m| eprintln!("tarn mount: {m}"),
                allow_other,
            };
            mount_cmd(&pool, &name, &dir, durability, transport, (no_discard, readahead, write_behind))
        }
        Command::Snap(cmd) => snapshots::snap(cmd),
        Command::Diff(d) => snapshots::diff(d),
        Command::Serve(s) => serve_cmd(*s),
        Command::Run(r) => run_cmd(r),
        Command::Trace(t) => trace_cmd(t),
        Command::Gen(g) => gen_cmd(g),
        Command::Map(MapArgs { pool, out, json }) => {
            print(json, &picture::pool_map(&pool, &out)?, picture::text);
            Ok(0)
        }
    }
}

/// Completions and manual pages, generated from the clap definition.
fn gen_cmd(g: GenCmd) -> Result<i32> {
    match g {
        GenCmd::Completions { shell } => {
            let mut buf = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "tarn", &mut buf);
            out(&String::from_utf8_lossy(&buf));
        }
        GenCmd::Man { dir: None } => {
            let mut buf = Vec::new();
            // As generate_to renders it: no `help` subcommand listed.
            let cmd = Cli::command().disable_help_subcommand(true);
            clap_mangen::Man::new(cmd).render(&mut buf).context("render the manual page")?;
            out(&String::from_utf8_lossy(&buf));
        }
        GenCmd::Man { dir: Some(dir) } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
            clap_mangen::generate_to(Cli::command(), &dir)
                .with_context(|| format!("write pages to {}", dir.display()))?;
        }
    }
    Ok(0)
}

fn fs_cmd(cmd: FsCmd) -> Result<i32> {
    match cmd {
        FsCmd::Create { name, quota, pool } => {
            admin(&pool, &Request::FsCreate { name: name.clone(), quota: quota.unwrap_or(0) })?;
            println!("created file volume {name}");
        }
        FsCmd::List { pool, json } => print(json, &admin(&pool, &Request::FsList)?, text::file_volumes),
        FsCmd::Destroy { name, pool } => {
            admin(&pool, &Request::FsDestroy { name: name.clone() })?;
            println!("destroyed file volume {name}");
        }
        FsCmd::Check { name, pool, json } => return fs_check(&pool, &name, json),
        FsCmd::Clone { source, new, pool } => {
            let Some((fs, snap)) = source.split_once('@') else {
                bail!("{source:?}: name the snapshot to clone as FS@SNAP");
            };
            let (pool_, lock, fv) = open_file_volume(&pool, fs)?;
            drop(fv);
            tarn_fs::FileVolume::clone_snapshot(pool_.clone(), fs, snap, &new)
                .with_context(|| format!("clone {source} as {new}"))?;
            pool_.close().context("close the pool")?;
            drop(lock);
            println!("cloned {source} as file volume {new}");
        }
        FsCmd::Flatten { name, pool } => {
            let (pool_, lock, fv) = open_file_volume(&pool, &name)?;
            drop(fv);
            let mut bar = progress::Progress::new(&format!("flatten {name}"));
            let flattened = pool_.flatten_file_volume(&name, &mut |d, t| bar.update(d, t));
            bar.finish();
            let members = flattened.with_context(|| format!("flatten file volume {name}"))?;
            pool_.close().context("close the pool")?;
            drop(lock);
            match members {
                0 => println!("file volume {name} is not a clone: nothing to flatten"),
                n => println!("file volume {name} flattened: {n} volumes copied from their origins"),
            }
        }
        FsCmd::Snap(cmd) => return fs_versions::snap(cmd),
        FsCmd::VersionPolicy(cmd) => return fs_versions::policy(cmd),
        FsCmd::LayoutPolicy(cmd) => return fs_layout::layout_policy(cmd),
    }
    Ok(0)
}

/// Open file volume `name` on an offline pool (refused while `tarn serve`
/// holds it): the pool, its lock and the volume.
pub(crate) fn open_file_volume(
    p: &PoolArg,
    name: &str,
) -> Result<(Arc<tarn_engine::Pool>, poolfile::PoolLock, tarn_fs::FileVolume)> {
    open_file_volume_with(p, name, OpenOptions::default())
}

/// `open_file_volume` with the pool opened with `options`.
pub(crate) fn open_file_volume_with(
    p: &PoolArg,
    name: &str,
    options: OpenOptions,
) -> Result<(Arc<tarn_engine::Pool>, poolfile::PoolLock, tarn_fs::FileVolume)> {
    if poolfile::running_server(&p.pool).is_some() {
        bail!(
            "pool {} is held by a running `tarn serve`: stop it first, or \
             serve the file volume from it (`tarn serve --mount NAME:DIR`)",
            p.pool.display()
        );
    }
    let (pool, lock) = poolfile::open_pool(&p.pool, &p.devices, options)?.into_parts();
    let pool = Arc::new(pool);
    let fv = tarn_fs::FileVolume::open(pool.clone(), name).with_context(|| format!("open file volume {name}"))?;
    Ok((pool, lock, fv))
}

fn fs_check(p: &PoolArg, name: &str, json: bool) -> Result<i32> {
    let (pool, lock, fv) = open_file_volume(p, name)?;
    let r = fv.check().with_context(|| format!("check file volume {name}"))?;
    drop(fv);
    pool.close().context("close the pool")?;
    drop(lock);
    let v = serde_json::json!({
        "name": name, "inodes": r.inodes, "directories": r.directories,
        "problems": r.problems, "more_problems": r.more_problems,
    });
    print(json, &v, |v| {
        let mut s = format!("{}: {} inodes, {} directories", v["name"], v["inodes"], v["directories"]);
        match v["problems"].as_array() {
            Some(list) if !list.is_empty() => list.iter().for_each(|p| s.push_str(&format!("\n  {p}"))),
            _ => s.push_str(", clean"),
        }
        s + "\n"
    });
    Ok(if r.problems.is_empty() { 0 } else { 1 })
}

/// `tarn mount`: the pool must be offline; this process holds it until
/// the mount is gone (`fusermount3 -u DIR` or `umount DIR`), then
/// commits and closes it.
fn mount_cmd(
    p: &PoolArg,
    name: &str,
    dir: &Path,
    durability: tarn_fuse::Durability,
    transport: tarn_fuse::Transport,
    (no_discard, readahead, write_behind): (bool, u64, u64),
) -> Result<i32> {
    tarn_fuse::check_transport(&transport).with_context(|| format!("mount on {}", dir.display()))?;
    let options = OpenOptions { no_discard, ..Default::default() };
    let (pool, lock, mut fv) = fs_versions::open_for_mount(p, name, options)?;
    fv.start_readahead(readahead);
    let bound = usize::try_from(write_behind).context("--write-behind")?;
    fv.start_write_behind(bound).context("start the write-behind thread")?;
    eprintln!("mounted file volume {name} on {}; unmount with `fusermount3 -u {}`", dir.display(), dir.display());
    unmount_on_signal(dir)?;
    let served =
        tarn_fuse::mount(fv, name, dir, durability, transport).with_context(|| format!("mount on {}", dir.display()));
    let closed = pool.close().context("commit and close the pool");
    drop(lock);
    served?;
    closed?;
    Ok(0)
}

/// SIGTERM or SIGINT unmounts, so the session ends as by `fusermount3 -u`
/// (pending changes committed, the pool closed) instead of leaving a dead
/// mount behind.
fn unmount_on_signal(dir: &Path) -> Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT]).context("install signal handlers")?;
    let dir = dir.to_path_buf();
    std::thread::spawn(move || {
        // Each signal tries once more (the first may come while busy).
        for sig in signals.forever() {
            log::info!("signal {sig}: unmounting {}", dir.display());
            match std::process::Command::new("fusermount3").arg("-u").arg(&dir).status() {
                Ok(s) if s.success() => {}
                other => eprintln!("tarn: fusermount3 -u {}: {other:?}", dir.display()),
            }
        }
    });
    Ok(())
}

fn trace_cmd(t: TraceSub) -> Result<i32> {
    match t {
        TraceSub::Print { file, limit } => out(&trace::text(&trace::load(&file)?, limit)),
        TraceSub::Convert { input, output, export } => {
            let text = std::fs::read_to_string(&input).with_context(|| format!("read {}", input.display()))?;
            let records = trace::blkparse::convert(&text, export.as_deref())?;
            trace::save(&output, &records)?;
            let n = records.iter().filter(|r| matches!(r, tarn_format::trace::TraceRecord::Request { .. })).count();
            println!("{}: {n} requests", output.display());
        }
        TraceSub::Replay {
            file,
            placement,
            pool_size,
            dir,
            keep,
            snapshot_every,
            region,
            region_start,
            files,
            json,
        } => {
            let snapshot_every_ns = match snapshot_every {
                Some(s) if !(s > 0.0 && s.is_finite()) => bail!("--snapshot-every {s}: a positive number of seconds"),
                s => s.map(|s| (s * 1e9) as u64),
            };
            let dir = dir.join(format!("tarn-replay-{}", std::process::id()));
            let files = match files {
                Some(p) => serde_json::from_slice(&std::fs::read(&p).with_context(|| format!("read {}", p.display()))?)
                    .with_context(|| format!("file list {}", p.display()))?,
                None => Vec::new(),
            };
            let random_region_start = region_start == config::RegionStart::Random;
            let opts = trace::replay::ReplayOptions {
                placement,
                pool_size,
                dir,
                keep,
                snapshot_every_ns,
                region,
                random_region_start,
                files,
            };
            let v = trace::replay::replay(&trace::load(&file)?, &opts)?;
            if !keep {
                let _ = std::fs::remove_dir(&opts.dir);
            }
            print(json, &v, text::replay);
        }
    }
    Ok(0)
}

fn scrub_cmd(a: &ScrubArgs, repair: bool) -> Result<i32> {
    let mut bar = progress::Progress::new(if repair { "repair" } else { "scrub" });
    let req = Request::Scrub { rate: a.rate, repair };
    let result = admin_progress(&a.pool, &req, &mut |d, t| bar.update(d, t));
    bar.finish();
    let v = result?;
    print(a.json, &v, text::scrub);
    Ok(if v["lost_blocks"].as_u64() == Some(0) { 0 } else { 1 })
}

fn print(json: bool, v: &Value, render: fn(&Value) -> String) {
    if json {
        print_json(v);
    } else {
        out(&render(v));
    }
}

fn print_json(v: &Value) {
    out(&format!("{}\n", serde_json::to_string_pretty(v).unwrap_or_default()));
}

/// Write a command's answer to stdout. A reader that went away
/// (`tarn vol list | head`) ends the command quietly, as it ends other
/// Unix tools, instead of the panic `print!` gives (the work is done by
/// then; SIGPIPE stays ignored so a control socket's peer going away is
/// an error, not a kill).
fn out(s: &str) {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_all(s.as_bytes()).and_then(|()| o.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("tarn: error: writing the answer: {e}");
        std::process::exit(2);
    }
}

/// Run an admin request through a running server, or on the pool directly.
fn admin(p: &PoolArg, req: &Request) -> Result<Value> {
    admin_progress(p, req, &mut |_, _| {})
}

/// `admin` for a long request: `progress(done, total)` as it goes.
fn vol_hint(pool: &PoolArg, req: Request, json: bool) -> Result<i32> {
    with_bar(pool, "move metadata", &req, json, text::hinted)
}

/// Run a long request with a progress bar, then print its answer.
fn with_bar(pool: &PoolArg, what: &str, req: &Request, json: bool, show: fn(&Value) -> String) -> Result<i32> {
    let mut bar = progress::Progress::new(what);
    let v = admin_progress(pool, req, &mut |d, t| bar.update(d, t));
    bar.finish();
    print(json, &v?, show);
    Ok(0)
}

/// `tarn vol import`: images qemu reads in another format are converted
/// to a sparse raw file beside the temporary directory's others first.
fn vol_import(pool: &PoolArg, src: &std::path::Path, name: String, format: &str, json: bool) -> Result<i32> {
    let names = admin(pool, &Request::VolList)?;
    if names.as_array().is_some_and(|a| a.iter().any(|v| v["name"] == name.as_str())) {
        bail!("volume {name} already exists");
    }
    let path = absolute(src);
    let foreign = if format == "auto" { image::foreign_format(src).map_err(anyhow::Error::msg)? } else { None };
    let Some(kind) = foreign else {
        return with_bar(
            pool,
            &format!("import {name}"),
            &Request::VolImport { path, name, source: None },
            json,
            text::image,
        );
    };
    let raw = image::convert_to_raw(src, kind).map_err(anyhow::Error::msg)?;
    let req = Request::VolImport { path: raw.path().to_string(), name: name.clone(), source: Some(path) };
    with_bar(pool, &format!("import {name} ({kind})"), &req, json, text::image)
}

/// `OFFSET:LENGTH` in bytes, each with an optional K/M/G suffix.
fn parse_byte_range(s: &str) -> Result<(u64, u64), String> {
    let (off, len) = s.split_once(':').ok_or_else(|| format!("{s}: want OFFSET:LENGTH"))?;
    let (off, len) = (size::parse_size(off)?, size::parse_size(len)?);
    if len == 0 {
        return Err(format!("{s}: empty range"));
    }
    Ok((off, len))
}

fn admin_progress(p: &PoolArg, req: &Request, progress: &mut dyn FnMut(u64, u64)) -> Result<Value> {
    if let Some(sock) = poolfile::running_server(&p.pool) {
        return control::call(&sock, req, progress);
    }
    let opened =
        poolfile::open_pool(&p.pool, &p.devices, OpenOptions { read_only: !req.writes(), ..Default::default() })?;
    let mut ctx = Ctx { progress, clients: None, abandoned: &|| false };
    let result = admin::execute(&opened.pool, req, &mut ctx).map_err(anyhow::Error::msg);
    if req.writes() {
        opened.pool.close().context("commit")?;
    }
    result
}

/// `slots[0]` is the primary (with its mirror legs, if any).
fn pool_create(slots: &[Vec<PathBuf>], size: Option<u64>, opts: &CreateOptions) -> Result<()> {
    let all: Vec<String> = slots.iter().flatten().map(|p| absolute(p)).collect();
    if let Some(dup) = all.iter().enumerate().find(|(i, p)| all[..*i].contains(p)) {
        bail!("{} is named twice: every device and mirror leg must be a different device", dup.1);
    }
    let mut devices: Vec<Vec<(Arc<dyn Device>, String)>> = Vec::new();
    for slot in slots {
        let mut legs = Vec::new();
        for path in slot {
            legs.push((devices::open_or_create(path, size)?, absolute(path)));
        }
        devices.push(legs);
    }
    create_mirrored_pool(&devices, opts)?;
    let total: u64 = devices.iter().map(|s| s.iter().map(|d| d.0.size()).min().unwrap_or(0)).sum();
    let mirrors = slots.iter().filter(|s| s.len() > 1).count();
    let mirrored = if mirrors > 0 { format!(", {mirrors} mirrored") } else { String::new() };
    println!("created pool on {} ({} device(s){mirrored}, {})", slots[0][0].display(), slots.len(), size::human(total));
    Ok(())
}

/// `--metadata-cache` in bytes (0: the engine's default).
fn cache_bytes(size: Option<u64>) -> Result<usize> {
    let Some(bytes) = size else { return Ok(0) };
    let min = tarn_engine::MIN_METADATA_CACHE as u64;
    if bytes < min {
        bail!("--metadata-cache {bytes} is too small: one path from root to leaf needs {min} bytes");
    }
    usize::try_from(bytes).context("--metadata-cache does not fit in memory")
}

/// `tarn pool upgrade`: open a format 1 pool for conversion, write it in
/// the current format (the superblock flips last), close it.
fn pool_upgrade(p: &PoolArg) -> Result<i32> {
    if poolfile::running_server(&p.pool).is_some() {
        bail!("pool {} is being served: stop the server before upgrading", p.pool.display());
    }
    let options = OpenOptions { upgrade: true, ..Default::default() };
    let opened = poolfile::open_pool(&p.pool, &p.devices, options)?;
    let from = opened.pool.format_version();
    if from == tarn_engine::FORMAT_VERSION {
        println!("pool {} is already in format {from}", p.pool.display());
        return Ok(0);
    }
    opened.pool.close().context("write the pool in the new format")?;
    println!("upgraded pool {} from format {from} to {}", p.pool.display(), tarn_engine::FORMAT_VERSION);
    Ok(0)
}

fn absolute(p: &Path) -> String {
    if devices::is_rados(p) {
        return p.display().to_string();
    }
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()).display().to_string()
}

fn serve_cmd(s: ServeCmd) -> Result<i32> {
    // Everything is checked before anything starts: a bad file or flag
    // is exit 2 with nothing opened.
    let resolved = config::resolve(s.opts, s.config)?;
    logging::set_level(resolved.opts.log_level);
    let args = serve_args(&resolved.opts)?;
    serve::serve(args, Some(resolved), |addr| {
        if let Some(a) = addr {
            logging::notice(&format!("listening on nbd://{a}/"));
        }
    })?;
    Ok(0)
}

/// The merged options, defaults filled in.
fn serve_args(o: &config::ServeOpts) -> Result<serve::ServeArgs> {
    let commit_interval = o.commit_interval.unwrap_or(config::DEFAULT_COMMIT_INTERVAL);
    let compact_idle = o.compact_idle.unwrap_or(config::DEFAULT_COMPACT_IDLE);
    Ok(serve::ServeArgs {
        pool: o.pool.clone().context("no pool")?,
        members: o.devices.clone(),
        listen: (o.no_tcp != Some(true)).then(|| o.listen.clone().unwrap_or_else(|| config::DEFAULT_LISTEN.into())),
        socket: o.socket.clone(),
        strict: o.strict == Some(true),
        metadata_cache: cache_bytes(o.metadata_cache.map(|s| s.0))?,
        placement: o.placement.map(|p| p.0).unwrap_or_default(),
        region_blocks: region_blocks(o.region_size.map(|s| s.0))?,
        random_region_start: o.region_start == Some(config::RegionStart::Random),
        expansion: expansion(o)?,
        commit_interval: Duration::from_secs(commit_interval.max(1)),
        compact_idle: (compact_idle > 0).then(|| Duration::from_secs(compact_idle)),
        compact_at: o.compact_at.filter(|&n| n > 0),
        tls: tls::config(o)?,
        socket_mode: o.socket_mode.map_or(0o600, |m| m.0),
        trace: o.trace.clone(),
        metrics: o.metrics.clone(),
        metadata_device: o.metadata_device.clone(),
        takeover: o.takeover == Some(true),
        lock_wait: Duration::from_secs(o.lock_wait.unwrap_or(if o.takeover == Some(true) { 120 } else { 0 })),
        alerts: alerts::AlertConfig {
            thresholds: match &o.alert_at {
                Some(s) => alerts::parse_thresholds(s).map_err(|e| anyhow::anyhow!("--alert-at {s}: {e}"))?,
                None => alerts::DEFAULT_THRESHOLDS.to_vec(),
            },
            exec: o.alert_exec.clone(),
        },
        mount: o.mount.as_deref().map(config::mount_spec).transpose()?,
    })
}

/// `--stripe N[:UNIT]`: members and unit bytes (default 64 KiB). The
/// engine checks both against the pool (power of two, 4K to 64M, N from
/// 2 to the usable members).
fn parse_stripe(s: &str) -> Result<(u32, u64), String> {
    let (n, unit) = match s.split_once(':') {
        Some((n, u)) => (n, size::parse_size(u)?),
        None => (s, tarn_engine::DEFAULT_STRIPE_UNIT),
    };
    let n: u32 = n.parse().map_err(|_| format!("{n:?} is not a member count (say --stripe 4 or --stripe 4:64K)"))?;
    Ok((n, unit))
}

/// `--parity N[:UNIT]`: data members and unit bytes (default 16 KiB).
/// The engine checks both against the pool (power of two, 4K to 64K, N
/// from 2, N+1 usable members).
fn parse_parity(s: &str) -> Result<(u32, u64), String> {
    let (n, unit) = match s.split_once(':') {
        Some((n, u)) => (n, size::parse_size(u)?),
        None => (s, tarn_engine::DEFAULT_PARITY_UNIT),
    };
    let n: u32 =
        n.parse().map_err(|_| format!("{n:?} is not a data member count (say --parity 3 or --parity 3:16K)"))?;
    Ok((n, unit))
}

/// `--expand-*`: the expansion policy, checked (None without --expand-at).
fn expansion(o: &config::ServeOpts) -> Result<Option<tarn_engine::Expansion>> {
    let Some(at_percent) = o.expand_at else {
        if o.expand_step.is_some() || o.expand_max.is_some() || o.expand_device.is_some() {
            bail!("--expand-step, --expand-max and --expand-device need --expand-at");
        }
        return Ok(None);
    };
    let Some(max) = o.expand_max else { bail!("--expand-at needs --expand-max (the grown member's largest size)") };
    let e = tarn_engine::Expansion {
        at_percent,
        step: o.expand_step.map_or(1 << 30, |s| s.0),
        max: max.0,
        device: o.expand_device.unwrap_or(0),
    };
    e.check().map_err(anyhow::Error::msg)?;
    Ok(Some(e))
}

/// `pool create --start`.
/// `tarn mount --fuse-uring`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum FuseUring {
    Auto,
    On,
    Off,
}

impl From<FuseUring> for tarn_fuse::UringMode {
    fn from(f: FuseUring) -> Self {
        match f {
            FuseUring::Auto => tarn_fuse::UringMode::Auto,
            FuseUring::On => tarn_fuse::UringMode::On,
            FuseUring::Off => tarn_fuse::UringMode::Off,
        }
    }
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum StartArg {
    Front,
    Middle,
}

/// `--region-size` in blocks (0: not given); the engine checks it against
/// the devices at open.
fn region_blocks(bytes: Option<u64>) -> Result<u64> {
    let Some(bytes) = bytes else { return Ok(0) };
    if bytes % tarn_format::BLOCK_SIZE != 0 {
        bail!("--region-size {bytes}: a region is a whole number of 4 KiB blocks (a power of two from 4K to 64M)");
    }
    Ok(bytes / tarn_format::BLOCK_SIZE)
}

fn run_cmd(r: RunCmd) -> Result<i32> {
    std::fs::create_dir_all(&r.data_dir).with_context(|| format!("create {}", r.data_dir.display()))?;
    let pool = r.data_dir.join("pool.img");
    if !pool.exists() {
        pool_create(&[vec![pool.clone()]], Some(r.pool_size), &CreateOptions::default())?;
    }
    let pa = PoolArg { pool: pool.clone(), devices: vec![] };
    let vols = admin(&pa, &Request::VolList)?;
    let exists = vols.as_array().is_some_and(|a| a.iter().any(|v| v["name"] == r.volume.as_str()));
    if !exists {
        let req = Request::VolCreate {
            name: r.volume.clone(),
            size: r.volume_size,
            placement: None,
            quota: None,
            force: false,
            devices: 0,
            stripe: None,
            parity: None,
        };
        admin(&pa, &req)?;
        println!("created volume {} ({} thin)", r.volume, size::human(r.volume_size));
    }
    let socket = std::path::absolute(r.data_dir.join("nbd.sock"))?;
    let args = serve::ServeArgs {
        pool,
        members: vec![],
        listen: Some(r.listen),
        socket: Some(socket.clone()),
        strict: r.strict,
        metadata_cache: cache_bytes(r.metadata_cache)?,
        placement: Default::default(),
        region_blocks: 0,
        random_region_start: false,
        expansion: None,
        commit_interval: Duration::from_secs(5),
        compact_idle: tarn_engine::ServiceOptions::default().compact_idle,
        compact_at: None,
        tls: None,
        socket_mode: 0o600,
        trace: None,
        metrics: None,
        metadata_device: None,
        takeover: false,
        lock_wait: Duration::ZERO,
        alerts: Default::default(),
        mount: None,
    };
    let volume = r.volume;
    serve::serve(args, None, move |addr| {
        if let Some(a) = addr {
            println!("{}", text::connect_hints(&a.to_string(), &volume, &socket));
        }
    })?;
    Ok(0)
}
