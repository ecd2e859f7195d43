//! What a call of the ENI OpenAPI (or the security group listing) can
//! fail with, and how the backend and the pool read it (transient,
//! throttled, auth, conflict, not found).

use enim_core::ProviderError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("BCE {op}: {source}")]
    Transport {
        op: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("BCE {op}: HTTP {status} {code}: {message} (request id {request_id})")]
    Http {
        op: String,
        status: u16,
        code: String,
        message: String,
        request_id: String,
    },
    #[error("BCE {op}: unexpected answer: {why}")]
    Decode { op: String, why: String },
    #[error("BCE endpoint {endpoint:?}: {why}")]
    Endpoint { endpoint: String, why: String },
}

/// Error codes BCE uses for throttling (besides HTTP 429).
const THROTTLE_CODES: &[&str] = &[
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "TooManyRequests",
    "RateLimitExceeded",
];

/// Error codes that mean the credentials or the signature are wrong.
const AUTH_CODES: &[&str] = &[
    "AccessDenied",
    "AccessDeniedException",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "RequestExpired",
    "InvalidHTTPAuthHeader",
    "InvalidAuthorization",
];

impl ApiError {
    fn code(&self) -> Option<(u16, &str)> {
        match self {
            ApiError::Http { status, code, .. } => Some((*status, code.as_str())),
            _ => None,
        }
    }

    pub fn is_throttled(&self) -> bool {
        matches!(self.code(), Some((status, code)) if status == 429 || THROTTLE_CODES.contains(&code))
    }

    /// Throttling, server errors and transport failures may pass; anything
    /// else the server said no to will be said no to again.
    pub fn is_transient(&self) -> bool {
        match self {
            ApiError::Transport { .. } => true,
            ApiError::Http { status, .. } => *status >= 500 || self.is_throttled(),
            ApiError::Decode { .. } | ApiError::Endpoint { .. } => false,
        }
    }

    pub fn is_auth(&self) -> bool {
        matches!(self.code(), Some((status, code)) if status == 401 || status == 403 || AUTH_CODES.contains(&code))
    }

    /// The ENI's state does not allow the call (e.g. deleting one in use).
    pub fn is_conflict(&self) -> bool {
        matches!(self.code(), Some((status, code)) if status == 409 || code.contains("StatusConflict"))
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self.code(), Some((status, code)) if status == 404 || code.contains("NotFound") || code.starts_with("NoSuch"))
    }
}

impl From<ApiError> for ProviderError {
    fn from(e: ApiError) -> Self {
        if e.is_throttled() {
            ProviderError::Throttled(e.to_string())
        } else if e.is_transient() {
            ProviderError::Unavailable(e.to_string())
        } else if e.is_auth() {
            ProviderError::Config(format!(
                "authentication with BCE failed (check access_key_id / secret_access_key \
                 or BCE_ACCESS_KEY_ID / BCE_SECRET_ACCESS_KEY, the key's rights on the \
                 ENI API and the security group listing, and the node's clock): {e}"
            ))
        } else {
            ProviderError::Config(e.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http_err(status: u16, code: &str) -> ApiError {
        ApiError::Http {
            op: "op".into(),
            status,
            code: code.into(),
            message: "m".into(),
            request_id: "r".into(),
        }
    }

    #[test]
    fn errors_are_classified() {
        assert!(http_err(500, "InternalError").is_transient());
        assert!(http_err(503, "ServiceUnavailable").is_transient());
        assert!(http_err(429, "x").is_throttled());
        assert!(http_err(400, "RequestLimitExceeded").is_throttled());
        assert!(http_err(400, "RequestLimitExceeded").is_transient());
        assert!(!http_err(400, "BadRequest").is_transient());
        assert!(http_err(403, "SignatureDoesNotMatch").is_auth());
        assert!(http_err(401, "x").is_auth());
        assert!(http_err(404, "x").is_not_found());
        assert!(http_err(400, "EniNotFound").is_not_found());
        assert!(matches!(
            ProviderError::from(http_err(429, "x")),
            ProviderError::Throttled(_)
        ));
        assert!(matches!(
            ProviderError::from(http_err(502, "x")),
            ProviderError::Unavailable(_)
        ));
        let ProviderError::Config(msg) =
            ProviderError::from(http_err(403, "SignatureDoesNotMatch"))
        else {
            panic!("auth errors are configuration errors");
        };
        assert!(
            msg.contains("authentication") && msg.contains("SignatureDoesNotMatch"),
            "{msg}"
        );
    }
}
