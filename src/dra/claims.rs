//! The prepared claims: claim → ENI, on disk before the kubelet hears
//! "prepared", so that an enimd restarted between prepare and ADD still
//! knows which ENI the pod claimed.
//!
//! One small JSON file, rewritten whole and atomically (fsynced) on every
//! change. A file that does not parse stops enimd with an error naming it,
//! and is left as it is: guessing would hand a claimed ENI to another pod.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use enim_core::atomic_file::{self, Durability};
use serde::{Deserialize, Serialize};

use super::DraError;

/// One claim as it was prepared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedClaim {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// This driver's devices in the claim's allocation, in its order.
    pub devices: Vec<PreparedDevice>,
    /// The uids of the pods the claim is reserved for.
    pub pods: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedDevice {
    /// The claim's request this device serves.
    pub request: String,
    /// The device's name in the ResourceSlice.
    pub device: String,
    /// The ENI it stands for.
    pub eni_id: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    /// Claim uid → claim.
    claims: BTreeMap<String, PreparedClaim>,
}

/// The table, and the file that keeps it.
pub struct Claims {
    path: PathBuf,
    table: Mutex<BTreeMap<String, PreparedClaim>>,
}

impl Claims {
    /// Loads `path`; a missing file is an empty table.
    pub fn open(path: &Path) -> Result<Claims, DraError> {
        let table = match std::fs::read(path) {
            Ok(bytes) => {
                serde_json::from_slice::<File>(&bytes)
                    .map_err(|e| DraError::CorruptClaims {
                        path: path.to_path_buf(),
                        reason: format!(
                            "{e}; left as it is: move it away only once no pod on this node \
                             holds a claimed ENI"
                        ),
                    })?
                    .claims
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(atomic_file::FileError::at("reading", path)(e).into()),
        };
        Ok(Claims {
            path: path.to_path_buf(),
            table: Mutex::new(table),
        })
    }

    fn table(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, PreparedClaim>> {
        // Every change is one insert or remove: a poisoned lock is sound.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, uid: &str) -> Option<PreparedClaim> {
        self.table().get(uid).cloned()
    }

    pub fn all(&self) -> Vec<PreparedClaim> {
        self.table().values().cloned().collect()
    }

    /// Records `claim`, on disk before this returns. On a failed write the
    /// table is as it was.
    pub fn record(&self, claim: PreparedClaim) -> Result<(), DraError> {
        let mut table = self.table();
        let old = table.insert(claim.uid.clone(), claim.clone());
        if let Err(e) = self.write(&table) {
            match old {
                Some(old) => table.insert(claim.uid, old),
                None => table.remove(&claim.uid),
            };
            return Err(e);
        }
        Ok(())
    }

    /// Drops the claim `uid`; `None` when it was not recorded.
    pub fn forget(&self, uid: &str) -> Result<Option<PreparedClaim>, DraError> {
        let mut table = self.table();
        let Some(old) = table.remove(uid) else {
            return Ok(None);
        };
        if let Err(e) = self.write(&table) {
            table.insert(uid.to_string(), old);
            return Err(e);
        }
        Ok(Some(old))
    }

    /// Adds `pod_uid` to the pods of claim `claim_uid` (reserved for it
    /// since the prepare), on disk before this returns. Nothing changes
    /// when the claim is not recorded or already lists the pod, or when the
    /// write fails.
    pub fn add_pod(&self, claim_uid: &str, pod_uid: &str) -> Result<(), DraError> {
        let mut table = self.table();
        let Some(claim) = table.get_mut(claim_uid) else {
            return Ok(());
        };
        if claim.pods.iter().any(|p| p == pod_uid) {
            return Ok(());
        }
        claim.pods.push(pod_uid.to_string());
        if let Err(e) = self.write(&table) {
            if let Some(claim) = table.get_mut(claim_uid) {
                claim.pods.retain(|p| p != pod_uid);
            }
            return Err(e);
        }
        Ok(())
    }

    /// The ENIs the pod `pod_uid` claimed, in claim and allocation order.
    pub fn enis_for_pod(&self, pod_uid: &str) -> Vec<(PreparedClaim, PreparedDevice)> {
        self.table()
            .values()
            .filter(|c| c.pods.iter().any(|p| p == pod_uid))
            .flat_map(|c| c.devices.iter().map(move |d| (c.clone(), d.clone())))
            .collect()
    }

    fn write(&self, table: &BTreeMap<String, PreparedClaim>) -> Result<(), DraError> {
        let file = File {
            claims: table.clone(),
        };
        let bytes = serde_json::to_vec_pretty(&file).expect("plain data serializes");
        atomic_file::replace(&self.path, 0o600, Durability::FULL, &bytes)?;
        crate::support::fault::crash_point("dra:after-claim-write");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(uid: &str, pod: &str, eni: &str) -> PreparedClaim {
        PreparedClaim {
            uid: uid.into(),
            namespace: "default".into(),
            name: format!("claim-{uid}"),
            devices: vec![PreparedDevice {
                request: "eni".into(),
                device: eni.into(),
                eni_id: eni.into(),
            }],
            pods: vec![pod.into()],
        }
    }

    #[test]
    fn a_recorded_claim_survives_a_reopen_and_is_found_by_pod() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("claims.json");
        let c = Claims::open(&path).unwrap();
        c.record(claim("u1", "pod-a", "eni-1")).unwrap();
        c.record(claim("u2", "pod-b", "eni-2")).unwrap();
        let c = Claims::open(&path).unwrap();
        let got = c.enis_for_pod("pod-a");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].1.eni_id, "eni-1");
        assert!(c.enis_for_pod("pod-z").is_empty());
        assert_eq!(c.forget("u1").unwrap().unwrap().uid, "u1");
        assert_eq!(c.forget("u1").unwrap(), None, "forget is idempotent");
        let c = Claims::open(&path).unwrap();
        assert_eq!(c.all().len(), 1);
    }

    #[test]
    fn a_corrupt_file_is_an_error_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("claims.json");
        std::fs::write(&path, b"{\"claims\": {\"u1\": ").unwrap();
        let e = Claims::open(&path).err().unwrap().to_string();
        assert!(
            e.contains("claims.json") && e.contains("left as it is"),
            "{e}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"claims\": {\"u1\": ");
    }

    #[test]
    fn a_failed_write_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("state");
        std::fs::create_dir(&sub).unwrap();
        let c = Claims::open(&sub.join("claims.json")).unwrap();
        // The file's directory becomes a file: every write fails.
        std::fs::remove_dir(&sub).unwrap();
        std::fs::write(&sub, b"").unwrap();
        assert!(c.record(claim("u1", "pod-a", "eni-1")).is_err());
        assert!(c.get("u1").is_none());
    }
}
