//! [`ProviderError`]: how getting, freeing or naming an ENI or address
//! fails, in one type every provider, pool and caller shares; and
//! [`with_causes`], how any error is told with what lies under it.

/// Provider failures. `is_transient` tells the caller whether a retry may
/// succeed (CNI code 11) or not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    #[error("no free ENI: all {total} ENIs of this node are in use")]
    Exhausted { total: usize },
    #[error("ENI {eni_id} is held by {holder}, not by {requester}")]
    OwnedByOther {
        eni_id: String,
        holder: String,
        requester: String,
    },
    #[error("unknown ENI {0}")]
    UnknownEni(String),
    #[error("provider configuration: {0}")]
    Config(String),
    #[error("provider temporarily unavailable: {0}")]
    Unavailable(String),
    #[error("provider request throttled: {0}")]
    Throttled(String),
}

impl ProviderError {
    /// A transient error is worth retrying later; a permanent one is not.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ProviderError::Unavailable(_) | ProviderError::Throttled(_)
        )
    }
}

/// The error and each error under it, joined by ": ", e.g. "enimd is not
/// reachable at /run/enim/enimd.sock: Connection refused (os error 111)".
/// For errors whose own text leaves their source out.
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_errors_are_told_apart() {
        assert!(ProviderError::Throttled("x".into()).is_transient());
        assert!(ProviderError::Unavailable("x".into()).is_transient());
        assert!(!ProviderError::Exhausted { total: 3 }.is_transient());
        assert!(!ProviderError::UnknownEni("e".into()).is_transient());
    }
}
