//! What the agent keeps on disk: the checkpoint, and the atomic writer it
//! shares with `install-cni`.

pub mod atomic;
pub mod checkpoint;
