//! The plugin's one error type. Every failure carries its CNI error code, so
//! whatever goes wrong ends as the spec's error JSON on stdout.

use enim_api::{code, ApiError, ClientError};
use serde_json::{json, Value};

/// One constructor a kind of failure, with its CNI code; `details` where
/// the kind carries them, empty otherwise.
macro_rules! constructors {
    ($($(#[$doc:meta])* $name:ident($msg:ident $(, $details:ident)?) => $code:ident;)*) => {
        $(
            $(#[$doc])*
            pub fn $name($msg: impl Into<String> $(, $details: impl ToString)?) -> Self {
                Self::new(code::$code, $msg, constructors!(@details $($details)?))
            }
        )*
    };
    (@details) => { "" };
    (@details $details:ident) => { $details };
}

/// What went wrong, as the spec's error carries it: a CNI code, a message
/// and details. The same triple as the agent's [`ApiError`], whose code is
/// already a CNI code, so the agent's errors pass through as they are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(transparent)]
pub struct CniError(ApiError);

impl CniError {
    fn new(code: u32, msg: impl Into<String>, details: impl ToString) -> Self {
        CniError(ApiError::new(code, msg).with_details(details.to_string()))
    }

    constructors! {
        /// The network configuration asks for a CNI version we do not speak.
        incompatible_version(msg) => INCOMPATIBLE_VERSION;
        /// A CNI_* environment variable is missing or malformed.
        invalid_env(msg) => INVALID_ENV;
        /// Local I/O (stdin) failed.
        io(msg, details) => IO_FAILURE;
        /// Stdin, or the agent's answer, is not what it should be.
        decode(msg, details) => DECODE_FAILURE;
        /// The network configuration is JSON but not a valid enim config.
        invalid_config(msg) => INVALID_CONFIG;
        /// The agent is down, refused, hung or cut the connection.
        try_again(msg, details) => TRY_AGAIN_LATER;
        /// STATUS: the plugin cannot serve ADDs now.
        not_available(msg, details) => NOT_AVAILABLE;
        /// CHECK: prevResult does not hold what the agent says we attached.
        check_mismatch(msg, details) => CHECK_MISMATCH;
    }

    pub fn code(&self) -> u32 {
        self.0.code
    }

    pub fn details(&self) -> &str {
        &self.0.details
    }

    /// The same error, saying it came after waiting `wait` for the agent.
    pub fn waited(mut self, wait: std::time::Duration) -> Self {
        self.0.msg = format!("{} (waited {wait:?} for it)", self.0.msg);
        self
    }

    /// The spec's error object. `details` is always present (possibly empty)
    /// so consumers can read it without checking.
    pub fn to_json(&self, cni_version: &str) -> Value {
        json!({
            "cniVersion": cni_version,
            "code": self.code(),
            "msg": self.to_string(),
            "details": self.details(),
        })
    }
}

/// The agent's own error.
impl From<ApiError> for CniError {
    fn from(e: ApiError) -> Self {
        CniError(e)
    }
}

/// The same codes the plugin always gave: a dead, hung or vanished agent
/// is "try again later", the agent's own error passes through.
impl From<ClientError> for CniError {
    fn from(e: ClientError) -> Self {
        let msg = e.to_string();
        match e {
            ClientError::BadSocket { .. } => CniError::invalid_config(msg),
            ClientError::Unreachable { source, .. } => {
                CniError::try_again(msg, format!("connect: {source}"))
            }
            ClientError::NotAccepting { .. } => {
                CniError::try_again(msg, "the listen backlog stayed full")
            }
            ClientError::TimedOut { .. } => CniError::try_again(msg, ""),
            ClientError::CutShort { details, .. } => CniError::try_again(msg, details),
            ClientError::Io { source, .. } | ClientError::Runtime(source) => {
                CniError::try_again(msg, source)
            }
            ClientError::Api { error, .. } => CniError::from(error),
            // Proxy-ish "not now" statuses are worth a retry.
            ClientError::Status { status, body } if (502..=504).contains(&status) => {
                CniError::try_again(msg, body)
            }
            ClientError::Status { body, .. } => {
                CniError::from(ApiError::new(code::INTERNAL, msg).with_details(body))
            }
            ClientError::Malformed { details, .. } => CniError::decode(msg, details),
            ClientError::TooLarge => CniError::decode(msg, ""),
            ClientError::Encode(_) => CniError::from(ApiError::new(code::INTERNAL, msg)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_errors_pass_through() {
        let e: CniError = ApiError::new(code::UNKNOWN_CONTAINER, "no such attachment")
            .with_details("net/abc/eth0")
            .into();
        assert_eq!(
            e.to_json("1.0.0"),
            json!({"cniVersion": "1.0.0", "code": 3, "msg": "no such attachment", "details": "net/abc/eth0"})
        );
    }

    #[test]
    fn codes() {
        assert_eq!(CniError::invalid_env("x").code(), 4);
        assert_eq!(CniError::decode("x", "").code(), 6);
        assert_eq!(CniError::invalid_config("x").code(), 7);
        assert_eq!(CniError::try_again("x", "").code(), 11);
        assert_eq!(CniError::not_available("x", "").code(), 50);
        assert_eq!(CniError::incompatible_version("x").code(), 1);
        let j = CniError::invalid_env("CNI_IFNAME is not set").to_json("1.1.0");
        assert_eq!(j["details"], "");
        assert_eq!(j["msg"], "CNI_IFNAME is not set");
    }
}
