//! The last spec seen, on disk: an agent restarted while the API server is
//! unreachable serves the ENIs it had. Written whole and atomically
//! (temporary file, then rename); a file that does not parse, or names
//! another node, is reported and ignored, and the watch writes it again.

use std::path::Path;

use enim_core::atomic_file::{self, Durability};
use serde::{Deserialize, Serialize};

use crate::state::SeenSpec;
use crate::ClusterError;

/// The file's format version; another one is ignored like a corrupt file.
const VERSION: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CacheFile {
    version: u32,
    node: String,
    #[serde(flatten)]
    seen: SeenSpec,
}

/// The cached spec of `node`: `Ok(None)` without a file, `Err` for a file
/// that cannot be used (the caller logs it and carries on without).
pub fn load(path: &Path, node: &str) -> Result<Option<SeenSpec>, ClusterError> {
    let bad = |why: String| ClusterError::Cache {
        path: path.to_path_buf(),
        why,
    };
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(bad(format!("unreadable: {e}"))),
    };
    let file: CacheFile =
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("corrupt: {e}")))?;
    if file.version != VERSION {
        return Err(bad(format!(
            "format version {} (this agent reads {VERSION})",
            file.version
        )));
    }
    if file.node != node {
        return Err(bad(format!(
            "holds node {:?}'s spec, not {node:?}",
            file.node
        )));
    }
    Ok(Some(file.seen))
}

/// Writes `seen` as `node`'s cached spec.
pub fn save(path: &Path, node: &str, seen: &SeenSpec) -> Result<(), ClusterError> {
    let file = CacheFile {
        version: VERSION,
        node: node.to_string(),
        seen: seen.clone(),
    };
    let bytes = serde_json::to_vec_pretty(&file).map_err(|e| ClusterError::Cache {
        path: path.to_path_buf(),
        why: format!("serialising: {e}"),
    })?;
    // fsync both: after a power cut the agent must not come back to an
    // empty file (it would then wait for the API server to serve at all).
    atomic_file::replace(path, 0o600, Durability::FULL, &bytes).map_err(|e| ClusterError::Cache {
        path: path.to_path_buf(),
        why: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use enim_crd::NetResourceSetSpec;

    fn seen() -> SeenSpec {
        SeenSpec {
            generation: Some(3),
            spec: NetResourceSetSpec {
                draining: vec!["eni-9".into()],
                ..Default::default()
            },
        }
    }

    #[test]
    fn round_trips_and_refuses_what_it_cannot_use() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/nrs.json");
        assert!(load(&path, "n1").unwrap().is_none(), "no file: nothing");
        save(&path, "n1", &seen()).unwrap();
        assert_eq!(load(&path, "n1").unwrap(), Some(seen()));
        let other = load(&path, "n2").unwrap_err().to_string();
        assert!(
            other.contains("\"n1\"") && other.contains("\"n2\""),
            "{other}"
        );
        std::fs::write(&path, b"{\"version\": 1, \"node\": ").unwrap();
        let corrupt = load(&path, "n1").unwrap_err().to_string();
        assert!(
            corrupt.contains("corrupt") && corrupt.contains("nrs.json"),
            "{corrupt}"
        );
        save(&path, "n1", &seen()).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("\"version\": 1", "\"version\": 7")).unwrap();
        let version = load(&path, "n1").unwrap_err().to_string();
        assert!(version.contains("version 7"), "{version}");
    }
}
