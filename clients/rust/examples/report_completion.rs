//! Reports a run as succeeded, the way the core does when it finishes judging.
//! Usage: `cargo run --example report_completion -- 127.0.0.1:50051 <run-id>`

use acurio_queue_client::acurio::queue::v1::RunOutcome;
use acurio_queue_client::{CallbackClient, error_info};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [addr, run_id] = args.as_slice() else {
        return Err("usage: report_completion <host:port> <run-id>".into());
    };
    let mut client = CallbackClient::connect(addr).await?;
    match client
        .complete_run(run_id, RunOutcome::Succeeded, false, "")
        .await
    {
        Ok(job) => println!("job {} is {}", job.job_id, job.status().as_str_name()),
        Err(status) => match error_info(&status) {
            Some((reason, domain, _)) => {
                return Err(format!("{:?}: {reason} ({domain})", status.code()).into());
            }
            None => return Err(status.into()),
        },
    }
    Ok(())
}
