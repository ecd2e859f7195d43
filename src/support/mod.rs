//! Small parts both drivers and the engine use: per-key locks, the
//! exclusion list, the metadata refusal, and the crash points of the
//! fault-injection build.

pub mod exclusion;
pub mod fault;
pub(crate) mod keylock;
pub mod metadata;
