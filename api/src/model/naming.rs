//! Names enim gives the host ends of the veth pairs it makes (secondary
//! mode's pod veths, primary mode's host paths): a prefix and a stable hash
//! of the attachment key, 15 bytes in all, so GC can tell from a name alone
//! that a veth is enim's and recompute it from a record. Also the CNI
//! spec's pattern for the names in that key (container ids, networks),
//! which the plugin and `enimd install-cni` both check.

use super::AttachmentKey;

/// The kernel's IFNAMSIZ: names are at most 15 bytes plus the NUL.
pub const IFNAMSIZ: usize = 16;

/// The longest prefix a veth name may have (the rest is at least 8 hex
/// digits of the hash).
pub const MAX_VETH_PREFIX: usize = 7;

/// The host end of `key`'s veth under `prefix`.
pub fn veth_name(prefix: &str, key: &AttachmentKey) -> String {
    let digits = IFNAMSIZ - 1 - prefix.len();
    let hash = fnv1a64(&[&key.network, &key.container_id, &key.ifname]);
    let hex = format!("{hash:016x}");
    format!("{prefix}{}", &hex[..digits])
}

/// Whether `name` has the shape of a veth named under `prefix`.
pub fn is_veth_name(prefix: &str, name: &str) -> bool {
    name.len() == IFNAMSIZ - 1
        && name.strip_prefix(prefix).is_some_and(|rest| {
            rest.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}

/// The spec's container id pattern, `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`.
pub fn valid_container_id(id: &str) -> bool {
    let mut chars = id.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphanumeric() => {}
        _ => return false,
    }
    chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// Whether `prefix` can start veth names: 1 to [`MAX_VETH_PREFIX`] of
/// `[a-z0-9-]`.
pub fn valid_veth_prefix(prefix: &str) -> bool {
    name_chars_ok(prefix) && prefix.len() <= MAX_VETH_PREFIX
}

/// Non-empty and only `[a-z0-9-]`.
pub fn name_chars_ok(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// FNV-1a over the parts, NUL-separated: stable across builds and
/// platforms, unlike std's hasher.
fn fnv1a64(parts: &[&str]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, part) in parts.iter().enumerate() {
        let sep: &[u8] = if i == 0 { b"" } else { b"\0" };
        for b in sep.iter().chain(part.as_bytes()) {
            hash ^= u64::from(*b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}
