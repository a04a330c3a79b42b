//! TLS against a LIVE TLS-enabled queue: `QUEUE_TLS_ADDR` (host:port) and `QUEUE_TLS_CA_FILE`
//! (its CA, PEM). Built without a TLS feature it checks the refusal of `https://`; built with
//! `--features tls-ring` it checks a verified TLS connection (and that plaintext gets nowhere).
//! Without those two variables it skips, saying so (see tests/live_service.rs).

use acurio_queue_client::{CallbackClient, Error};
#[cfg(feature = "_tls")]
use {
    acurio_queue_client::{Completion, RetryPolicy},
    uuid::Uuid,
};

#[tokio::test]
async fn an_https_address_without_tls_is_refused_and_with_tls_reaches_a_tls_service() {
    // CI sets QUEUE_TLS_ADDR (a TLS-enabled `queue-service dev`) and QUEUE_TLS_CA_FILE, and
    // QUEUE_LIVE_TESTS=required; without them a plain `cargo test` skips this test and says so.
    let (Ok(tls_addr), Ok(ca_file)) = (std::env::var("QUEUE_TLS_ADDR"), std::env::var("QUEUE_TLS_CA_FILE")) else {
        assert!(
            std::env::var("QUEUE_LIVE_TESTS").as_deref() != Ok("required"),
            "QUEUE_TLS_ADDR and QUEUE_TLS_CA_FILE are not set and QUEUE_LIVE_TESTS=required"
        );
        eprintln!(
            "skipped tls_live: QUEUE_TLS_ADDR (host:port of a TLS-enabled queue) and \
             QUEUE_TLS_CA_FILE (its CA, PEM) are not set"
        );
        return;
    };
    let https = format!("https://{tls_addr}");

    #[cfg(not(feature = "_tls"))]
    {
        let _ = ca_file;
        let error = CallbackClient::builder(&https).connect_lazy().unwrap_err();
        assert!(matches!(error, Error::TlsNotEnabled { .. }), "{error:?}");
    }
    #[cfg(feature = "_tls")]
    {
        let ca = std::fs::read(&ca_file).unwrap_or_else(|e| panic!("{ca_file}: {e}"));
        let client = CallbackClient::builder(&https)
            .ca_certificate_pem(ca)
            .connect()
            .await
            .unwrap_or_else(|e| panic!("TLS connect to {https}: {e:?}"));
        let error = client
            .complete_run(Uuid::new_v4().to_string(), Completion::succeeded())
            .await
            .unwrap_err();
        assert!(
            matches!(error, Error::RunNotFound { .. }),
            "over TLS: {error:?}"
        );
        // Plaintext to a TLS listener gets no answer from the service, only a transport error
        // (which one varies: a refused handshake, a broken pipe).
        let plain = CallbackClient::builder(&tls_addr)
            .retry_policy(RetryPolicy::none())
            .connect_lazy()
            .unwrap();
        let error = plain
            .complete_run(Uuid::new_v4().to_string(), Completion::succeeded())
            .await
            .unwrap_err();
        assert!(
            error.reason().is_empty(),
            "plaintext to TLS got a service answer: {error:?}"
        );
    }
}
