//! The ENI-id cache: BCE's instance metadata names no ENI ids (they come
//! from the OpenAPI, matched by MAC), so the ids of the ENIs attached here
//! are kept in a file for a start while that API is down.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use enim_core::atomic_file::{self, Durability, FileError};
use enim_core::sync::lock;
use enim_core::{Eni, MacAddr};

/// One attached ENI as the id cache keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct KnownEni {
    pub(crate) id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) device_index: Option<u32>,
}

/// MAC to ENI id (and device index) of the ENIs attached here, in a JSON
/// file written whole (atomically, see [`atomic_file`]) whenever it changes. Losing it
/// costs nothing but serving through an outage at start.
pub struct IdCache {
    path: PathBuf,
    known: Mutex<BTreeMap<MacAddr, KnownEni>>,
}

impl IdCache {
    /// The cache at `path`; an unreadable or absent file starts it empty.
    pub fn open(path: PathBuf) -> IdCache {
        let known = match std::fs::read(&path) {
            Ok(raw) => serde_json::from_slice(&raw).unwrap_or_else(|e| {
                tracing::warn!(path = %path.display(), error = %e, "unreadable ENI id cache ignored");
                BTreeMap::new()
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "ENI id cache unreadable; starting without it");
                BTreeMap::new()
            }
        };
        IdCache {
            path,
            known: Mutex::new(known),
        }
    }

    pub(crate) fn get(&self, mac: &MacAddr) -> Option<KnownEni> {
        lock(&self.known).get(mac).cloned()
    }

    /// Records `enis` as what is attached (`replace`: and nothing else).
    pub(crate) fn record(&self, enis: &[Eni], replace: bool) {
        let mut known = lock(&self.known);
        let mut next = if replace {
            BTreeMap::new()
        } else {
            known.clone()
        };
        for e in enis {
            next.insert(
                e.mac,
                KnownEni {
                    id: e.id.clone(),
                    device_index: e.device_index,
                },
            );
        }
        if next == *known {
            return;
        }
        *known = next;
        if let Err(e) = self.write(&known) {
            tracing::warn!(path = %self.path.display(), error = %e, "writing the ENI id cache failed");
        }
    }

    fn write(&self, known: &BTreeMap<MacAddr, KnownEni>) -> Result<(), FileError> {
        let bytes = serde_json::to_vec(known).map_err(|e| FileError {
            what: "encoding",
            path: self.path.clone(),
            source: std::io::Error::other(e),
        })?;
        // Durable: the cache is read at a start when the API is down, which
        // may be the boot after a power cut.
        atomic_file::replace(&self.path, 0o600, Durability::FULL, &bytes)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn eni(id: &str, mac: &str, device_index: u32) -> Eni {
        Eni {
            id: id.into(),
            mac: mac.parse().unwrap(),
            ipv4: "10.0.1.10/24".parse().unwrap(),
            gateway4: "10.0.1.1".parse().unwrap(),
            ipv6: None,
            gateway6: None,
            mtu: None,
            owner: None,
            device_index: Some(device_index),
            secondary_ips: Vec::new(),
            placement: Default::default(),
        }
    }

    #[test]
    fn survives_a_reopen_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("bce-eni-ids.json");
        let a = eni("eni-a", "fa:f6:00:00:00:0a", 1);
        let b = eni("eni-b", "fa:f6:00:00:00:0b", 2);
        let cache = IdCache::open(path.clone());
        cache.record(&[a.clone(), b.clone()], true);
        // A later listing with only `b` replaces the record.
        cache.record(std::slice::from_ref(&b), true);

        let again = IdCache::open(path.clone());
        assert_eq!(again.get(&a.mac), None);
        assert_eq!(
            again.get(&b.mac),
            Some(KnownEni {
                id: "eni-b".into(),
                device_index: Some(2)
            })
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["bce-eni-ids.json"], "a temporary file was left");
    }

    #[test]
    fn a_corrupt_file_starts_empty_and_is_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bce-eni-ids.json");
        std::fs::write(&path, b"{not json").unwrap();
        let cache = IdCache::open(path.clone());
        let a = eni("eni-a", "fa:f6:00:00:00:0a", 1);
        assert_eq!(cache.get(&a.mac), None);
        cache.record(std::slice::from_ref(&a), false);
        assert_eq!(
            IdCache::open(path).get(&a.mac).map(|k| k.id),
            Some("eni-a".into())
        );
    }
}
