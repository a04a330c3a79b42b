import { equals } from "@bufbuild/protobuf";
import type { Client } from "@connectrpc/connect";
import { Code, ConnectError } from "@connectrpc/connect";

import { type Job, JobSchema } from "./gen/acurio/queue/v1/job_pb.js";
import type { AnalysisQueueService } from "./gen/acurio/queue/v1/queue_service_pb.js";
import { isRetryable } from "./reasons.js";

/** What a {@link JobWatch} tells its listeners. */
export type JobWatchEvent =
  /** A (re)connect's snapshot arrived: `jobs` was replaced by it as a whole. */
  | { type: "reset"; jobs: ReadonlyMap<string, Job> }
  /**
   * One job changed (through any replica): `job` differs from `previous`, the version the watch
   * held (undefined for a job it had not seen). Compare their `status` to see a transition: a
   * change may be of another field only (`queuePosition`, `estimatedStartTime`, ...). The stream
   * also sends jobs again exactly as they were (a hand-over re-reads the user's queue); those are
   * no change and raise no event.
   */
  | { type: "change"; job: Job; previous: Job | undefined }
  /**
   * A job the watch had reported no longer exists: the queue's database failed over without it
   * (`WatchJobsResponse.vanished`); it was dropped from `jobs`, and GetJob answers NOT_FOUND.
   */
  | { type: "vanished"; jobId: string }
  /** The stream broke (a drain, a restart, a dead connection); a reconnect follows. */
  | { type: "disconnected"; error: ConnectError; retryInMs: number };

/** Options of {@link watchJobs}. */
export interface WatchJobsOptions {
  /** Upper bound of the first reconnect backoff in ms (default 200); doubled per failure. */
  initialBackoffMs?: number;
  /** Cap on one reconnect backoff in ms (default 5000). */
  maxBackoffMs?: number;
  /** Stops the watch when aborted, like {@link JobWatch.close}. */
  signal?: AbortSignal;
}

/** A live, self-healing view of one user's jobs. */
export interface JobWatch {
  /**
   * The user's jobs by id: after each snapshot, the QUEUED, PENDING and RUNNING ones; then
   * every job as its latest change left it (a job that finished stays, with its final status,
   * until the next snapshot, which drops it).
   */
  readonly jobs: ReadonlyMap<string, Job>;
  /** True from a snapshot's end until the stream breaks: `jobs` is then the whole truth. */
  readonly synced: boolean;
  /** Calls `listener` on every event; returns the function that unsubscribes it. */
  subscribe(listener: (event: JobWatchEvent) => void): () => void;
  /** Resolves at the next `reset` (immediately if synced), rejects if the watch fails. */
  nextSync(): Promise<void>;
  /** Stops watching. */
  close(): void;
  /** Settles when the watch ends: resolves after `close()`, rejects on a non-retryable error. */
  readonly done: Promise<void>;
}

const sleep = (ms: number, signal: AbortSignal) =>
  new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => (clearTimeout(timer), resolve()), { once: true });
  });

/**
 * Watches `userId`'s jobs with AnalysisQueueService.WatchJobs and keeps watching across replica
 * drains, restarts and broken connections: a retryable failure (UNAVAILABLE, including
 * `SHUTTING_DOWN`) reconnects with jittered backoff, and every snapshot replaces the view as a
 * whole, so nothing missed while disconnected lingers. INVALID_REQUEST, TOO_MANY_STREAMS and
 * the like end the watch (`done` rejects).
 */
export function watchJobs(
  queue: Client<typeof AnalysisQueueService>,
  userId: string,
  options: WatchJobsOptions = {},
): JobWatch {
  const initial = options.initialBackoffMs ?? 200;
  const cap = options.maxBackoffMs ?? 5000;
  const stop = new AbortController();
  options.signal?.addEventListener("abort", () => stop.abort(), { once: true });
  const listeners = new Set<(event: JobWatchEvent) => void>();
  let jobs = new Map<string, Job>();
  let synced = false;
  let syncWaiters: { resolve: () => void; reject: (e: unknown) => void }[] = [];

  const emit = (event: JobWatchEvent) => {
    for (const listener of listeners) {
      listener(event);
    }
  };

  async function run(): Promise<void> {
    let failures = 0;
    while (!stop.signal.aborted) {
      const snapshot = new Map<string, Job>();
      let inSnapshot = true;
      try {
        for await (const message of queue.watchJobs({ userId }, { signal: stop.signal })) {
          if (inSnapshot) {
            if (message.job !== undefined) {
              snapshot.set(message.job.jobId, message.job);
            }
            if (message.snapshotComplete) {
              inSnapshot = false;
              jobs = snapshot;
              synced = true;
              failures = 0;
              emit({ type: "reset", jobs });
              syncWaiters.forEach((w) => w.resolve());
              syncWaiters = [];
            }
          } else if (message.vanished && message.job !== undefined) {
            jobs.delete(message.job.jobId);
            emit({ type: "vanished", jobId: message.job.jobId });
          } else if (message.job !== undefined) {
            const previous = jobs.get(message.job.jobId);
            if (previous !== undefined && equals(JobSchema, previous, message.job)) {
              continue;
            }
            jobs.set(message.job.jobId, message.job);
            emit({ type: "change", job: message.job, previous });
          }
        }
        // A clean end of the stream: the server closed it; reconnect like after a failure.
        throw new ConnectError("the WatchJobs stream ended", Code.Unavailable);
      } catch (err) {
        synced = false;
        if (stop.signal.aborted) {
          return;
        }
        const error = ConnectError.from(err);
        if (!isRetryable(error)) {
          throw error;
        }
        failures += 1;
        const retryInMs = Math.random() * Math.min(cap, initial * 2 ** (failures - 1));
        emit({ type: "disconnected", error, retryInMs });
        await sleep(retryInMs, stop.signal);
      }
    }
  }

  const done = run().then(
    () => {
      syncWaiters.forEach((w) => w.reject(new ConnectError("the watch was closed", Code.Canceled)));
      syncWaiters = [];
    },
    (err: unknown) => {
      syncWaiters.forEach((w) => w.reject(err));
      syncWaiters = [];
      throw err;
    },
  );
  // A caller that never awaits `done` must not get an unhandled rejection from it.
  done.catch(() => undefined);

  return {
    get jobs() {
      return jobs;
    },
    get synced() {
      return synced;
    },
    subscribe(listener) {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
    nextSync() {
      if (synced) {
        return Promise.resolve();
      }
      return new Promise<void>((resolve, reject) => syncWaiters.push({ resolve, reject }));
    },
    close() {
      stop.abort();
    },
    done,
  };
}
