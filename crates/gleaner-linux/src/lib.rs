//! Gleaner's Linux side: raw readers of `/proc` and `/sys`, CPU placement back ends
//! (cgroup v2/v1 cpusets, per-thread affinity) and the crash-recovery journal.
//!
//! Every reader and writer takes a root path (`ProcFs::new("/proc")`, `SysFs::new("/sys")`,
//! cgroup mount points), so the tests run against fake trees in temp dirs and nothing here
//! assumes the machine it runs on. Readers only read; decisions live in `gleaner-policy`.
//!
//! Layers, each using only those above it (no import cycle among the files):
//! * files and calls: `error`, `procfs`, `sysfs` and `cgroupfs` (the only parsers of kernel
//!   files), `affinity` (the affinity calls behind a trait; raw calls are in `gleaner-sys`);
//! * `journal` records changes, `restore` undoes them;
//! * acting: `cgroup` (placement back ends), `retention` (yielding threads), `pmqos` (polling);
//! * measuring and control: `idle_entries`, `wakeprobe`, `sampler`, `progress` (the
//!   application's own counter), `pacer`, `controller`,
//!   `status`.

pub mod affinity;
pub mod bpf;
pub mod cgroup;
pub mod cgroupfs;
pub mod controller;
pub mod error;
pub mod idle_entries;
pub mod journal;
pub mod pacer;
pub mod pmqos;
pub mod procfs;
pub mod progress;
pub mod restore;
pub mod retention;
pub mod sampler;
pub mod status;
pub mod sysfs;
pub mod wakeprobe;

pub use cgroup::{detect, Detection, Placement, PlacementEnv, PlacementKind};
pub use error::{Error, Result};
pub use journal::{Journal, SharedJournal, UndoAction};
pub use procfs::ProcFs;
pub use sysfs::SysFs;
