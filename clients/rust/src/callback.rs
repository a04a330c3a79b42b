//! The core's client for the queue's `CoreCallbackService`: TLS, bearer token, keepalive, lazy
//! connect, and `CompleteRun` retried with jittered backoff inside an overall budget.

use std::time::{Duration, Instant};

use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};

use crate::Error;
use crate::acurio::queue::v1::core_callback_service_client::CoreCallbackServiceClient;
use crate::acurio::queue::v1::{CompleteRunRequest, Job, RunOutcome};
use crate::errors::is_transient;

/// How a run ended, for [`CallbackClient::complete_run`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// Succeeded or failed (never `Unspecified`: the service rejects it).
    pub outcome: RunOutcome,
    /// Give the user their credit back (for failures that are not the user's fault).
    pub refund_credit: bool,
    /// A short, user-safe message (stored as the job's `last_error` on failure).
    pub message: String,
    /// The W3C `traceparent` of the caller's span, sent on every attempt so the queue's trace
    /// continues the core's.
    pub traceparent: Option<String>,
}

impl Completion {
    /// The run produced its verdicts.
    pub fn succeeded() -> Self {
        Self {
            outcome: RunOutcome::Succeeded,
            refund_credit: false,
            message: String::new(),
            traceparent: None,
        }
    }

    /// The run could not finish; `message` is shown to the user. The charge is kept unless
    /// [`Completion::refunded`] is added.
    pub fn failed(message: impl Into<String>) -> Self {
        Self {
            outcome: RunOutcome::Failed,
            refund_credit: false,
            message: message.into(),
            traceparent: None,
        }
    }

    /// Gives the user the charge back.
    pub fn refunded(mut self) -> Self {
        self.refund_credit = true;
        self
    }

    /// Continues the trace `traceparent` (W3C trace context) at the queue.
    pub fn with_traceparent(mut self, traceparent: impl Into<String>) -> Self {
        self.traceparent = Some(traceparent.into());
        self
    }
}

/// How [`CallbackClient::complete_run`] retries transient failures (UNAVAILABLE,
/// DEADLINE_EXCEEDED, ABORTED): exponential backoff with full jitter, never shorter than a
/// `RetryInfo` delay the service sent, and never past `budget` from the first attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// At most this many attempts in all (1 = no retry).
    pub max_attempts: u32,
    /// The first backoff's upper bound; doubled after every attempt.
    pub initial_backoff: Duration,
    /// The cap on one backoff.
    pub max_backoff: Duration,
    /// The overall time from the first attempt after which no attempt starts.
    pub budget: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            budget: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// One attempt only.
    pub fn none() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// The pause before attempt `attempt + 1` (attempt counts from 1): uniform in
    /// `[0, min(max_backoff, initial_backoff * 2^(attempt-1))]`, at least `floor`.
    fn backoff(&self, attempt: u32, floor: Option<Duration>) -> Duration {
        let exponent = attempt.saturating_sub(1).min(20);
        let ceiling = self
            .initial_backoff
            .saturating_mul(1 << exponent)
            .min(self.max_backoff);
        let jittered = ceiling.mul_f64(fastrand::f64());
        jittered.max(floor.unwrap_or_default())
    }
}

/// Builds a [`CallbackClient`]: address, TLS, bearer token, timeouts, keepalive, retries.
#[derive(Debug, Clone)]
pub struct CallbackClientBuilder {
    address: String,
    bearer_token: Option<String>,
    connect_timeout: Duration,
    call_timeout: Duration,
    keepalive: Option<Duration>,
    retry: RetryPolicy,
    #[cfg(feature = "_tls")]
    tls: TlsOptions,
}

#[cfg(feature = "_tls")]
#[derive(Debug, Clone, Default)]
struct TlsOptions {
    ca_pem: Option<Vec<u8>>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    domain_name: Option<String>,
}

impl CallbackClientBuilder {
    fn new(address: impl Into<String>) -> Self {
        Self {
            address: address.into(),
            bearer_token: None,
            connect_timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(10),
            keepalive: Some(Duration::from_secs(30)),
            retry: RetryPolicy::default(),
            #[cfg(feature = "_tls")]
            tls: TlsOptions::default(),
        }
    }

    /// Sends `authorization: Bearer <token>` on every call (the queue's `QUEUE_AUTH_FILE`).
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        self.bearer_token = Some(token.into());
        self
    }

    /// How long establishing the connection may take (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The deadline of each attempt, sent as `grpc-timeout` (default 10 s).
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// HTTP/2 keepalive pings every `interval` (default 30 s), so a half-open connection is
    /// noticed; `None` turns them off.
    pub fn keepalive(mut self, interval: Option<Duration>) -> Self {
        self.keepalive = interval;
        self
    }

    /// How `complete_run` retries transient failures (default: [`RetryPolicy::default`]).
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Trusts this PEM CA bundle (a private CA) for an `https://` address.
    #[cfg(feature = "_tls")]
    pub fn ca_certificate_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca_pem = Some(pem.into());
        self
    }

    /// Presents this PEM certificate chain and key (mutual TLS: the queue's client CA).
    #[cfg(feature = "_tls")]
    pub fn client_identity_pem(
        mut self,
        cert: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.identity = Some((cert.into(), key.into()));
        self
    }

    /// The name the server certificate must carry, when it differs from the address's host.
    #[cfg(feature = "_tls")]
    pub fn tls_domain_name(mut self, name: impl Into<String>) -> Self {
        self.tls.domain_name = Some(name.into());
        self
    }

    fn endpoint(&self) -> Result<Endpoint, Error> {
        let address = self.address.trim();
        let invalid = |reason: &str| Error::InvalidAddress {
            address: address.to_owned(),
            reason: reason.to_owned(),
        };
        if address.is_empty() {
            return Err(invalid(
                "empty (expected host:port, http://host:port or https://host:port)",
            ));
        }
        let uri = if address.contains("://") {
            address.to_owned()
        } else {
            format!("http://{address}")
        };
        let https = uri.starts_with("https://");
        if !https && !uri.starts_with("http://") {
            return Err(invalid("the scheme must be http or https"));
        }
        let mut endpoint = Endpoint::from_shared(uri).map_err(|e| invalid(&e.to_string()))?;
        endpoint = endpoint.connect_timeout(self.connect_timeout);
        if let Some(interval) = self.keepalive {
            endpoint = endpoint
                .http2_keep_alive_interval(interval)
                .keep_alive_timeout(Duration::from_secs(20))
                .keep_alive_while_idle(true);
        }
        #[cfg(not(feature = "_tls"))]
        if https {
            return Err(Error::TlsNotEnabled {
                address: address.to_owned(),
            });
        }
        #[cfg(feature = "_tls")]
        {
            let wants_tls = self.tls.ca_pem.is_some()
                || self.tls.identity.is_some()
                || self.tls.domain_name.is_some();
            if wants_tls && !https {
                return Err(invalid(
                    "TLS options are set but the address is not https://",
                ));
            }
            if https {
                use tonic::transport::{Certificate, ClientTlsConfig, Identity};
                let mut tls = ClientTlsConfig::new().with_enabled_roots();
                if let Some(pem) = &self.tls.ca_pem {
                    tls = tls.ca_certificate(Certificate::from_pem(pem));
                }
                if let Some((cert, key)) = &self.tls.identity {
                    tls = tls.identity(Identity::from_pem(cert, key));
                }
                if let Some(name) = &self.tls.domain_name {
                    tls = tls.domain_name(name.clone());
                }
                endpoint = endpoint.tls_config(tls).map_err(Error::Connect)?;
            }
        }
        Ok(endpoint)
    }

    fn authorization(&self) -> Result<Option<MetadataValue<Ascii>>, Error> {
        self.bearer_token
            .as_deref()
            .map(|token| {
                format!("Bearer {token}")
                    .parse()
                    .map_err(|_| Error::InvalidAddress {
                        address: self.address.clone(),
                        reason: "the bearer token is not a valid header value".to_owned(),
                    })
            })
            .transpose()
    }

    /// Connects now; fails if the queue cannot be reached (or the TLS handshake fails).
    pub async fn connect(self) -> Result<CallbackClient, Error> {
        let channel = self.endpoint()?.connect().await.map_err(Error::Connect)?;
        self.finish(channel)
    }

    /// Connects on the first call (and reconnects after the connection drops), so a core can
    /// start before the queue does; a call while the queue is down is retried per the policy.
    pub fn connect_lazy(self) -> Result<CallbackClient, Error> {
        let channel = self.endpoint()?.connect_lazy();
        self.finish(channel)
    }

    fn finish(self, channel: Channel) -> Result<CallbackClient, Error> {
        Ok(CallbackClient {
            authorization: self.authorization()?,
            inner: CoreCallbackServiceClient::new(channel),
            call_timeout: self.call_timeout,
            retry: self.retry,
        })
    }
}

/// Reports finished runs to the queue's `CoreCallbackService`.
///
/// Cloning is cheap and clones share one connection; calls take `&self`.
#[derive(Debug, Clone)]
pub struct CallbackClient {
    inner: CoreCallbackServiceClient<Channel>,
    authorization: Option<MetadataValue<Ascii>>,
    call_timeout: Duration,
    retry: RetryPolicy,
}

impl CallbackClient {
    /// A builder for the queue at `address`: `host:port` (plaintext), `http://host:port`, or
    /// `https://host:port` (needs a TLS feature; refused with [`Error::TlsNotEnabled`] otherwise).
    pub fn builder(address: impl Into<String>) -> CallbackClientBuilder {
        CallbackClientBuilder::new(address)
    }

    /// Connects with the defaults; shorthand for `CallbackClient::builder(address).connect()`.
    pub async fn connect(address: impl Into<String>) -> Result<Self, Error> {
        Self::builder(address).connect().await
    }

    /// Wraps an existing channel (for load balancing or a custom connector), with the default
    /// timeouts and retry policy and no bearer token.
    pub fn from_channel(channel: Channel) -> Self {
        CallbackClientBuilder::new("")
            .finish(channel)
            .expect("no bearer token, so no header to reject")
    }

    /// Reports that the run `run_id` ended as `completion` says, and returns the job that owned
    /// the run as it is after the call.
    ///
    /// Idempotent at the queue, so transient failures (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED,
    /// a refused connection) are retried per the [`RetryPolicy`]; the last one is returned as
    /// [`Error::Unavailable`]. `RUN_NOT_FOUND`, `INVALID_REQUEST` and `RUN_NOT_RELEASED` are
    /// returned at once.
    pub async fn complete_run(
        &self,
        run_id: impl Into<String>,
        completion: Completion,
    ) -> Result<Job, Error> {
        let request = CompleteRunRequest {
            run_id: run_id.into(),
            outcome: completion.outcome.into(),
            refund_credit: completion.refund_credit,
            message: completion.message,
        };
        let traceparent: Option<MetadataValue<Ascii>> = match completion.traceparent.as_deref() {
            Some(value) => Some(value.parse().map_err(|_| {
                Error::ContractViolation(format!(
                    "traceparent {value:?} is not a valid header value"
                ))
            })?),
            None => None,
        };
        let started = Instant::now();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let remaining = self.retry.budget.saturating_sub(started.elapsed());
            let mut call = tonic::Request::new(request.clone());
            call.set_timeout(
                self.call_timeout
                    .min(remaining.max(Duration::from_millis(1))),
            );
            if let Some(value) = &self.authorization {
                call.metadata_mut().insert("authorization", value.clone());
            }
            if let Some(value) = &traceparent {
                call.metadata_mut().insert("traceparent", value.clone());
            }
            let status = match self.inner.clone().complete_run(call).await {
                Ok(response) => {
                    return response.into_inner().job.ok_or_else(|| {
                        Error::ContractViolation("CompleteRunResponse carried no job".to_owned())
                    });
                }
                Err(status) => status,
            };
            if !is_transient(status.code()) || attempt >= self.retry.max_attempts {
                return Err(Error::from_status(status));
            }
            let floor = Error::from_status(status.clone());
            let floor = match &floor {
                Error::Unavailable { retry_delay, .. } => *retry_delay,
                _ => None,
            };
            let remaining = self.retry.budget.saturating_sub(started.elapsed());
            // A jittered pause longer than what is left of the budget is cut short (to half of
            // it), so the budget is spent on attempts instead of given up early; a RetryInfo delay
            // the budget cannot honour ends the retries.
            if remaining < Duration::from_millis(10) || floor.is_some_and(|delay| delay >= remaining) {
                return Err(Error::from_status(status));
            }
            let pause = self.retry.backoff(attempt, floor).min(remaining / 2).max(floor.unwrap_or_default());
            tokio::time::sleep(pause).await;
        }
    }

    /// The generated client, for calls this wrapper does not cover.
    pub fn inner(&self) -> CoreCallbackServiceClient<Channel> {
        self.inner.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_stays_within_its_cap_and_honours_the_floor() {
        let policy = RetryPolicy::default();
        for attempt in 1..30 {
            let pause = policy.backoff(attempt, None);
            assert!(pause <= policy.max_backoff, "attempt {attempt}: {pause:?}");
        }
        assert!(policy.backoff(1, None) <= Duration::from_millis(100));
        assert!(policy.backoff(1, Some(Duration::from_secs(2))) >= Duration::from_secs(2));
    }

    #[cfg(not(feature = "_tls"))]
    #[tokio::test]
    async fn https_without_a_tls_feature_is_refused_instead_of_going_plaintext() {
        let error = CallbackClient::builder("https://127.0.0.1:1")
            .connect_lazy()
            .unwrap_err();
        assert!(matches!(error, Error::TlsNotEnabled { .. }), "{error:?}");
        assert!(error.to_string().contains("tls-ring"), "{error}");
        // Plaintext stays possible.
        CallbackClient::builder("127.0.0.1:1")
            .connect_lazy()
            .expect("plaintext address");
    }

    #[tokio::test]
    async fn a_bad_address_is_refused_with_the_reason() {
        for address in ["", "ftp://host:1"] {
            let error = CallbackClient::builder(address).connect_lazy().unwrap_err();
            assert!(
                matches!(error, Error::InvalidAddress { .. }),
                "{address:?}: {error:?}"
            );
        }
    }
}
