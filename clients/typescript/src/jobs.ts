import { toJson } from "@bufbuild/protobuf";
import type { Client } from "@connectrpc/connect";

import { type Job, type JobJson, JobSchema, type JobStatus } from "./gen/acurio/queue/v1/job_pb.js";
import type { AnalysisQueueService } from "./gen/acurio/queue/v1/queue_service_pb.js";

/**
 * The job in the contract's canonical JSON form (proto3 JSON): safe for `JSON.stringify`, a
 * REST answer or a log line. `price` (int64) becomes a decimal string, timestamps RFC 3339
 * strings, `status` its enum name (`"JOB_STATUS_QUEUED"`); fields at their default are left out.
 */
export function toJobJson(job: Job): JobJson {
  return toJson(JobSchema, job);
}

/** Options of {@link listAllJobs}. */
export interface ListAllJobsOptions {
  /** Only jobs in these statuses; empty or unset: all. */
  statuses?: JobStatus[];
  /** Jobs per page (1-100; default 100). */
  pageSize?: number;
  /** Deadline of each page's call, in ms (default: the client's). */
  timeoutMs?: number;
  /** Stops the listing. */
  signal?: AbortSignal;
}

/**
 * Every job of `userId`, newest first, fetching pages with ListJobs as the loop asks for more:
 * `for await (const job of listAllJobs(queue, userId)) { ... }`.
 */
export async function* listAllJobs(
  queue: Client<typeof AnalysisQueueService>,
  userId: string,
  options: ListAllJobsOptions = {},
): AsyncGenerator<Job, void, undefined> {
  let pageToken = "";
  do {
    const page = await queue.listJobs(
      { userId, pageSize: options.pageSize ?? 100, pageToken, statuses: options.statuses ?? [] },
      { timeoutMs: options.timeoutMs, signal: options.signal },
    );
    yield* page.jobs;
    pageToken = page.nextPageToken;
  } while (pageToken !== "");
}
