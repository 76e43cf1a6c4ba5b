//! Gleaner's Linux side: raw readers of `/proc` and `/sys`, CPU placement back ends
//! (cgroup v2/v1 cpusets, per-thread affinity) and the crash-recovery journal.
//!
//! Every reader and writer takes a root path (`ProcFs::new("/proc")`, `SysFs::new("/sys")`,
//! cgroup mount points), so the tests run against fake trees in temp dirs and nothing here
//! assumes the machine it runs on. Readers only read; decisions live in `gleaner-policy`.

pub mod affinity;
pub mod cgroup;
pub mod cgroupfs;
pub mod controller;
pub mod error;
pub mod idle_entries;
pub mod journal;
pub mod pacer;
pub mod pmqos;
pub mod procfs;
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
