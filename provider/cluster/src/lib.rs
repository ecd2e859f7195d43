//! The `cluster` provider: the agent learns its ENIs from its node's
//! NetResourceSet and writes their use to its status. (Being built.)
