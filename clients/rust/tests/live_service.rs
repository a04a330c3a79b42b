//! Tests against a LIVE queue service whose address is in `QUEUE_ADDR` (for example
//! `127.0.0.1:50051`, as started by `queue-service dev`). Without `QUEUE_ADDR` every test fails:
//! a skipped contract check must not look like a passing one.

use acurio_queue_client::acurio::queue::v1::RunOutcome;
use acurio_queue_client::tonic::Code;
use acurio_queue_client::{CallbackClient, ERROR_DOMAIN, error_info};
use uuid::Uuid;

/// Connects to the service named by `QUEUE_ADDR`, failing the test with the reason if it cannot.
async fn callback_client() -> CallbackClient {
    let addr = match std::env::var("QUEUE_ADDR") {
        Ok(addr) if !addr.trim().is_empty() => addr,
        _ => panic!(
            "QUEUE_ADDR is not set: these tests need a live queue service. Start one \
             (e.g. `QUEUE_LISTEN_ADDR=127.0.0.1:50051 queue-service dev`) and run \
             `QUEUE_ADDR=127.0.0.1:50051 cargo test`."
        ),
    };
    CallbackClient::connect(&addr)
        .await
        .unwrap_or_else(|err| panic!("cannot connect to the queue at QUEUE_ADDR={addr}: {err:?}"))
}

#[tokio::test]
async fn complete_run_for_a_never_admitted_run_is_run_not_found() {
    let mut client = callback_client().await;
    let run_id = Uuid::new_v4().to_string();

    let status = client
        .complete_run(&run_id, RunOutcome::Succeeded, false, "")
        .await
        .expect_err("CompleteRun for a run that was never admitted must fail");

    assert_eq!(status.code(), Code::NotFound, "run_id={run_id}: {status:?}");
    let (reason, domain, _metadata) =
        error_info(&status).unwrap_or_else(|| panic!("no ErrorInfo in {status:?}"));
    assert_eq!(reason, "RUN_NOT_FOUND", "{status:?}");
    assert_eq!(domain, ERROR_DOMAIN, "{status:?}");
}

#[tokio::test]
async fn complete_run_with_a_malformed_run_id_is_invalid_request() {
    let mut client = callback_client().await;

    let status = client
        .complete_run("not-a-uuid", RunOutcome::Succeeded, false, "")
        .await
        .expect_err("CompleteRun with a malformed run id must fail");

    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let (reason, domain, _metadata) =
        error_info(&status).unwrap_or_else(|| panic!("no ErrorInfo in {status:?}"));
    assert_eq!(reason, "INVALID_REQUEST", "{status:?}");
    assert_eq!(domain, ERROR_DOMAIN, "{status:?}");
}
