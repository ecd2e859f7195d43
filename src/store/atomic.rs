//! The atomic file writer lives in the crate every part of enim shares
//! (the providers' caches use it too); it is reached here under its old
//! name.

pub use enim_provider::atomic_file::*;
