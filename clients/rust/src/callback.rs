//! A thin wrapper over the generated `CoreCallbackService` client for the core's one call.

use std::time::Duration;

use tonic::Status;
use tonic::transport::{Channel, Endpoint};

use crate::acurio::queue::v1::core_callback_service_client::CoreCallbackServiceClient;
use crate::acurio::queue::v1::{CompleteRunRequest, Job, RunOutcome};

/// How long establishing the connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default deadline of each call, sent to the service as `grpc-timeout`.
const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Reports finished runs to the queue's `CoreCallbackService`.
///
/// Cloning is cheap and clones share one connection.
#[derive(Debug, Clone)]
pub struct CallbackClient {
    inner: CoreCallbackServiceClient<Channel>,
    call_timeout: Duration,
}

impl CallbackClient {
    /// Connects to the queue at `addr`, either `host:port` (plaintext HTTP/2) or a full URI
    /// such as `http://host:port` or `https://host:port`.
    pub async fn connect(addr: impl AsRef<str>) -> Result<Self, tonic::transport::Error> {
        let addr = addr.as_ref();
        let uri = if addr.contains("://") {
            addr.to_owned()
        } else {
            format!("http://{addr}")
        };
        let channel = Endpoint::from_shared(uri)?
            .connect_timeout(CONNECT_TIMEOUT)
            .connect()
            .await?;
        Ok(Self::from_channel(channel))
    }

    /// Wraps an existing channel (for custom TLS, load balancing or interceptors).
    pub fn from_channel(channel: Channel) -> Self {
        Self {
            inner: CoreCallbackServiceClient::new(channel),
            call_timeout: DEFAULT_CALL_TIMEOUT,
        }
    }

    /// Sets the deadline of each later call (default 10 s).
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Reports that the run `run_id` ended with `outcome`; `refund_credit` gives the user the
    /// charge back; `message` is a short user-safe text (stored as `last_error` on failure).
    ///
    /// Returns the job that owned the run, as it is after the call. Idempotent on the service
    /// side, so a retry after a lost answer is safe. On error, [`crate::error_info`] gives the
    /// reason (for example `RUN_NOT_FOUND`, `INVALID_REQUEST`, `RUN_NOT_RELEASED`).
    pub async fn complete_run(
        &mut self,
        run_id: impl Into<String>,
        outcome: RunOutcome,
        refund_credit: bool,
        message: impl Into<String>,
    ) -> Result<Job, Status> {
        let mut request = tonic::Request::new(CompleteRunRequest {
            run_id: run_id.into(),
            outcome: outcome.into(),
            refund_credit,
            message: message.into(),
        });
        request.set_timeout(self.call_timeout);
        let response = self.inner.complete_run(request).await?.into_inner();
        // The contract always sets `job`; say so plainly if a service ever does not.
        response.job.ok_or_else(|| {
            Status::internal("CompleteRunResponse carried no job (contract violation)")
        })
    }

    /// The generated client, for calls this wrapper does not cover.
    pub fn inner(&mut self) -> &mut CoreCallbackServiceClient<Channel> {
        &mut self.inner
    }
}
