//! Rust client for the Acurio analysis queue.
//!
//! - [`acurio::queue::v1`] and [`acurio::core::v1`]: every message, client and server generated
//!   at build time from `protos/` (the same contract the Python service serves).
//! - [`CallbackClient`]: what the core calls when a run has finished (`CompleteRun`).
//! - [`run_service_server`]: the `RunService` server trait the core implements for the queue.
//! - [`error_info`]: the `google.rpc.ErrorInfo` (reason, domain, metadata) of a failed call.

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
pub use callback::CallbackClient;
pub use errors::{ERROR_DOMAIN, error_info};

/// The tonic version this crate was generated against, so callers need not match it by hand.
pub use tonic;
