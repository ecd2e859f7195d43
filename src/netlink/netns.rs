//! Network namespace handles and the thread pattern for netlink sockets.
//!
//! `setns` switches only the calling thread, and a netlink socket stays bound
//! to the namespace it was created in. So a socket for another namespace is
//! created on a short-lived `std::thread` that enters the namespace, opens the
//! socket, and exits; the async runtime then drives that socket. Tokio's own
//! threads never change namespace: they are pooled, and a switched namespace
//! would leak into unrelated tasks.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};

use nix::sched::{setns, CloneFlags};

use super::PlumbingError;

// NS_GET_NSTYPE = _IO(0xb7, 0x3) from <linux/nsfs.h>: asks an nsfs file which
// kind of namespace it is.
nix::ioctl_none!(ns_get_nstype, 0xb7, 3);

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

/// Runs `f` on a fresh OS thread that has entered `netns`, and returns its
/// result without blocking the async runtime. The thread is discarded after,
/// so its namespace can never leak into other work.
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
    std::thread::Builder::new()
        .name("enim-netns".into())
        .spawn(move || {
            let result = setns(target.as_fd(), CloneFlags::CLONE_NEWNET)
                .map_err(|e| PlumbingError::Setns {
                    path: path.clone(),
                    source: io::Error::from(e),
                })
                .and_then(|()| f().map_err(PlumbingError::io("open netlink socket in netns")));
            // The thread ends here, taking its namespace with it.
            let _ = tx.send(result);
        })
        .map_err(PlumbingError::io("spawn netns thread"))?;
    rx.await.map_err(|_| PlumbingError::Io {
        what: "netns thread",
        source: io::Error::other("thread died before answering"),
    })?
}
