//! Tests against a LIVE queue service whose address is in `QUEUE_ADDR` (for example
//! `127.0.0.1:50051`, as started by `queue-service dev`). Without `QUEUE_ADDR` the tests that
//! need the service skip, each saying so on stderr, so a plain `cargo test` is green; with
//! `QUEUE_LIVE_TESTS=required` (CI sets it) a missing `QUEUE_ADDR` fails them instead, since a
//! skipped contract check must not pass for one that ran.

use std::time::{Duration, Instant};

use acurio_queue_client::acurio::queue::v1::analysis_queue_service_client::AnalysisQueueServiceClient;
use acurio_queue_client::acurio::queue::v1::credits_service_client::CreditsServiceClient;
use acurio_queue_client::acurio::queue::v1::{AdmitRequest, Document, GrantCreditsRequest, Source};
use acurio_queue_client::tonic::Code;
use acurio_queue_client::{
    CallbackClient, Completion, ERROR_DOMAIN, Error, RetryPolicy, error_info,
};
use uuid::Uuid;

/// The live service's address, or None (the test skips) when `QUEUE_ADDR` is unset.
fn queue_addr(test: &str) -> Option<String> {
    match std::env::var("QUEUE_ADDR") {
        Ok(addr) if !addr.trim().is_empty() => Some(addr),
        _ if std::env::var("QUEUE_LIVE_TESTS").as_deref() == Ok("required") => panic!(
            "QUEUE_ADDR is not set and QUEUE_LIVE_TESTS=required: {test} needs a live queue service"
        ),
        _ => {
            eprintln!(
                "skipped {test}: QUEUE_ADDR is not set. Start a queue \
                 (`QUEUE_LISTEN_ADDR=127.0.0.1:50051 queue-service dev`) and run \
                 `QUEUE_ADDR=127.0.0.1:50051 cargo test --test live_service`."
            );
            None
        }
    }
}

/// Connects to the service named by `QUEUE_ADDR` (None: skip), failing the test with the reason
/// if it cannot.
async fn callback_client(test: &str) -> Option<CallbackClient> {
    let addr = queue_addr(test)?;
    Some(
        CallbackClient::connect(addr.clone())
            .await
            .unwrap_or_else(|err| panic!("cannot connect to the queue at QUEUE_ADDR={addr}: {err:?}")),
    )
}

#[tokio::test]
async fn complete_run_for_a_never_admitted_run_is_run_not_found() {
    let Some(client) = callback_client("complete_run_for_a_never_admitted_run_is_run_not_found").await else {
        return;
    };
    let run_id = Uuid::new_v4().to_string();

    let error = client
        .complete_run(&run_id, Completion::succeeded())
        .await
        .expect_err("CompleteRun for a run that was never admitted must fail");

    assert!(
        matches!(error, Error::RunNotFound { .. }),
        "run_id={run_id}: {error:?}"
    );
    assert!(!error.is_retryable());
    let status = error.status().expect("an RPC error keeps its status");
    assert_eq!(status.code(), Code::NotFound);
    let info = error_info(status).unwrap_or_else(|| panic!("no ErrorInfo in {status:?}"));
    assert_eq!(info.reason, "RUN_NOT_FOUND");
    assert_eq!(info.domain, ERROR_DOMAIN);
    assert_eq!(info.metadata.get("runId"), Some(&run_id));
}

#[tokio::test]
async fn complete_run_with_a_malformed_run_id_is_invalid_request_with_its_violation() {
    let Some(client) =
        callback_client("complete_run_with_a_malformed_run_id_is_invalid_request_with_its_violation").await
    else {
        return;
    };

    let error = client
        .complete_run("not-a-uuid", Completion::failed("boom").refunded())
        .await
        .expect_err("CompleteRun with a malformed run id must fail");

    match &error {
        Error::InvalidRequest { violations, .. } => {
            assert!(
                violations.iter().any(|v| v.field == "run_id"),
                "{violations:?}"
            );
        }
        other => panic!("expected InvalidRequest, got {other:?}"),
    }
    assert_eq!(error.reason(), "INVALID_REQUEST");
}

#[tokio::test]
async fn an_admit_the_core_rejects_is_core_rejected_not_invalid_request() {
    // The dev core rejects CreateRun for a DOI under 10.9999/ (the README's test inputs); a
    // real core answers the same for a DOI it cannot resolve: a well-formed request refused.
    let Some(addr) = queue_addr("an_admit_the_core_rejects_is_core_rejected_not_invalid_request") else {
        return;
    };
    let endpoint = format!("http://{addr}");
    let user_id = format!("rust-{}", Uuid::new_v4());
    let mut credits = CreditsServiceClient::connect(endpoint.clone())
        .await
        .unwrap_or_else(|err| panic!("cannot connect to the queue at QUEUE_ADDR={addr}: {err:?}"));
    credits
        .grant_credits(GrantCreditsRequest {
            user_id: user_id.clone(),
            amount: 1,
            idempotency_key: format!("grant-{user_id}"),
            note: String::new(),
        })
        .await
        .expect("GrantCredits");
    let mut queue = AnalysisQueueServiceClient::connect(endpoint).await.expect("connect");

    let status = queue
        .admit(AdmitRequest {
            user_id: user_id.clone(),
            idempotency_key: "click-1".into(),
            document: Some(Document { uri: "s3://theses/x.pdf".into(), title: String::new() }),
            sources: vec![Source { doi: "10.9999/unregistered".into(), citation: String::new() }],
            delta_of_job_id: String::new(),
        })
        .await
        .expect_err("the dev core rejects a DOI under 10.9999/");

    let error = Error::from(status);
    match &error {
        Error::CoreRejected { violations, .. } => {
            assert!(violations.iter().any(|v| v.field == "sources[0].doi"), "{violations:?}");
        }
        other => panic!("expected CoreRejected, got {other:?}"),
    }
    assert_eq!(error.reason(), "CORE_REJECTED");
    assert!(error.to_string().starts_with("rejected by the core: sources[0].doi"), "{error}");
}

#[tokio::test]
async fn a_call_to_a_closed_port_is_retried_until_the_budget_and_then_unavailable() {
    // A port nothing listens on: every attempt is refused, the budget decides.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = listener.local_addr().unwrap();
    drop(listener);
    let budget = Duration::from_millis(1500);
    let client = CallbackClient::builder(closed.to_string())
        .retry_policy(RetryPolicy {
            max_attempts: 100,
            budget,
            ..RetryPolicy::default()
        })
        .connect_lazy()
        .unwrap();
    let started = Instant::now();
    let error = client
        .complete_run(Uuid::new_v4().to_string(), Completion::succeeded())
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(error.is_retryable(), "{error:?}");
    assert!(
        took >= Duration::from_millis(500),
        "gave up after {took:?}: not retried"
    );
    assert!(
        took <= budget + Duration::from_secs(2),
        "overran the budget: {took:?}"
    );
}
