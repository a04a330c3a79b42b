//! Rust client for the Acurio analysis queue, and the server side a Rust core implements.
//!
//! - [`CallbackClient`] (built with [`CallbackClient::builder`]): what the core calls when a run
//!   has finished (`CompleteRun`), with TLS/mTLS (features `tls-ring` / `tls-aws-lc`, plus
//!   `tls-native-roots` / `tls-webpki-roots`), a bearer token, keepalive, lazy connect, and
//!   retries with jittered backoff inside an overall budget ([`RetryPolicy`]).
//! - [`run_service_server`]: the `RunService` server trait the core implements for the queue;
//!   [`core_errors`] builds the rich errors it answers with (per-source violations, RetryInfo).
//! - [`Error`]: every failure as one enum (`RunNotFound`, `InvalidRequest { violations }`,
//!   `CoreRejected { violations }`, `Unavailable { retry_delay }`, ...), decoded from the
//!   status details.
//! - [`acurio::queue::v1`] and [`acurio::core::v1`]: every message, client and server generated
//!   at build time from the contract (the same protos the Python service serves).

mod callback;
mod errors;

/// Generated code, one module per protobuf package.
// The doc comments are copied from the .proto files, whose wrapped list items clippy would flag.
#[allow(clippy::doc_lazy_continuation)]
pub mod acurio {
    /// Package `acurio.queue.*`: the services the queue serves.
    pub mod queue {
        /// Package `acurio.queue.v1`: `AnalysisQueueService`, `CoreCallbackService`,
        /// `CreditsService` and their messages.
        pub mod v1 {
            tonic::include_proto!("acurio.queue.v1");
        }
    }

    /// Package `acurio.core.*`: the contract the Rust core serves to the queue.
    pub mod core {
        /// Package `acurio.core.v1`: `RunService` and its messages.
        pub mod v1 {
            tonic::include_proto!("acurio.core.v1");
        }
    }
}

pub use acurio::core::v1::run_service_server;
pub use acurio::queue::v1::core_callback_service_client::CoreCallbackServiceClient;
pub use callback::{CallbackClient, CallbackClientBuilder, Completion, RetryPolicy};
pub use errors::{ERROR_DOMAIN, Error, ErrorInfo, FieldViolation, core_errors, error_info};

/// The tonic version this crate was generated against, so callers need not match it by hand.
pub use tonic;
/// The rich-error types (`ErrorDetails`, `StatusExt`) this crate builds and reads errors with.
pub use tonic_types;
