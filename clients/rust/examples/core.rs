//! A small, complete core: the template a Rust core team copies.
//!
//! It serves the queue's `RunService` (CreateRun held or not, ReleaseRun, CancelRun, GetRun,
//! ListRuns), "judges" a released run for a configurable time, and reports the result with
//! `CompleteRun` (retried across a queue outage by `CallbackClient`). It keeps what each run was
//! created with (`Run.creation`: the queue's job id, idempotency key, digest and price among it)
//! and lists its live runs with it, so the queue can adopt runs its database lost in a failover.
//!
//! ```sh
//! CORE_LISTEN_ADDR=127.0.0.1:50061 QUEUE_CALLBACK_ADDR=127.0.0.1:50051 \
//!   CORE_JUDGING_SECONDS=2 cargo run --example core
//! # then start the queue with QUEUE_CORE_ADDR=127.0.0.1:50061
//! ```
//!
//! Settings (environment): `CORE_LISTEN_ADDR` (default `127.0.0.1:50061`),
//! `QUEUE_CALLBACK_ADDR` (the queue, default `127.0.0.1:50051`; `https://` needs a TLS feature),
//! `QUEUE_CALLBACK_TOKEN` (a bearer token, when the queue has `QUEUE_AUTH_FILE`),
//! `CORE_JUDGING_SECONDS` (default 2, decimals allowed).
//! Like the queue's dev core, it rejects DOIs under `10.9999/` (one violation per source) and
//! the document `s3://theses/unparseable.pdf`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acurio_queue_client::acurio::core::v1::{
    CancelRunRequest, CancelRunResponse, CreateRunRequest, CreateRunResponse, GetRunRequest,
    GetRunResponse, ListRunsRequest, ListRunsResponse, ReleaseRunRequest, ReleaseRunResponse, Run,
    RunState,
};
use acurio_queue_client::run_service_server::{RunService, RunServiceServer};
use acurio_queue_client::tonic::transport::server::TcpIncoming;
use acurio_queue_client::tonic::{self, Request, Response, Status};
use acurio_queue_client::{CallbackClient, Completion, core_errors};

/// The core's memory of its runs. A real core keeps this in its own database.
#[derive(Clone)]
struct Core {
    runs: Arc<Mutex<HashMap<String, Run>>>,
    callback: CallbackClient,
    judging: Duration,
}

impl Core {
    fn run(&self, run_id: &str) -> Option<Run> {
        self.runs.lock().unwrap().get(run_id).cloned()
    }

    /// Moves `run_id` to `state` when it is in one of `from`; returns the run as it is
    /// afterwards and whether it moved. `None` for an unknown run.
    fn transition(&self, run_id: &str, from: &[RunState], state: RunState) -> Option<(Run, bool)> {
        let mut runs = self.runs.lock().unwrap();
        let run = runs.get_mut(run_id)?;
        let moved = from.contains(&run.state());
        if moved {
            run.set_state(state);
        }
        Some((run.clone(), moved))
    }

    /// Judges a run, then reports it, unless it was canceled meanwhile.
    fn start_judging(&self, run_id: String) {
        let core = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(core.judging).await;
            let Some((_, finished)) =
                core.transition(&run_id, &[RunState::Judging], RunState::Succeeded)
            else {
                return;
            };
            if !finished {
                println!("run {run_id}: not judging any more (canceled), no callback");
                return;
            }
            match core
                .callback
                .complete_run(&run_id, Completion::succeeded())
                .await
            {
                Ok(job) => println!(
                    "run {run_id}: completed, job {} is {}",
                    job.job_id,
                    job.status().as_str_name()
                ),
                // The queue reconciles a run whose callback never arrived (it asks GetRun).
                Err(error) => eprintln!("run {run_id}: CompleteRun failed for good: {error}"),
            }
        });
    }
}

/// The CreateRun checks a core makes before it accepts work, as field violations.
fn violations(request: &CreateRunRequest) -> Vec<(String, String)> {
    let mut found = Vec::new();
    if request.delta_of_run_id.is_empty() && request.document_uri.ends_with("/unparseable.pdf") {
        found.push((
            "document_uri".to_owned(),
            "the document could not be parsed".to_owned(),
        ));
    }
    for (index, source) in request.sources.iter().enumerate() {
        if source.doi.starts_with("10.9999/") {
            found.push((
                format!("sources[{index}].doi"),
                format!("DOI {} is not registered", source.doi),
            ));
        }
    }
    found
}

#[tonic::async_trait]
impl RunService for Core {
    async fn create_run(
        &self,
        request: Request<CreateRunRequest>,
    ) -> Result<Response<CreateRunResponse>, Status> {
        let request = request.into_inner();
        if uuid::Uuid::parse_str(&request.run_id).is_err() {
            return Err(core_errors::rejected(
                "run_id must be a UUID",
                [("run_id", "not a UUID")],
            ));
        }
        // Idempotent by run id: the queue retries CreateRun after a lost answer.
        if let Some(existing) = self.run(&request.run_id) {
            return Ok(Response::new(CreateRunResponse {
                run: Some(existing),
            }));
        }
        let problems = violations(&request);
        if !problems.is_empty() {
            let message = format!("{} problem(s) with the analysis", problems.len());
            return Err(core_errors::rejected(message, problems));
        }
        let state = if request.hold {
            RunState::Held
        } else {
            RunState::Judging
        };
        // The run keeps what it was created with: ListRuns and GetRun hand it back to the queue.
        let mut run = Run {
            run_id: request.run_id.clone(),
            creation: Some(request.clone()),
            ..Default::default()
        };
        run.set_state(state);
        self.runs
            .lock()
            .unwrap()
            .insert(request.run_id.clone(), run.clone());
        let kind = if request.delta_of_run_id.is_empty() {
            "first pass"
        } else {
            "delta"
        };
        println!(
            "run {}: created {} ({kind}, user {})",
            run.run_id,
            state.as_str_name(),
            request.user_id
        );
        if state == RunState::Judging {
            self.start_judging(request.run_id);
        }
        Ok(Response::new(CreateRunResponse { run: Some(run) }))
    }

    async fn release_run(
        &self,
        request: Request<ReleaseRunRequest>,
    ) -> Result<Response<ReleaseRunResponse>, Status> {
        let run_id = request.into_inner().run_id;
        // A core with a concurrency ceiling answers `Status::resource_exhausted` here while it is
        // full, applying nothing (the run stays held): the queue keeps the job in line and the
        // whole fleet tries again about once a second. This example has no ceiling.
        let (run, released) = self
            .transition(&run_id, &[RunState::Held], RunState::Judging)
            .ok_or_else(|| core_errors::run_not_found(&run_id))?;
        if run.state() == RunState::Canceled {
            return Err(core_errors::run_canceled(&run_id));
        }
        if released {
            println!("run {run_id}: released");
            self.start_judging(run_id);
        }
        Ok(Response::new(ReleaseRunResponse { run: Some(run) }))
    }

    async fn cancel_run(
        &self,
        request: Request<CancelRunRequest>,
    ) -> Result<Response<CancelRunResponse>, Status> {
        let run_id = request.into_inner().run_id;
        // A cancel of a run id never seen leaves it canceled, so a CreateRun that arrives later
        // (its caller long gone) finds the canceled run instead of creating a live one.
        let (run, canceled) = self
            .transition(
                &run_id,
                &[RunState::Held, RunState::Judging],
                RunState::Canceled,
            )
            .unwrap_or_else(|| {
                let mut tombstone = Run {
                    run_id: run_id.clone(),
                    ..Default::default()
                };
                tombstone.set_state(RunState::Canceled);
                self.runs
                    .lock()
                    .unwrap()
                    .insert(run_id.clone(), tombstone.clone());
                (tombstone, false)
            });
        if canceled {
            println!("run {run_id}: canceled");
        }
        Ok(Response::new(CancelRunResponse { run: Some(run) }))
    }

    async fn get_run(
        &self,
        request: Request<GetRunRequest>,
    ) -> Result<Response<GetRunResponse>, Status> {
        let run_id = request.into_inner().run_id;
        let run = self
            .run(&run_id)
            .ok_or_else(|| core_errors::run_not_found(&run_id))?;
        Ok(Response::new(GetRunResponse { run: Some(run) }))
    }

    async fn list_runs(
        &self,
        request: Request<ListRunsRequest>,
    ) -> Result<Response<ListRunsResponse>, Status> {
        let request = request.into_inner();
        if request.page_size < 0 {
            return Err(Status::invalid_argument("page_size must not be negative"));
        }
        let size = match request.page_size {
            0 => 100,
            n => n.min(1000) as usize,
        };
        // Live runs in run id order after the page token (the last run id of the previous page).
        let mut live: Vec<Run> = self
            .runs
            .lock()
            .unwrap()
            .values()
            .filter(|run| matches!(run.state(), RunState::Held | RunState::Judging))
            .filter(|run| !request.judging_only || run.state() == RunState::Judging)
            .filter(|run| run.run_id.as_str() > request.page_token.as_str())
            .filter(|run| {
                request.user_id.is_empty()
                    || run.creation.as_ref().map(|c| c.user_id.as_str())
                        == Some(request.user_id.as_str())
            })
            .cloned()
            .collect();
        live.sort_by(|a, b| a.run_id.cmp(&b.run_id));
        let next_page_token = if live.len() > size {
            live.truncate(size);
            live.last()
                .map(|run| run.run_id.clone())
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok(Response::new(ListRunsResponse {
            runs: live,
            next_page_token,
        }))
    }
}

fn setting(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| default.to_owned())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listen = setting("CORE_LISTEN_ADDR", "127.0.0.1:50061");
    let listen_addr: std::net::SocketAddr = listen
        .parse()
        .map_err(|e| format!("CORE_LISTEN_ADDR={listen:?} is not host:port ({e})"))?;
    let judging_text = setting("CORE_JUDGING_SECONDS", "2");
    let judging = judging_text
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| {
            format!("CORE_JUDGING_SECONDS={judging_text:?} is not a number of seconds >= 0")
        })?;
    let queue_addr = setting("QUEUE_CALLBACK_ADDR", "127.0.0.1:50051");
    let mut callback = CallbackClient::builder(&queue_addr);
    if let Ok(token) = std::env::var("QUEUE_CALLBACK_TOKEN") {
        callback = callback.bearer_token(token);
    }
    // Lazy: the core may start before the queue; CompleteRun retries while the queue is down.
    let core = Core {
        runs: Arc::default(),
        callback: callback.connect_lazy()?,
        judging,
    };

    let listener = tokio::net::TcpListener::bind(listen_addr)
        .await
        .map_err(|e| format!("cannot listen on {listen_addr}: {e}"))?;
    println!("core listening on {listen_addr}, judging {judging:?}, reporting to {queue_addr}");
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = term.recv() => {},
        }
        println!("core stopping");
    };
    tonic::transport::Server::builder()
        .add_service(RunServiceServer::new(core))
        .serve_with_incoming_shutdown(TcpIncoming::from(listener), shutdown)
        .await?;
    Ok(())
}
