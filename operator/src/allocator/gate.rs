//! The allocator's only way to the cloud. The cloud is a private field of
//! [`CloudGate`], so every call, those added later included, passes the
//! same steps: leadership ([`Store::leadership`]: the lease manager's flag
//! and the leader deadline), a token of its class's bucket, leadership
//! again (the wait may be long), and only then the call itself, built
//! after the checks.
//!
//! One call may be several requests to the cloud (a look before a create
//! or a delete, the client's retries and their back-off): it is checked at
//! its start, and what follows is stopped by the runtime, which drops the
//! whole pass at the leader deadline (`crate::runtime::run`), so no
//! request of it is sent after that.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use enim_core::ratelimit::TokenBucket;
use enim_core::ProviderError;
use enim_provider::fleet::FleetCloud;

use super::{Class, Counters, TaskError};
use crate::store::Store;

pub(super) struct CloudGate {
    cloud: Arc<dyn FleetCloud>,
    store: Arc<dyn Store>,
    mutating: TokenBucket,
    describe: TokenBucket,
}

impl CloudGate {
    pub(super) fn new(
        cloud: Arc<dyn FleetCloud>,
        store: Arc<dyn Store>,
        mutating: TokenBucket,
        describe: TokenBucket,
    ) -> CloudGate {
        CloudGate {
            cloud,
            store,
            mutating,
            describe,
        }
    }

    /// The provider of the cloud's instances (no call).
    pub(super) fn cloud_name(&self) -> &str {
        self.cloud.name()
    }

    /// `Ok` while this replica may call the cloud and write.
    pub(super) fn lead(&self) -> Result<(), TaskError> {
        Ok(self.store.leadership()?)
    }

    /// One cloud call: `call` is handed the cloud once leadership held
    /// before and after the token wait.
    pub(super) async fn call<'c, T, Fut>(
        &'c self,
        class: Class,
        counters: &Counters,
        call: impl FnOnce(&'c dyn FleetCloud) -> Fut,
    ) -> Result<T, TaskError>
    where
        Fut: Future<Output = Result<T, ProviderError>>,
    {
        self.lead()?;
        match class {
            Class::Mutating => self.mutating.acquire().await,
            Class::Describe => self.describe.acquire().await,
        };
        self.lead()?;
        counters.calls.fetch_add(1, Ordering::Relaxed);
        let r = call(&*self.cloud).await;
        if matches!(r, Err(ProviderError::Throttled(_))) {
            counters.throttled.fetch_add(1, Ordering::Relaxed);
        }
        Ok(r?)
    }
}
