//! The plugin's one error type. Every variant maps to a CNI error code, so
//! whatever goes wrong ends as the spec's error JSON on stdout.

use serde_json::{json, Value};

use crate::api::{code, ApiError, ClientError};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CniError {
    /// The network configuration asks for a CNI version we do not speak.
    #[error("{0}")]
    IncompatibleVersion(String),
    /// A CNI_* environment variable is missing or malformed.
    #[error("{0}")]
    InvalidEnv(String),
    /// Local I/O (stdin) failed.
    #[error("{msg}")]
    Io { msg: String, details: String },
    /// Stdin, or the agent's answer, is not what it should be.
    #[error("{msg}")]
    Decode { msg: String, details: String },
    /// The network configuration is JSON but not a valid enim config.
    #[error("{0}")]
    InvalidConfig(String),
    /// The agent is down, refused, hung or cut the connection.
    #[error("{msg}")]
    TryAgain { msg: String, details: String },
    /// STATUS: the plugin cannot serve ADDs now.
    #[error("{msg}")]
    NotAvailable { msg: String, details: String },
    /// CHECK: prevResult does not hold what the agent says we attached.
    #[error("{msg}")]
    CheckMismatch { msg: String, details: String },
    /// The agent's own error; its code is already a CNI code.
    #[error(transparent)]
    Agent(#[from] ApiError),
}

impl CniError {
    pub fn decode(msg: impl Into<String>, details: impl ToString) -> Self {
        CniError::Decode {
            msg: msg.into(),
            details: details.to_string(),
        }
    }

    pub fn try_again(msg: impl Into<String>, details: impl ToString) -> Self {
        CniError::TryAgain {
            msg: msg.into(),
            details: details.to_string(),
        }
    }

    pub fn not_available(msg: impl Into<String>, details: impl ToString) -> Self {
        CniError::NotAvailable {
            msg: msg.into(),
            details: details.to_string(),
        }
    }

    pub fn code(&self) -> u32 {
        match self {
            CniError::IncompatibleVersion(_) => code::INCOMPATIBLE_VERSION,
            CniError::InvalidEnv(_) => code::INVALID_ENV,
            CniError::Io { .. } => code::IO_FAILURE,
            CniError::Decode { .. } => code::DECODE_FAILURE,
            CniError::InvalidConfig(_) => code::INVALID_CONFIG,
            CniError::TryAgain { .. } => code::TRY_AGAIN_LATER,
            CniError::NotAvailable { .. } => code::NOT_AVAILABLE,
            CniError::CheckMismatch { .. } => code::CHECK_MISMATCH,
            CniError::Agent(e) => e.code,
        }
    }

    pub fn details(&self) -> &str {
        match self {
            CniError::Io { details, .. }
            | CniError::Decode { details, .. }
            | CniError::TryAgain { details, .. }
            | CniError::NotAvailable { details, .. }
            | CniError::CheckMismatch { details, .. } => details,
            CniError::Agent(e) => &e.details,
            CniError::IncompatibleVersion(_)
            | CniError::InvalidEnv(_)
            | CniError::InvalidConfig(_) => "",
        }
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

/// The same codes the plugin always gave: a dead, hung or vanished agent
/// is "try again later", the agent's own error passes through.
impl From<ClientError> for CniError {
    fn from(e: ClientError) -> Self {
        let msg = e.to_string();
        match e {
            ClientError::BadSocket { .. } => CniError::InvalidConfig(msg),
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
            ClientError::Api { error, .. } => CniError::Agent(error),
            // Proxy-ish "not now" statuses are worth a retry.
            ClientError::Status { status, body } if (502..=504).contains(&status) => {
                CniError::try_again(msg, body)
            }
            ClientError::Status { body, .. } => {
                CniError::Agent(ApiError::new(code::INTERNAL, msg).with_details(body))
            }
            ClientError::Malformed { details, .. } => CniError::decode(msg, details),
            ClientError::TooLarge => CniError::decode(msg, ""),
            ClientError::Encode(_) => CniError::Agent(ApiError::new(code::INTERNAL, msg)),
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
        assert_eq!(CniError::InvalidEnv("x".into()).code(), 4);
        assert_eq!(CniError::decode("x", "").code(), 6);
        assert_eq!(CniError::InvalidConfig("x".into()).code(), 7);
        assert_eq!(CniError::try_again("x", "").code(), 11);
        assert_eq!(CniError::not_available("x", "").code(), 50);
        assert_eq!(CniError::IncompatibleVersion("x".into()).code(), 1);
        let j = CniError::InvalidEnv("CNI_IFNAME is not set".into()).to_json("1.1.0");
        assert_eq!(j["details"], "");
        assert_eq!(j["msg"], "CNI_IFNAME is not set");
    }
}
