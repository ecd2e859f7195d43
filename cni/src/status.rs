//! STATUS: whether the node's network can serve ADDs, not whether enimd's
//! process answers right now.
//!
//! containerd (2.0.1 and later) asks STATUS for every 1.1.0 conflist when
//! the kubelet polls the runtime (every ~5 s); a failed STATUS makes the
//! node NotReady, which stops every new pod there and, after the not-ready
//! taint's 300 s, evicts the node's pods. Pods on ENIs keep working without
//! enimd, and ADD waits for a restarting enimd (`agentWaitSeconds`), so a
//! restart or a crash loop of enimd is no reason for either.
//!
//! The rule, in order:
//! 1. enimd answers and has finished its startup recovery: its own
//!    judgement of the network (`Status::serving`): unavailable only when
//!    no ENI (secondary mode: address) can be handed out and none is on
//!    its way, every usable one quarantined included. A full node is
//!    available.
//! 2. enimd answers with an error of its own (its provider cannot list):
//!    not available, as it says.
//! 3. enimd does not answer (down, restarting, hung), or is still
//!    restoring its state: the note it left ([`enim_api::note`]) answers
//!    for it. Not available when there is no note of this boot (enimd has
//!    not served since the node booted: every pod needs an ADD then), when
//!    enimd's last sign of life is older than the note's bound (an agent
//!    gone for good), or when its last judgement was "unavailable".
//!
//! STATUS never waits for enimd: one exchange, bounded by
//! [`STATUS_TIMEOUT`].

use std::path::Path;
use std::time::Duration;

use enim_api::note::{self, Reading};
use enim_api::{code, Client, ClientError, Serving, Status, ROUTE_STATUS};
use serde_json::Value;

use super::{CniError, NetConf};

/// The most a STATUS spends on enimd: a live enimd answers in
/// milliseconds, and the kubelet polls again in ~5 s.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(2);

pub fn status(conf: &NetConf) -> Result<Option<Value>, CniError> {
    let client = Client::new(conf.socket.clone(), conf.timeout.min(STATUS_TIMEOUT));
    let away = match client.get::<Status>(ROUTE_STATUS) {
        Ok(s) if s.ready => return live(&s),
        Ok(s) => format!(
            "enimd is starting: startup recovery under way for {} s",
            s.uptime_secs
        ),
        Err(ClientError::Api { error, .. })
            if error.code == code::NOT_AVAILABLE || error.code == code::LIMITED_CONNECTIVITY =>
        {
            return Err(CniError::from(error))
        }
        // Down, restarting, hung: the note speaks for it.
        Err(e) if e.is_transient() => e.to_string(),
        // It answered, and what it said is that it cannot serve (its
        // provider fails), or it answered nonsense.
        Err(e) => {
            let e = CniError::from(e);
            let details = match e.details() {
                "" => format!("code {}", e.code()),
                d => format!("code {}: {d}", e.code()),
            };
            return Err(CniError::not_available(
                format!("enimd is not available: {e}"),
                details,
            ));
        }
    };
    from_note(&note::note_path(&conf.socket), &away)
}

/// A ready enimd's own judgement.
fn live(s: &Status) -> Result<Option<Value>, CniError> {
    match &s.serving {
        Some(Serving::Available) => Ok(None),
        Some(Serving::Unavailable { reason }) => Err(CniError::not_available(
            reason.clone(),
            format!("provider {}", s.provider),
        )),
        // An enimd older than `serving` (mid-upgrade): its rule.
        None if s.enis_total == 0 => Err(CniError::not_available(
            "enimd's provider offers no ENI at all",
            format!("provider {}", s.provider),
        )),
        None => Ok(None),
    }
}

/// What enimd's note says while enimd does not answer (`away`: why not).
fn from_note(path: &Path, away: &str) -> Result<Option<Value>, CniError> {
    let note = match note::read_note(path) {
        Ok(Some(n)) => n,
        Ok(None) => {
            return Err(CniError::not_available(
                "enimd is not available and has not served since the node booted",
                away,
            ))
        }
        Err(e) => {
            return Err(CniError::not_available(
                format!("enimd is not available and its note cannot be read: {e}"),
                away,
            ))
        }
    };
    let (boot, now) = match (note::boot_id(), note::boot_clock_ms()) {
        (Ok(b), Ok(n)) => (b, n),
        (Err(e), _) | (_, Err(e)) => {
            return Err(CniError::not_available(
                format!("enimd is not available and its note cannot be judged: {e}"),
                away,
            ))
        }
    };
    match note.read_at(&boot, now) {
        Reading::Available { .. } => Ok(None),
        Reading::Unavailable(why) => Err(CniError::not_available(why, away)),
    }
}
