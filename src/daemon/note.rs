//! enimd's side of the status note ([`enim_api::note`]): its judgement of
//! the node's network ([`judge`], also what `GET /v1/status` answers) and
//! the note it keeps beside its socket so that the plugin's STATUS can
//! answer for it while it is away.

use std::path::{Path, PathBuf};
use std::time::Duration;

use enim_api::model::{AddressStats, Mode};
use enim_api::note::{self, NoteError, Serving, StatusNote};
use enim_core::atomic_file::{self, Durability, FileError};
use enim_core::Eni;
use enim_provider::EniProvider;

use crate::engine::{Driver, Engine};
use crate::support::exclusion::Reservation;

/// What the node's network can do, from what the provider lists now.
///
/// Available while anything can be handed out: a free ENI (secondary
/// mode: address), or one in use that a pod will give back, or a pool
/// that is making more (`growing`: a cloud pool whose API answers). A full
/// node is available: its ADDs wait or answer "try again later", and the
/// device plugin keeps the scheduler away. Unavailable when nothing can be
/// handed out and nothing is coming: no ENI at all, or every one
/// quarantined (its device gone from the node).
pub fn judge(
    mode: Mode,
    listed: &[Eni],
    addresses: Option<&AddressStats>,
    growing: bool,
) -> Serving {
    let reservation = |e: &Eni| e.owner.as_ref().and_then(Reservation::of);
    let usable = listed.iter().filter(|e| reservation(e).is_none()).count();
    let quarantined = listed
        .iter()
        .filter(|e| reservation(e) == Some(Reservation::Missing))
        .count();
    let handed_out = match (mode, addresses) {
        (Mode::Secondary, Some(a)) => a.total,
        _ => usable,
    };
    if handed_out > 0 || growing {
        return Serving::Available;
    }
    let reason = match mode {
        _ if quarantined > 0 => format!(
            "every ENI enim may hand out ({quarantined}) is quarantined: its device is not on the node"
        ),
        Mode::Primary => {
            "the provider offers no ENI enim may hand out, and none is on its way".to_string()
        }
        Mode::Secondary => {
            "no ENI of the node carries an address enim may hand out, and none is on its way"
                .to_string()
        }
    };
    Serving::Unavailable { reason }
}

/// [`judge`] of what `engine`'s provider lists now; a provider that cannot
/// list makes the node unavailable, as the status route says.
pub async fn judge_engine<D: Driver>(engine: &Engine<D>) -> Serving {
    let provider = engine.provider();
    match provider.list().await {
        Ok(listed) => judge(
            D::MODE,
            &listed,
            engine.address_stats().as_ref(),
            growing(provider.as_ref(), D::MODE),
        ),
        Err(e) => Serving::Unavailable {
            reason: format!("the provider cannot list the node's ENIs: {e}"),
        },
    }
}

/// Whether `provider` is making more ENIs or addresses for the node: a
/// cloud pool (the one that keeps statistics or assigns addresses) whose
/// API answers.
pub fn growing(provider: &dyn EniProvider, mode: Mode) -> bool {
    let pool = match mode {
        Mode::Primary => provider.statistics().is_some(),
        Mode::Secondary => provider.secondary_ips().is_some(),
    };
    pool && provider.degraded().is_none()
}

/// The note of the enimd serving `socket`.
#[derive(Debug, Clone)]
pub struct NoteWriter {
    path: PathBuf,
    away_bound: Duration,
    boot_id: String,
}

/// Why the note could not be written.
#[derive(Debug, thiserror::Error)]
pub enum NoteWriteError {
    #[error(transparent)]
    Note(#[from] NoteError),
    #[error(transparent)]
    File(#[from] FileError),
}

impl NoteWriter {
    pub fn new(socket: &Path, away_bound: Duration) -> Result<NoteWriter, NoteWriteError> {
        Ok(NoteWriter {
            path: note::note_path(socket),
            away_bound,
            boot_id: note::boot_id()?,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// At start: see [`renew`].
    pub fn renew(&self) -> Result<bool, NoteWriteError> {
        renew(&self.path, &self.boot_id)
    }

    /// Writes the note: enimd is alive now and judges the network so.
    pub fn write(&self, serving: Serving) -> Result<(), NoteWriteError> {
        let note = StatusNote {
            boot_id: self.boot_id.clone(),
            alive_ms: note::boot_clock_ms()?,
            away_bound_secs: self.away_bound.as_secs(),
            serving,
            pid: std::process::id(),
        };
        store(&self.path, &note)
    }
}

/// At start, before anything that can fail (the config file included:
/// `enimd.rs` calls it with the socket's default path then): an existing
/// note of this boot is renewed, its judgement and bound kept, so that a
/// crash-looping enimd, which the kubelet restarts at least every 5
/// minutes, keeps its note standing. An enimd that has not served in this
/// boot has no judgement to renew and writes nothing. True when renewed.
pub fn renew(path: &Path, boot_id: &str) -> Result<bool, NoteWriteError> {
    match note::read_note(path) {
        Ok(Some(mut old)) if old.boot_id == boot_id => {
            old.alive_ms = note::boot_clock_ms()?;
            old.pid = std::process::id();
            store(path, &old)?;
            Ok(true)
        }
        // Another boot's, or unreadable: it speaks for nothing now.
        Ok(_) | Err(NoteError::Decode { .. }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

fn store(path: &Path, note: &StatusNote) -> Result<(), NoteWriteError> {
    let bytes = serde_json::to_vec(note).expect("a note serialises");
    // Beside the socket on tmpfs, read only in this boot: a reader sees the
    // old note or the new one, and no fsync is worth its cost.
    let lazy = Durability {
        data: false,
        rename: false,
    };
    atomic_file::replace(path, 0o644, lazy, &bytes)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use enim_core::{EniOwner, MacAddr};

    use super::*;

    fn eni(i: u8, owner: Option<EniOwner>) -> Eni {
        Eni {
            id: format!("eni-{i}"),
            mac: MacAddr([2, 0, 0, 0, 0, i]),
            ipv4: format!("10.0.{i}.10/24").parse().unwrap(),
            gateway4: format!("10.0.{i}.1").parse().unwrap(),
            ipv6: None,
            gateway6: None,
            mtu: None,
            owner,
            device_index: None,
            secondary_ips: Vec::new(),
            placement: Default::default(),
        }
    }

    fn pod() -> Option<EniOwner> {
        Some(EniOwner {
            network: "net".into(),
            container_id: "c1".into(),
            ifname: "eth0".into(),
            pod: Default::default(),
        })
    }

    fn unavailable(s: Serving) -> String {
        match s {
            Serving::Unavailable { reason } => reason,
            Serving::Available => panic!("available"),
        }
    }

    #[test]
    fn a_full_node_is_available() {
        let all_in_use = [eni(1, pod()), eni(2, pod())];
        assert_eq!(
            judge(Mode::Primary, &all_in_use, None, false),
            Serving::Available
        );
    }

    #[test]
    fn every_eni_quarantined_is_unavailable_unless_a_pool_makes_more() {
        let missing = |i| eni(i, Some(Reservation::Missing.owner(&format!("eni-{i}"))));
        let excluded = eni(3, Some(Reservation::Excluded.owner("eni-3")));
        let enis = [missing(1), missing(2), excluded];
        let why = unavailable(judge(Mode::Primary, &enis, None, false));
        assert!(
            why.contains("every ENI enim may hand out (2) is quarantined"),
            "{why}"
        );
        assert_eq!(judge(Mode::Primary, &enis, None, true), Serving::Available);
        // One usable ENI left (in use): the node is full, not broken.
        let enis = [missing(1), eni(2, pod())];
        assert_eq!(judge(Mode::Primary, &enis, None, false), Serving::Available);
    }

    #[test]
    fn no_eni_at_all_is_unavailable() {
        let why = unavailable(judge(Mode::Primary, &[], None, false));
        assert!(why.contains("offers no ENI"), "{why}");
        // Excluded ENIs are not handed out.
        let only_excluded = [eni(1, Some(Reservation::Excluded.owner("eni-1")))];
        let why = unavailable(judge(Mode::Primary, &only_excluded, None, false));
        assert!(why.contains("offers no ENI"), "{why}");
    }

    #[test]
    fn secondary_mode_counts_addresses() {
        let host_eni = [eni(1, None)];
        let none = AddressStats::default();
        let why = unavailable(judge(Mode::Secondary, &host_eni, Some(&none), false));
        assert!(why.contains("carries an address"), "{why}");
        let full = AddressStats {
            total: 6,
            assigned: 6,
            pods: 6,
            ..Default::default()
        };
        assert_eq!(
            judge(Mode::Secondary, &host_eni, Some(&full), false),
            Serving::Available
        );
    }

    #[test]
    fn renew_keeps_the_judgement_of_this_boot_only() {
        let dir = tempfile::tempdir().unwrap();
        let writer =
            NoteWriter::new(&dir.path().join("enimd.sock"), Duration::from_secs(600)).unwrap();
        assert_eq!(writer.path(), dir.path().join("enimd.status.json"));
        // Nothing to renew: nothing written.
        assert!(!writer.renew().unwrap());
        assert!(!writer.path().exists());

        let broken = Serving::Unavailable {
            reason: "every ENI is quarantined".into(),
        };
        writer.write(broken.clone()).unwrap();
        let first = note::read_note(writer.path()).unwrap().unwrap();
        std::thread::sleep(Duration::from_millis(30));
        assert!(writer.renew().unwrap());
        let renewed = note::read_note(writer.path()).unwrap().unwrap();
        assert_eq!(renewed.serving, broken);
        assert!(renewed.alive_ms > first.alive_ms, "{renewed:?} {first:?}");
        assert_eq!(renewed.away_bound_secs, 600);
        // Renewed without the config (enimd.rs when the config is broken):
        // the bound is the note's.
        let boot = note::boot_id().unwrap();
        assert!(renew(writer.path(), &boot).unwrap());
        let again = note::read_note(writer.path()).unwrap().unwrap();
        assert_eq!((again.away_bound_secs, again.serving), (600, broken));

        // Another boot's note is not renewed.
        let mut other = renewed;
        other.boot_id = "another-boot".into();
        std::fs::write(writer.path(), serde_json::to_vec(&other).unwrap()).unwrap();
        assert!(!writer.renew().unwrap());
        let kept = note::read_note(writer.path()).unwrap().unwrap();
        assert_eq!(kept.boot_id, "another-boot");
    }
}
