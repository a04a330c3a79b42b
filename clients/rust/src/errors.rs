//! Errors of this crate: decoded from the queue's rich status details (`google.rpc.ErrorInfo`,
//! `BadRequest`, `RetryInfo`) into one enum a caller can match on.

use std::collections::HashMap;
use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::StatusExt;

pub use tonic_types::{ErrorInfo, FieldViolation};

/// The `google.rpc.ErrorInfo.domain` of every error the queue itself raises.
pub const ERROR_DOMAIN: &str = "queue.acurio.app";

/// Everything a call of this crate can fail with.
///
/// The RPC variants are decoded from the status the queue answered with (see
/// [`Error::from_status`]); [`Error::status`] keeps the original for anything not decoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The address is not a valid `host:port` or `http(s)://` URI, or the options contradict it.
    #[error("invalid queue address {address:?}: {reason}")]
    InvalidAddress {
        /// The address as given.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An `https://` address (or TLS options) in a build without a TLS feature: connecting
    /// would silently be plaintext, so it is refused.
    #[error(
        "{address} asks for TLS, but this build of acurio-queue-client has no TLS: enable its \
         `tls-ring` (or `tls-aws-lc`) feature, plus `tls-native-roots` or `tls-webpki-roots` \
         for public CAs"
    )]
    TlsNotEnabled {
        /// The address as given.
        address: String,
    },
    /// Connecting failed (refused, TLS handshake, DNS), for [`crate::CallbackClientBuilder::connect`].
    #[error("cannot connect to the queue: {0}")]
    Connect(#[source] tonic::transport::Error),
    /// `RUN_NOT_FOUND`: no job owns this run id.
    #[error("run not found: {message}")]
    RunNotFound {
        /// The service's message.
        message: String,
        /// The full status.
        status: Box<Status>,
    },
    /// `RUN_NOT_RELEASED`: the run's job is still queued (its held run was never released).
    #[error("run not released: {message}")]
    RunNotReleased {
        /// The service's message.
        message: String,
        /// The full status.
        status: Box<Status>,
    },
    /// `INVALID_REQUEST` (or any other INVALID_ARGUMENT): the request is malformed.
    #[error("invalid request: {}", describe_violations(message, violations))]
    InvalidRequest {
        /// The service's message.
        message: String,
        /// Every offending field (`google.rpc.BadRequest`).
        violations: Vec<FieldViolation>,
        /// The full status.
        status: Box<Status>,
    },
    /// The core refused the work: `CORE_REJECTED` from the queue's Admit (the core's CreateRun
    /// validation, passed through), or `RUN_REJECTED` from a core itself. The request was well
    /// formed; its content is not acceptable to the core (an unregistered DOI, an unparseable
    /// document). Nothing was charged.
    #[error("rejected by the core: {}", describe_violations(message, violations))]
    CoreRejected {
        /// The service's message.
        message: String,
        /// The fields the core named (`google.rpc.BadRequest`), e.g. `sources[1].doi`.
        violations: Vec<FieldViolation>,
        /// The full status.
        status: Box<Status>,
    },
    /// UNAUTHENTICATED: no valid bearer token or client certificate.
    #[error("unauthenticated: {message}")]
    Unauthenticated {
        /// The service's message.
        message: String,
        /// The full status.
        status: Box<Status>,
    },
    /// PERMISSION_DENIED: the caller's role may not call this method.
    #[error("permission denied: {message}")]
    PermissionDenied {
        /// The service's message.
        message: String,
        /// The full status.
        status: Box<Status>,
    },
    /// Transient: UNAVAILABLE (`SHUTTING_DOWN`, `DATABASE_UNAVAILABLE`, `LOCK_TIMEOUT`, a
    /// refused connection), DEADLINE_EXCEEDED or ABORTED (`CONFLICT`). The same call may be
    /// sent again; [`crate::CallbackClient`] already did, until its retry budget ran out.
    #[error("unavailable{}: {message}", reason_suffix(reason))]
    Unavailable {
        /// The ErrorInfo reason; empty for a transport failure or a deadline.
        reason: String,
        /// The service's (or transport's) message.
        message: String,
        /// The delay the service asked for (`google.rpc.RetryInfo`), if any.
        retry_delay: Option<Duration>,
        /// The full status.
        status: Box<Status>,
    },
    /// Any other status: see its code, reason and metadata.
    #[error("{code:?}{}: {message}", reason_suffix(reason))]
    Rpc {
        /// The status code.
        code: Code,
        /// The ErrorInfo reason; empty when the status carried none.
        reason: String,
        /// The service's message.
        message: String,
        /// The ErrorInfo metadata.
        metadata: HashMap<String, String>,
        /// The full status.
        status: Box<Status>,
    },
    /// The service answered, but without what the contract promises.
    #[error("contract violation: {0}")]
    ContractViolation(String),
}

fn reason_suffix(reason: &str) -> String {
    if reason.is_empty() {
        String::new()
    } else {
        format!(" ({reason})")
    }
}

fn describe_violations(message: &str, violations: &[FieldViolation]) -> String {
    if violations.is_empty() {
        return message.to_owned();
    }
    violations
        .iter()
        .map(|v| format!("{}: {}", v.field, v.description))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The queue's reason for a CreateRun rejection passed through to the Admit caller.
const CORE_REJECTED: &str = "CORE_REJECTED";
/// A core's own reason for rejecting CreateRun ([`core_errors::rejected`]).
const RUN_REJECTED: &str = "RUN_REJECTED";

fn field_violations(status: &Status) -> Vec<FieldViolation> {
    status
        .get_details_bad_request()
        .map(|b| b.field_violations)
        .unwrap_or_default()
}

/// The status codes after which the same call may be sent again.
pub(crate) fn is_transient(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable | Code::DeadlineExceeded | Code::Aborted
    )
}

impl Error {
    /// Decodes a failed call's status into the variant a caller matches on.
    pub fn from_status(status: Status) -> Self {
        let info = status.get_details_error_info();
        let reason = info.as_ref().map(|i| i.reason.clone()).unwrap_or_default();
        let message = status.message().to_owned();
        let code = status.code();
        match (code, reason.as_str()) {
            (Code::NotFound, "RUN_NOT_FOUND") => Self::RunNotFound {
                message,
                status: Box::new(status),
            },
            (Code::FailedPrecondition, "RUN_NOT_RELEASED") => Self::RunNotReleased {
                message,
                status: Box::new(status),
            },
            (Code::InvalidArgument, CORE_REJECTED | RUN_REJECTED) => Self::CoreRejected {
                message,
                violations: field_violations(&status),
                status: Box::new(status),
            },
            (Code::InvalidArgument, _) => Self::InvalidRequest {
                message,
                violations: field_violations(&status),
                status: Box::new(status),
            },
            (Code::Unauthenticated, _) => Self::Unauthenticated {
                message,
                status: Box::new(status),
            },
            (Code::PermissionDenied, _) => Self::PermissionDenied {
                message,
                status: Box::new(status),
            },
            (code, _) if is_transient(code) => Self::Unavailable {
                reason,
                message,
                retry_delay: status.get_details_retry_info().and_then(|r| r.retry_delay),
                status: Box::new(status),
            },
            _ => Self::Rpc {
                code,
                reason,
                message,
                metadata: info.map(|i| i.metadata).unwrap_or_default(),
                status: Box::new(status),
            },
        }
    }

    /// True when the same call may be sent again (a transient failure).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }

    /// The status the service answered with; `None` for errors raised before any call.
    pub fn status(&self) -> Option<&Status> {
        match self {
            Self::RunNotFound { status, .. }
            | Self::RunNotReleased { status, .. }
            | Self::InvalidRequest { status, .. }
            | Self::CoreRejected { status, .. }
            | Self::Unauthenticated { status, .. }
            | Self::PermissionDenied { status, .. }
            | Self::Unavailable { status, .. }
            | Self::Rpc { status, .. } => Some(status),
            _ => None,
        }
    }

    /// The `google.rpc.ErrorInfo` reason (for example `RUN_NOT_FOUND`); empty when none.
    pub fn reason(&self) -> String {
        self.status()
            .and_then(error_info)
            .map(|i| i.reason)
            .unwrap_or_default()
    }
}

impl From<Status> for Error {
    fn from(status: Status) -> Self {
        Self::from_status(status)
    }
}

/// The `google.rpc.ErrorInfo` of `status` (reason, domain, metadata), or `None` when the status
/// carries none (for example a transport error or a deadline hit on the client side).
///
/// `reason` is an UPPER_SNAKE_CASE value such as `RUN_NOT_FOUND`; `metadata` holds the dynamic
/// values (for `INSUFFICIENT_CREDITS`: `balance` and `required`, as decimal strings).
pub fn error_info(status: &Status) -> Option<ErrorInfo> {
    status.get_details_error_info()
}

/// Builders for the rich errors a core answers the queue with.
///
/// The queue passes a CreateRun rejection's field violations through to the Admit caller (as
/// `CORE_REJECTED` with the same `google.rpc.BadRequest`), and honours `RetryInfo` delays.
pub mod core_errors {
    use std::time::Duration;

    use tonic::{Code, Status};
    use tonic_types::{ErrorDetails, FieldViolation, StatusExt};

    /// The `google.rpc.ErrorInfo.domain` for errors a core raises.
    pub const CORE_ERROR_DOMAIN: &str = "core.acurio.app";

    /// INVALID_ARGUMENT with one `google.rpc.BadRequest` violation per offending field, e.g.
    /// `("sources[2].doi", "DOI 10.9999/x is not registered")`. Fields name the CreateRun request
    /// (`document_uri`, `sources[i].doi`, `sources[i].citation`).
    pub fn rejected<F, D>(
        message: impl Into<String>,
        violations: impl IntoIterator<Item = (F, D)>,
    ) -> Status
    where
        F: Into<String>,
        D: Into<String>,
    {
        let violations: Vec<FieldViolation> = violations
            .into_iter()
            .map(|(field, description)| FieldViolation::new(field, description))
            .collect();
        let mut details = ErrorDetails::with_error_info(super::RUN_REJECTED, CORE_ERROR_DOMAIN, []);
        if !violations.is_empty() {
            details.set_bad_request(violations);
        }
        Status::with_error_details(Code::InvalidArgument, message, details)
    }

    /// UNAVAILABLE with `google.rpc.RetryInfo`: the core cannot take work now; try again after
    /// `retry_after`.
    pub fn unavailable(message: impl Into<String>, retry_after: Duration) -> Status {
        let mut details = ErrorDetails::with_error_info("CORE_BUSY", CORE_ERROR_DOMAIN, []);
        details.set_retry_info(Some(retry_after));
        Status::with_error_details(Code::Unavailable, message, details)
    }

    /// RESOURCE_EXHAUSTED: the daily provider budget is used up (Admit answers
    /// `PROVIDER_BUDGET_EXHAUSTED`).
    pub fn budget_exhausted(message: impl Into<String>) -> Status {
        let details =
            ErrorDetails::with_error_info("PROVIDER_BUDGET_EXHAUSTED", CORE_ERROR_DOMAIN, []);
        Status::with_error_details(Code::ResourceExhausted, message, details)
    }

    /// NOT_FOUND for an unknown (or expired) run.
    pub fn run_not_found(run_id: &str) -> Status {
        let details = ErrorDetails::with_error_info(
            "RUN_NOT_FOUND",
            CORE_ERROR_DOMAIN,
            [("runId".to_owned(), run_id.to_owned())],
        );
        Status::with_error_details(Code::NotFound, format!("run {run_id} is unknown"), details)
    }

    /// FAILED_PRECONDITION: releasing a canceled run.
    pub fn run_canceled(run_id: &str) -> Status {
        let details = ErrorDetails::with_error_info(
            "RUN_CANCELED",
            CORE_ERROR_DOMAIN,
            [("runId".to_owned(), run_id.to_owned())],
        );
        Status::with_error_details(
            Code::FailedPrecondition,
            format!("run {run_id} was canceled"),
            details,
        )
    }
}

#[cfg(test)]
mod tests {
    use tonic_types::ErrorDetails;

    use super::*;

    #[test]
    fn a_core_rejection_carries_its_violations_and_decodes_as_core_rejected() {
        let status = core_errors::rejected(
            "1 source is not registered",
            [("sources[1].doi", "not registered")],
        );
        assert_eq!(status.code(), Code::InvalidArgument);
        match Error::from_status(status) {
            Error::CoreRejected { violations, .. } => {
                assert_eq!(violations.len(), 1);
                assert_eq!(violations[0].field, "sources[1].doi");
                assert_eq!(violations[0].description, "not registered");
            }
            other => panic!("expected CoreRejected, got {other:?}"),
        }
    }

    #[test]
    fn the_queues_core_rejected_is_core_rejected_and_other_invalid_arguments_invalid_request() {
        let queue_status = |reason: &str| {
            let mut details = ErrorDetails::with_error_info(reason, ERROR_DOMAIN, []);
            details.set_bad_request(vec![FieldViolation::new(
                "sources[0].doi",
                "not registered",
            )]);
            Status::with_error_details(Code::InvalidArgument, "refused", details)
        };
        let rejected = Error::from_status(queue_status("CORE_REJECTED"));
        assert!(
            matches!(rejected, Error::CoreRejected { .. }),
            "{rejected:?}"
        );
        assert_eq!(rejected.reason(), "CORE_REJECTED");
        assert!(!rejected.is_retryable());
        assert!(rejected.status().is_some());
        let malformed = Error::from_status(queue_status("INVALID_REQUEST"));
        assert!(
            matches!(malformed, Error::InvalidRequest { .. }),
            "{malformed:?}"
        );
        let bare = Error::from_status(Status::invalid_argument("no details"));
        assert!(matches!(bare, Error::InvalidRequest { .. }), "{bare:?}");
    }

    #[test]
    fn unavailable_is_retryable_with_its_delay() {
        let error =
            Error::from_status(core_errors::unavailable("busy", Duration::from_millis(250)));
        assert!(error.is_retryable());
        match error {
            Error::Unavailable {
                reason,
                retry_delay,
                ..
            } => {
                assert_eq!(reason, "CORE_BUSY");
                assert_eq!(retry_delay, Some(Duration::from_millis(250)));
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
        assert!(!Error::from_status(core_errors::run_not_found("r")).is_retryable());
        assert!(Error::from_status(Status::aborted("conflict")).is_retryable());
    }
}
