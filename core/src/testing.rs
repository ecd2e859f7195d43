//! Test helpers (feature `testing`): the warnings a piece of code logs,
//! checked against the deprecations of moved config keys, and the `api`
//! table every cloud's config tests write.

use std::fmt::Debug;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::api_config::ApiConfig;
use crate::config_keys::KeyMove;
use crate::ratelimit::RateLimit;
use crate::sync::lock;

/// Runs `f` and returns what it returned and the lines it logged at
/// `WARN` or above on this thread.
pub fn warnings_of<T>(f: impl FnOnce() -> T) -> (T, Vec<String>) {
    always_asks_the_current_subscriber();
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || LogSink(sink.clone()))
        .finish();
    let out = tracing::subscriber::with_default(subscriber, f);
    let bytes = lock(&log).clone();
    let lines = String::from_utf8_lossy(&bytes)
        .lines()
        .map(str::to_string)
        .collect();
    (out, lines)
}

/// What `read` returns, checked to have logged the deprecation of each of
/// `moves` (keys of `section`), in order, and no other warning.
pub fn read_with_deprecations<T, E: Debug>(
    section: &str,
    moves: &[KeyMove],
    read: impl FnOnce() -> Result<T, E>,
) -> T {
    let (read, logged) = warnings_of(read);
    let value = read.unwrap();
    assert_eq!(logged.len(), moves.len(), "{logged:#?}");
    for (line, m) in logged.iter().zip(moves) {
        assert!(line.contains(&m.deprecation(section)), "{line}");
    }
    value
}

/// What `read` returns, checked to have logged no warning.
pub fn read_without_warnings<T, E: Debug>(read: impl FnOnce() -> Result<T, E>) -> T {
    let (read, logged) = warnings_of(read);
    assert!(logged.is_empty(), "{logged:#?}");
    read.unwrap()
}

/// The `api` table every cloud's config tests write, with the old keys
/// and with the new: the same values whatever the keys are called.
pub fn sample_api() -> ApiConfig {
    ApiConfig {
        endpoint: Some("http://127.0.0.1:5000".into()),
        max_attempts: 3,
        backoff: Duration::from_millis(100),
        max_backoff: Duration::from_secs(5),
        mutating_rate: RateLimit::new(Duration::from_secs(2), 3),
        read_rate: RateLimit::new(Duration::from_millis(100), 20),
    }
}

/// Where [`warnings_of`] keeps what was logged.
struct LogSink(Arc<Mutex<Vec<u8>>>);

impl io::Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        lock(&self.0).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Sets, once per process, a global subscriber that records nothing but
/// answers every callsite "sometimes". Why: `tracing` caches each
/// callsite's interest over every live subscriber. A callsite first hit
/// while no subscriber wanted it (another test's thread, with none of its
/// own) could be cached as "never" and then stay silent under this
/// thread's `with_default`: the deprecation warnings went missing in about
/// one run in twenty. A "sometimes" from the global one makes every event
/// ask the subscriber of its own thread.
fn always_asks_the_current_subscriber() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err when a global one is set already: its answers then stand.
        let _ = tracing::subscriber::set_global_default(AsksEveryTime);
        tracing::callsite::rebuild_interest_cache();
    });
}

/// The subscriber of [`always_asks_the_current_subscriber`].
struct AsksEveryTime;

impl tracing::Subscriber for AsksEveryTime {
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        false
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}
