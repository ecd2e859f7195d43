//! The host namespace as both modes' plumbing see it: one rtnetlink
//! connection and one dump lock, opened once and shared.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use enim_core::MacAddr;
use rtnetlink::Handle;

use super::{route, Netns, NetnsId, PlumbingError};

/// Opens an rtnetlink connection inside `netns` (thread pattern, see
/// [`super::netns`]) and drives it on the current runtime. The socket closes
/// when the returned handle and its clones are dropped.
pub async fn handle_in(netns: &Netns) -> Result<Handle, PlumbingError> {
    let (connection, handle) = connection_in(netns, tokio::runtime::Handle::current()).await?;
    tokio::spawn(connection);
    Ok(handle)
}

/// An rtnetlink socket opened inside `netns`, registered with `reactor`'s
/// runtime: its connection (to drive there) and its handle.
async fn connection_in(
    netns: &Netns,
    reactor: tokio::runtime::Handle,
) -> Result<(impl Future<Output = ()> + Send, Handle), PlumbingError> {
    super::netns::run_in(netns, move || {
        // The socket registers with the reactor of the runtime that will
        // drive it, so enter that runtime here.
        let _guard = reactor.enter();
        let (connection, handle, _) = rtnetlink::new_connection()?;
        Ok((connection, handle))
    })
    .await
}

/// An rtnetlink connection inside `netns` driven on an OS thread of its
/// own (`name`), not on the runtime. The kernel answers some requests only
/// after waiting out RCU grace periods (deleting a device: about 15 ms
/// here), and the connection's send blocks the thread that makes it: on a
/// runtime worker, the tasks queued behind it wait as long. The thread ends
/// when the returned sender is dropped.
async fn handle_on_own_thread(
    netns: &Netns,
    name: &str,
) -> Result<(Handle, tokio::sync::oneshot::Sender<()>), PlumbingError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(PlumbingError::io("start the runtime of a netlink thread"))?;
    let (connection, handle) = connection_in(netns, runtime.handle().clone()).await?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            runtime.block_on(async {
                tokio::select! {
                    () = connection => {}
                    _ = stopped => {}
                }
            })
        })
        .map_err(PlumbingError::io("start a netlink thread"))?;
    Ok((handle, stop))
}

/// The namespace ENIs live in when no pod holds them: the agent's own, or
/// one named in config (tests use a throwaway namespace, so they never
/// touch the machine's interfaces). Clones share one socket and one dump
/// lock, so primary and secondary plumbing built from the same `Host`
/// never dump over each other.
#[derive(Clone)]
pub struct Host(Arc<Inner>);

struct Inner {
    netns: Netns,
    /// The identities of the two namespaces no pod may be given: enimd's
    /// own and the host namespace (the same unless `host_netns` is set).
    own_id: NetnsId,
    host_id: NetnsId,
    handle: Handle,
    /// A second host socket, driven by a thread of its own, for deleting
    /// devices ([`Host::deletions`]); the thread ends with `Inner`.
    deletions: Handle,
    _stop_deletions: tokio::sync::oneshot::Sender<()>,
    // The kernel runs one dump at a time per netlink socket (a second gets
    // EBUSY): dumps on the host socket take turns.
    dump: tokio::sync::Mutex<()>,
}

impl Host {
    /// `path`: the host namespace's path; `None` is the agent's own.
    pub async fn open(path: Option<&Path>) -> Result<Host, PlumbingError> {
        let own = Path::new("/proc/self/ns/net");
        let netns = Netns::open(path.unwrap_or(own))?;
        let host_id = netns.id()?;
        let own_id = match path {
            Some(_) => Netns::open(own)?.id()?,
            None => host_id,
        };
        let handle = handle_in(&netns).await?;
        let (deletions, stop) = handle_on_own_thread(&netns, "enim-netlink-del").await?;
        Ok(Host(Arc::new(Inner {
            netns,
            own_id,
            host_id,
            handle,
            deletions,
            _stop_deletions: stop,
            dump: Default::default(),
        })))
    }

    pub fn netns(&self) -> &Netns {
        &self.0.netns
    }

    /// Checks that `path` is a network namespace a pod can be given: one
    /// that opens as such, and neither enimd's own nor the host namespace.
    /// Compared by device and inode of the opened file, never by path.
    pub fn check_pod_netns(&self, path: &Path) -> Result<(), PlumbingError> {
        let id = Netns::open(path)?.id()?;
        let whose = if id == self.0.own_id {
            "enimd's own"
        } else if id == self.0.host_id {
            "host_netns, where free ENIs live"
        } else {
            return Ok(());
        };
        Err(PlumbingError::NodeNetns {
            path: path.to_path_buf(),
            whose,
        })
    }

    /// For requests that are not dumps; dumps go through [`Host::dump`].
    pub fn handle(&self) -> &Handle {
        &self.0.handle
    }

    /// For deleting host devices behind an answer: a socket whose sends
    /// block a thread of its own, never a runtime worker.
    pub fn deletions(&self) -> &Handle {
        &self.0.deletions
    }

    /// Runs `dump` (a verb that dumps, such as [`super::link::dump`]) on
    /// the host socket when no other dump is running on it.
    pub async fn dump<'a, T, F>(&'a self, dump: impl FnOnce(&'a Handle) -> F) -> T
    where
        F: Future<Output = T> + 'a,
    {
        let _turn = self.0.dump.lock().await;
        dump(&self.0.handle).await
    }

    /// The MAC of the host's primary interface: the device of the main
    /// table's IPv4 default route, if there is one.
    pub async fn primary_mac(&self) -> Result<Option<MacAddr>, PlumbingError> {
        self.dump(route::primary_mac).await
    }
}
