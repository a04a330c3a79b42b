//! Reading the structured error details the queue attaches to every failed call.

use std::collections::HashMap;

use tonic::Status;
use tonic_types::StatusExt;

/// The `google.rpc.ErrorInfo.domain` of every error the queue itself raises.
pub const ERROR_DOMAIN: &str = "queue.acurio.app";

/// Returns the `google.rpc.ErrorInfo` of `status` as `(reason, domain, metadata)`, or `None`
/// when the status carries none (for example a transport error or a deadline hit on the
/// client side).
///
/// `reason` is an UPPER_SNAKE_CASE value such as `RUN_NOT_FOUND`; `metadata` holds the dynamic
/// values (for `INSUFFICIENT_CREDITS`: `balance` and `required`, as decimal strings).
pub fn error_info(status: &Status) -> Option<(String, String, HashMap<String, String>)> {
    status
        .get_details_error_info()
        .map(|info| (info.reason, info.domain, info.metadata))
}
