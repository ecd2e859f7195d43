//! What the agent keeps on disk: the checkpoint (written with
//! `enim_core::atomic_file`, as `install-cni` writes its files).

pub mod checkpoint;
