//! [`Ec2Error`]: every way an EC2 (or other Query-protocol) call fails,
//! read from the XML error envelope and the HTTP status.

use enim_core::ProviderError;
use serde::Deserialize;

use crate::credentials::CredentialsError;

/// Error codes AWS uses for request-rate throttling.
const THROTTLING_CODES: &[&str] = &[
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottled",
    "RequestThrottledException",
    "TooManyRequestsException",
    "SlowDown",
];

/// Error codes of a server-side failure worth retrying.
const SERVER_CODES: &[&str] = &[
    "InternalError",
    "InternalFailure",
    "ServiceUnavailable",
    "Unavailable",
];

/// Credential problems, each with the likely cause.
fn auth_hint(code: &str) -> Option<&'static str> {
    Some(match code {
        "AuthFailure" => {
            "AWS could not validate the credentials: check the access key id and \
             secret access key (or the instance role)"
        }
        "SignatureDoesNotMatch" => {
            "the request signature does not match: the secret access key is wrong"
        }
        "InvalidClientTokenId" | "UnrecognizedClientException" | "InvalidAccessKeyId" => {
            "the access key id is not known to AWS"
        }
        "IncompleteSignature"
        | "MissingAuthenticationToken"
        | "MissingAuthenticationTokenException" => "the request was not signed correctly",
        "ExpiredToken" | "ExpiredTokenException" | "RequestExpired" | "RequestTimeTooSkewed" => {
            "the credentials or the request timestamp expired: check the session \
             token and the node's clock"
        }
        _ => return None,
    })
}

#[derive(Debug, thiserror::Error)]
pub enum Ec2Error {
    #[error("EC2 {action}: throttled ({code}) after {attempts} attempts: {message}")]
    Throttled {
        action: String,
        code: String,
        message: String,
        attempts: u32,
    },
    #[error("EC2 {action}: unavailable after {attempts} attempts: {detail}")]
    Unavailable {
        action: String,
        detail: String,
        attempts: u32,
    },
    #[error(
        "EC2 {action}: AttachmentLimitExceeded: the instance has no free interface slot: {message}"
    )]
    AttachmentLimitExceeded { action: String, message: String },
    #[error("EC2 {action}: authentication failed ({code}): {hint}: {message}")]
    Auth {
        action: String,
        code: String,
        hint: &'static str,
        message: String,
    },
    #[error(
        "EC2 {action}: not authorized ({code}): the IAM policy must allow ec2:{action}: {message}"
    )]
    Unauthorized {
        action: String,
        code: String,
        message: String,
    },
    #[error("EC2 {action}: {code} (HTTP {status}): {message}")]
    Api {
        action: String,
        status: u16,
        code: String,
        message: String,
    },
    #[error("EC2 {action}: {source}")]
    Credentials {
        action: String,
        #[source]
        source: CredentialsError,
    },
    #[error("EC2 {action}: unreadable response: {detail}")]
    Decode { action: String, detail: String },
    #[error("EC2 {action}: {detail}")]
    Request { action: String, detail: String },
}

impl Ec2Error {
    /// The AWS error code, where AWS sent one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Ec2Error::Throttled { code, .. }
            | Ec2Error::Auth { code, .. }
            | Ec2Error::Unauthorized { code, .. }
            | Ec2Error::Api { code, .. } => Some(code),
            Ec2Error::AttachmentLimitExceeded { .. } => Some("AttachmentLimitExceeded"),
            _ => None,
        }
    }

    /// A `*.NotFound` code: the resource is gone.
    pub fn is_not_found(&self) -> bool {
        self.code().is_some_and(|c| c.ends_with(".NotFound"))
    }

    pub(super) fn retryable(&self) -> bool {
        matches!(
            self,
            Ec2Error::Throttled { .. } | Ec2Error::Unavailable { .. }
        )
    }

    pub(super) fn expired_credentials(&self) -> bool {
        matches!(self, Ec2Error::Auth { code, .. } if code.starts_with("ExpiredToken"))
    }

    pub(super) fn set_attempts(&mut self, n: u32) {
        if let Ec2Error::Throttled { attempts, .. } | Ec2Error::Unavailable { attempts, .. } = self
        {
            *attempts = n;
        }
    }
}

impl Ec2Error {
    /// Which [`ProviderError`] this becomes, so callers that add context
    /// keep the kind (and so `is_transient`).
    pub fn provider_kind(&self) -> fn(String) -> ProviderError {
        match self {
            Ec2Error::Throttled { .. } => ProviderError::Throttled,
            // The slot may free up (another interface detaches): worth a
            // later retry, which the pool does with backoff.
            Ec2Error::Unavailable { .. }
            | Ec2Error::AttachmentLimitExceeded { .. }
            | Ec2Error::Decode { .. }
            | Ec2Error::Request { .. } => ProviderError::Unavailable,
            Ec2Error::Credentials { source, .. } if source.is_transient() => {
                ProviderError::Unavailable
            }
            Ec2Error::Credentials { .. } => ProviderError::Config,
            Ec2Error::Api { status, .. } if *status >= 500 => ProviderError::Unavailable,
            // Bad credentials, missing permissions, invalid parameters:
            // retrying does not help until someone fixes the setup.
            Ec2Error::Auth { .. } | Ec2Error::Unauthorized { .. } | Ec2Error::Api { .. } => {
                ProviderError::Config
            }
        }
    }
}

impl From<Ec2Error> for ProviderError {
    fn from(e: Ec2Error) -> Self {
        (e.provider_kind())(e.to_string())
    }
}

#[derive(Deserialize)]
struct XmlErrorResponse {
    // EC2: <Response><Errors><Error>…; IAM and others: <ErrorResponse><Error>…
    #[serde(rename = "Errors", default)]
    errors: Option<XmlErrors>,
    #[serde(rename = "Error", default)]
    error: Option<XmlError>,
}

#[derive(Deserialize)]
struct XmlErrors {
    #[serde(rename = "Error", default)]
    error: Vec<XmlError>,
}

#[derive(Deserialize)]
struct XmlError {
    #[serde(rename = "Code")]
    code: String,
    #[serde(rename = "Message", default)]
    message: String,
}

/// Turns an error reply into a typed error.
pub fn classify(action: &str, status: u16, body: &str) -> Ec2Error {
    let parsed = quick_xml::de::from_str::<XmlErrorResponse>(body)
        .ok()
        .and_then(|r| {
            r.errors
                .and_then(|e| e.error.into_iter().next())
                .or(r.error)
        });
    let action = action.to_string();
    let Some(XmlError { code, message }) = parsed else {
        let snippet: String = body.chars().take(200).collect();
        let detail = format!("HTTP {status}: {snippet}");
        return match status {
            429 => Ec2Error::Throttled {
                action,
                code: "HTTP 429".into(),
                message: snippet,
                attempts: 1,
            },
            s if s >= 500 => Ec2Error::Unavailable {
                action,
                detail,
                attempts: 1,
            },
            _ => Ec2Error::Api {
                action,
                status,
                code: format!("HTTP {status}"),
                message: snippet,
            },
        };
    };
    if THROTTLING_CODES.contains(&code.as_str()) {
        return Ec2Error::Throttled {
            action,
            code,
            message,
            attempts: 1,
        };
    }
    if code == "AttachmentLimitExceeded" {
        return Ec2Error::AttachmentLimitExceeded { action, message };
    }
    if let Some(hint) = auth_hint(&code) {
        return Ec2Error::Auth {
            action,
            code,
            hint,
            message,
        };
    }
    if code == "UnauthorizedOperation" || code == "AccessDenied" || code == "AccessDeniedException"
    {
        return Ec2Error::Unauthorized {
            action,
            code,
            message,
        };
    }
    if status >= 500 || SERVER_CODES.contains(&code.as_str()) {
        return Ec2Error::Unavailable {
            action,
            detail: format!("{code} (HTTP {status}): {message}"),
            attempts: 1,
        };
    }
    Ec2Error::Api {
        action,
        status,
        code,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ec2_errors_are_typed() {
        let body = r#"<?xml version="1.0" encoding="UTF-8"?>
<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors><RequestID>r-1</RequestID></Response>"#;
        let e = classify("AttachNetworkInterface", 503, body);
        assert!(
            matches!(e, Ec2Error::Throttled { ref code, .. } if code == "RequestLimitExceeded")
        );
        assert!(e.retryable());
        assert!(ProviderError::from(e).is_transient());

        let body = "<Response><Errors><Error><Code>AttachmentLimitExceeded</Code>\
                    <Message>Interface count 5 exceeds the limit for m5.large</Message></Error></Errors></Response>";
        let e = classify("AttachNetworkInterface", 400, body);
        assert!(
            matches!(e, Ec2Error::AttachmentLimitExceeded { .. }),
            "{e:?}"
        );
        assert!(!e.retryable());
        assert!(e.to_string().contains("exceeds the limit"));

        for code in [
            "AuthFailure",
            "SignatureDoesNotMatch",
            "InvalidClientTokenId",
        ] {
            let body = format!(
                "<Response><Errors><Error><Code>{code}</Code><Message>nope</Message></Error></Errors></Response>"
            );
            let e = classify("DescribeNetworkInterfaces", 401, &body);
            assert!(matches!(e, Ec2Error::Auth { .. }), "{code}: {e:?}");
            assert!(!e.retryable());
            let p = ProviderError::from(e);
            assert!(!p.is_transient());
            assert!(p.to_string().contains(code), "{p}");
        }

        let body = "<Response><Errors><Error><Code>UnauthorizedOperation</Code>\
                    <Message>You are not authorized</Message></Error></Errors></Response>";
        let e = classify("CreateNetworkInterface", 403, body);
        assert!(e.to_string().contains("ec2:CreateNetworkInterface"), "{e}");

        let body = "<Response><Errors><Error><Code>InvalidNetworkInterfaceID.NotFound</Code>\
                    <Message>gone</Message></Error></Errors></Response>";
        assert!(classify("DeleteNetworkInterface", 400, body).is_not_found());

        // IAM-style envelope.
        let body = "<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code>\
                    <Message>Rate exceeded</Message></Error></ErrorResponse>";
        assert!(matches!(
            classify("ListUsers", 400, body),
            Ec2Error::Throttled { .. }
        ));

        // No XML: the status decides.
        assert!(classify("X", 502, "<html>Bad gateway</html>").retryable());
        assert!(classify("X", 429, "").retryable());
        assert!(!classify("X", 400, "garbage").retryable());
        assert!(classify("X", 500, "<Response><Errors><Error><Code>InternalError</Code><Message>m</Message></Error></Errors></Response>").retryable());
    }
}
