//! The ENI-id cache: BCE's instance metadata names no ENI ids (they come
//! from the OpenAPI, matched by MAC), so the ids of the ENIs attached here
//! are kept in a file for a start while that API is down.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use enim_provider::{Eni, MacAddr};

/// One attached ENI as the id cache keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct KnownEni {
    pub(crate) id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) device_index: Option<u32>,
}

/// MAC to ENI id (and device index) of the ENIs attached here, in a JSON
/// file written whole (temp file, rename) whenever it changes. Losing it
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

    fn write(&self, known: &BTreeMap<MacAddr, KnownEni>) -> std::io::Result<()> {
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = self.path.with_extension("tmp");
        std::fs::write(
            &tmp,
            serde_json::to_vec(known).map_err(std::io::Error::other)?,
        )?;
        std::fs::rename(&tmp, &self.path)
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
