//! Network namespace handles and the thread pattern for netlink sockets.
//!
//! `setns` switches only the calling thread, and a netlink socket stays bound
//! to the namespace it was created in. So a socket for another namespace is
//! created on a dedicated `std::thread` that enters the namespace, opens the
//! socket and goes back to its own namespace; the async runtime then drives
//! that socket. Tokio's own threads never change namespace: they are pooled,
//! and a switched namespace would leak into unrelated tasks.
//!
//! The dedicated thread is one long-lived thread, not one per operation: a
//! thread per socket cost a thread start on every ADD and DEL, and under
//! parallel load each of those threads got a glibc malloc arena of its own
//! for the connection buffers it allocated, which stayed resident (enimd's
//! RSS rose about 1 MiB above idle over the benchmark's parallel cycles).
//! If the thread ever fails to get back to its own namespace it retires,
//! taking the wrong namespace with it, and the next call starts a new one.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use nix::sched::{setns, CloneFlags};

use super::PlumbingError;

// NS_GET_NSTYPE = _IO(0xb7, 0x3) from <linux/nsfs.h>: asks an nsfs file which
// kind of namespace it is.
nix::ioctl_none!(ns_get_nstype, 0xb7, 3);

/// Which namespace a namespace file is: the device and inode of its nsfs
/// file (what `stat -L` shows). Two paths name the same namespace exactly
/// when these match, whatever the paths are (`/proc/1/ns/net`, a bind
/// mount under `/run/netns`, `/proc/<pid>/task/<tid>/ns/net`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetnsId {
    pub dev: u64,
    pub ino: u64,
}

/// An open network namespace file (`/run/netns/x`, `/proc/<pid>/ns/net`).
/// Holding it pins the namespace, so handles are dropped promptly.
#[derive(Debug)]
pub struct Netns {
    file: File,
    path: PathBuf,
}

impl Netns {
    /// Opens `path` and checks that it really is a network namespace. A
    /// missing path is [`PlumbingError::NetnsNotFound`]; a regular file, a
    /// directory, another namespace kind or a stale mount is
    /// [`PlumbingError::NotANetns`].
    pub fn open(path: &Path) -> Result<Netns, PlumbingError> {
        let file = File::open(path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => PlumbingError::NetnsNotFound(path.to_path_buf()),
            _ => PlumbingError::NotANetns {
                path: path.to_path_buf(),
                why: e.to_string(),
            },
        })?;
        // SAFETY: the fd is valid for the life of `file`, and NS_GET_NSTYPE
        // takes no argument; on a non-nsfs file the kernel answers ENOTTY.
        let kind = unsafe { ns_get_nstype(file.as_raw_fd()) };
        match kind {
            Ok(k) if k == CloneFlags::CLONE_NEWNET.bits() => Ok(Netns {
                file,
                path: path.to_path_buf(),
            }),
            Ok(_) => Err(PlumbingError::NotANetns {
                path: path.to_path_buf(),
                why: "it is a namespace of another kind".into(),
            }),
            Err(errno) => Err(PlumbingError::NotANetns {
                path: path.to_path_buf(),
                why: format!("not a namespace file ({errno})"),
            }),
        }
    }

    /// The calling thread's current network namespace.
    pub fn current_thread() -> Result<Netns, PlumbingError> {
        Netns::open(Path::new("/proc/thread-self/ns/net"))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// This namespace's identity, from `fstat` of the open file (not of the
    /// path, which may have been replaced since it was opened).
    pub fn id(&self) -> Result<NetnsId, PlumbingError> {
        let meta = self
            .file
            .metadata()
            .map_err(PlumbingError::io("fstat netns"))?;
        Ok(NetnsId {
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn try_clone(&self) -> io::Result<Netns> {
        Ok(Netns {
            file: self.file.try_clone()?,
            path: self.path.clone(),
        })
    }
}

/// Runs `f` on the namespace thread while it is inside `netns`, and returns
/// its result without blocking the async runtime. Calls run one at a time,
/// each briefly: keep `f` to opening sockets and files.
pub async fn run_in<T, F>(netns: &Netns, f: F) -> Result<T, PlumbingError>
where
    T: Send + 'static,
    F: FnOnce() -> io::Result<T> + Send + 'static,
{
    let target = netns
        .file
        .try_clone()
        .map_err(PlumbingError::io("dup netns fd"))?;
    let path = netns.path.clone();
    let (tx, rx) = futures::channel::oneshot::channel();
    let job: Job = Box::new(move || {
        let result = setns(target.as_fd(), CloneFlags::CLONE_NEWNET)
            .map_err(|e| PlumbingError::Setns {
                path: path.clone(),
                source: io::Error::from(e),
            })
            .and_then(|()| f().map_err(PlumbingError::io("open netlink socket in netns")));
        let _ = tx.send(result);
    });
    submit(job)?;
    rx.await.map_err(|_| PlumbingError::Io {
        what: "netns thread",
        source: io::Error::other("the call was dropped (it panicked, or the thread retired)"),
    })?
}

/// Work for the namespace thread: enter a namespace, do something there.
/// The thread goes back to its own namespace after every job.
type Job = Box<dyn FnOnce() + Send>;

/// The namespace thread's queue; `None` before the first call and after
/// the thread retired.
static THREAD: std::sync::Mutex<Option<mpsc::Sender<Job>>> = std::sync::Mutex::new(None);

fn submit(job: Job) -> Result<(), PlumbingError> {
    let mut slot = THREAD.lock().unwrap_or_else(|p| p.into_inner());
    // Not started yet, or retired: start a new one below.
    let job = match slot.as_ref() {
        Some(tx) => match tx.send(job) {
            Ok(()) => return Ok(()),
            Err(mpsc::SendError(job)) => job,
        },
        None => job,
    };
    let (tx, rx) = mpsc::channel();
    // Its own namespace is the process's (the main thread's), not that of
    // whichever thread happens to start it (a test's or the bench's thread
    // may be inside a namespace that is deleted later, which the thread
    // would keep alive).
    let home = Netns::open(Path::new("/proc/self/ns/net"))?;
    std::thread::Builder::new()
        .name("enim-netns".into())
        .spawn(move || serve(home, rx))
        .map_err(PlumbingError::io("spawn netns thread"))?;
    tx.send(job).map_err(|_| PlumbingError::Io {
        what: "netns thread",
        source: io::Error::other("exited before its first job"),
    })?;
    *slot = Some(tx);
    Ok(())
}

fn serve(home: Netns, jobs: mpsc::Receiver<Job>) {
    let go_home = || {
        setns(home.file.as_fd(), CloneFlags::CLONE_NEWNET).inspect_err(|e| {
            tracing::error!(error = %e, "netns thread cannot enter its own namespace; retiring it");
            let mut slot = THREAD.lock().unwrap_or_else(|p| p.into_inner());
            *slot = None;
            // Jobs already queued are dropped with the queue: their callers
            // get an error rather than a socket in the wrong namespace.
        })
    };
    if go_home().is_err() {
        return;
    }
    while let Ok(job) = jobs.recv() {
        // A job that panics drops its answer channel: its caller gets an
        // error, and the thread carries on once back home.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        if go_home().is_err() {
            return;
        }
    }
}

/// A namespace of a test's own, held open by a parked thread until dropped.
#[cfg(test)]
pub(crate) struct HeldNetns {
    pub netns: Netns,
    done: Option<std::sync::mpsc::Sender<()>>,
    holder: Option<std::thread::JoinHandle<()>>,
}

#[cfg(test)]
impl HeldNetns {
    pub fn new() -> HeldNetns {
        let (ns_tx, ns_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            nix::sched::unshare(CloneFlags::CLONE_NEWNET).unwrap();
            ns_tx.send(Netns::current_thread().unwrap()).unwrap();
            let _ = done_rx.recv();
        });
        HeldNetns {
            netns: ns_rx.recv().unwrap(),
            done: Some(done_tx),
            holder: Some(holder),
        }
    }
}

#[cfg(test)]
impl Drop for HeldNetns {
    fn drop(&mut self) {
        drop(self.done.take());
        if let Some(h) = self.holder.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns_inode(path: &str) -> u64 {
        std::fs::metadata(path).unwrap().ino()
    }

    /// Calls land in the namespace asked for, in parallel or not, and the
    /// one thread serving them goes back home after each (a later call for
    /// the process's own namespace sees it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_enter_the_namespace_and_the_thread_goes_home() {
        // Needs root, to make a namespace.
        enim_testkit::require_kernel!();
        let held = HeldNetns::new();
        let other = held.netns.try_clone().unwrap();
        let other_ino = other.file().metadata().unwrap().ino();
        let home = Netns::open(Path::new("/proc/self/ns/net")).unwrap();
        let home_ino = ns_inode("/proc/self/ns/net");
        assert_ne!(other_ino, home_ino);

        let here = || {
            Ok((
                ns_inode("/proc/thread-self/ns/net"),
                std::thread::current().id(),
            ))
        };
        let calls = (0..16).map(|i| {
            let ns = if i % 2 == 0 { &other } else { &home };
            async move { (i, run_in(ns, here).await.unwrap()) }
        });
        let mut threads = std::collections::HashSet::new();
        for (i, (ino, thread)) in futures::future::join_all(calls).await {
            assert_eq!(
                ino,
                if i % 2 == 0 { other_ino } else { home_ino },
                "call {i}"
            );
            threads.insert(thread);
        }
        assert_eq!(threads.len(), 1, "one thread serves every call");
        let (ino, _) = run_in(&home, here).await.unwrap();
        assert_eq!(ino, home_ino);

        // A call that panics fails alone; the thread carries on.
        let panicked = run_in(&other, || -> io::Result<()> { panic!("boom") }).await;
        assert!(panicked.is_err());
        let (ino, _) = run_in(&other, here).await.unwrap();
        assert_eq!(ino, other_ino);
    }
}
