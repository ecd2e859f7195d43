//! Secondary mode: ENIs stay in the host, pods get their secondary IPs over
//! veth pairs, and per-ENI policy routing sends each pod's traffic out of
//! its own ENI.

pub mod datastore;
