//! Gives freed heap back to the kernel once a burst of work is over.
//!
//! Each operation allocates briefly (a netlink connection per pod namespace
//! with a 64 KiB read buffer, dump replies, the checkpoint's JSON), so a
//! burst of pods in parallel raises the heap's high-water mark. glibc keeps
//! what is freed in its arenas for reuse and returns little of it on its
//! own, so without this enimd's RSS stays about 1 MiB above idle after the
//! first parallel burst. Trimming when the agent has gone quiet costs
//! well under a millisecond and never runs inside an operation.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

/// How long the agent must stay without operations before it trims: long
/// enough not to trim between the operations of one burst.
pub const QUIET: Duration = Duration::from_millis(100);

/// Tracks operations in flight and trims the heap after the last one of a
/// burst, once nothing new started for [`QUIET`].
#[derive(Default)]
pub struct Trimmer {
    in_flight: AtomicUsize,
    /// Operations started so far: a trim waits for it to stay put.
    started: AtomicU64,
    quiet: Notify,
    trims: AtomicU64,
}

/// One operation in flight; dropping the last one wakes the trimmer.
pub struct Busy(Arc<Trimmer>);

impl Trimmer {
    pub fn busy(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.started.fetch_add(1, Ordering::SeqCst);
        Busy(self.clone())
    }

    /// Trims done so far.
    pub fn trims(&self) -> u64 {
        self.trims.load(Ordering::SeqCst)
    }

    /// Runs for the life of the agent: once per burst, after [`QUIET`]
    /// without operations, trims.
    pub async fn run(self: Arc<Self>) {
        let mut trimmed_after = 0;
        loop {
            // Made before the checks, so a wake-up between them is not lost.
            let woken = self.quiet.notified();
            let seen = self.started.load(Ordering::SeqCst);
            if seen == trimmed_after || self.in_flight.load(Ordering::SeqCst) > 0 {
                woken.await;
                continue;
            }
            tokio::time::sleep(QUIET).await;
            if self.in_flight.load(Ordering::SeqCst) == 0
                && self.started.load(Ordering::SeqCst) == seen
            {
                release_free_heap();
                self.trims.fetch_add(1, Ordering::SeqCst);
                trimmed_after = seen;
            }
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.quiet.notify_waiters();
        }
    }
}

/// Caps glibc's malloc arenas at two, unless `MALLOC_ARENA_MAX` is set.
/// glibc makes up to 8 per core as threads contend, and each keeps freed
/// memory resident; enimd's two runtime workers and its few helper threads
/// allocate little and rarely at once, so two arenas lose nothing in speed
/// and hold RSS near idle after parallel bursts (the benchmark measured
/// +8 % over 1,000 cycles with the cap, +10 % without). Call before any
/// thread starts.
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt takes plain integers and only sets a glibc
        // tunable; called from main before other threads exist.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}

/// Returns the free heap glibc holds in every arena to the kernel. Called
/// after bursts (start-up, which restores thousands of records at once,
/// counts as one) and after each GC pass. A no-op on other C libraries.
pub fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers; it walks glibc's own arenas,
    // each under its lock, and may be called from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Once per burst, only after QUIET without operations, never while
    /// one is in flight.
    #[tokio::test(start_paused = true)]
    async fn trims_once_after_each_burst_goes_quiet() {
        let t = Arc::new(Trimmer::default());
        let task = tokio::spawn(t.clone().run());
        tokio::time::sleep(QUIET * 3).await;
        assert_eq!(t.trims(), 0, "nothing happened yet");
        let a = t.busy();
        let b = t.busy();
        drop(a);
        tokio::time::sleep(QUIET * 3).await;
        assert_eq!(t.trims(), 0, "one still in flight");
        drop(b);
        // Another operation within the quiet time restarts the wait.
        tokio::time::sleep(QUIET / 2).await;
        drop(t.busy());
        tokio::time::sleep(QUIET * 3 / 4).await;
        assert_eq!(t.trims(), 0, "not quiet for long enough yet");
        tokio::time::sleep(QUIET * 3).await;
        assert_eq!(t.trims(), 1, "one trim for the burst");
        tokio::time::sleep(QUIET * 10).await;
        assert_eq!(t.trims(), 1, "no trims without work");
        drop(t.busy());
        tokio::time::sleep(QUIET * 2).await;
        assert_eq!(t.trims(), 2, "the next burst trims again");
        task.abort();
    }
}
