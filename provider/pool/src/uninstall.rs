//! The pool's part of an uninstall: every ENI it made that no pod holds
//! goes back to the cloud (see
//! [`EniProvider::release_unused`](enim_provider::EniProvider::release_unused)).

use enim_provider::Released;

use crate::WarmPool;

impl WarmPool {
    /// [`EniProvider::release_unused`] for the pool. It stops its loops
    /// first (a round would refill what is given back), then detaches and
    /// deletes, all at once, its free members that carry enim's tag and
    /// the tagged ENIs attached nowhere (a crash's orphans, or an ENI kept
    /// for a next create). Members a pod holds, and ENIs attached from
    /// outside, are kept. Before [`EniProvider::restore`] has run nothing
    /// is given back: a free ENI cannot be told from a held one yet.
    ///
    /// [`EniProvider::release_unused`]: enim_provider::EniProvider::release_unused
    /// [`EniProvider::restore`]: enim_provider::EniProvider::restore
    pub(crate) async fn give_back_unused(&self) -> Released {
        self.shutdown().await;
        let mut released = Released::default();
        {
            let st = self.inner.state();
            if !st.restored {
                released.kept = st.members.iter().map(|m| m.eni.id.clone()).collect();
                tracing::warn!("the pool was never restored: giving nothing back, as a free ENI cannot be told from a held one");
                return released;
            }
        }
        // The cloud's listing first, read as discovery reads it: members
        // it shows tagged are enim's, tagged ENIs attached nowhere orphans.
        let tagged = self.inner.backend.tagged().await;
        let doomed: Vec<String> = {
            let mut st = self.inner.state();
            match &tagged {
                Ok(tagged) => st.adopt_tagged(tagged),
                Err(e) => released
                    .failed
                    .push(("(tagged ENIs)".into(), format!("listing enim's ENIs: {e}"))),
            }
            let mut doomed = Vec::new();
            for m in st.members.iter_mut() {
                if m.ours && m.is_free() {
                    m.leaving = true;
                    doomed.push(m.eni.id.clone());
                } else if !m.leaving {
                    released.kept.push(m.eni.id.clone());
                }
            }
            doomed.append(&mut st.orphans);
            self.inner.publish(&st);
            doomed
        };
        let backend = &self.inner.backend;
        let outcomes =
            futures::future::join_all(doomed.iter().map(|id| backend.detach_and_delete(id))).await;
        let mut st = self.inner.state();
        for (id, outcome) in doomed.into_iter().zip(outcomes) {
            match outcome {
                Ok(()) => {
                    st.members.retain(|m| m.eni.id != id);
                    tracing::info!(eni = %id, "uninstall: ENI detached and deleted");
                    released.deleted.push(id);
                }
                Err(e) => {
                    tracing::warn!(eni = %id, error = %e, "uninstall: could not give this ENI back");
                    released.failed.push((id, e.to_string()));
                }
            }
        }
        self.inner.publish(&st);
        released
    }
}
