import { Code, ConnectError } from "@connectrpc/connect";

import { ErrorInfoSchema, RetryInfoSchema } from "./gen/google/rpc/error_details_pb.js";

/** The `google.rpc.ErrorInfo` domain of every error the queue service reports. */
export const QUEUE_ERROR_DOMAIN = "queue.acurio.app";

/**
 * Every `ErrorInfo.reason` the queue sends (see the comment on `AnalysisQueueService` in
 * `queue_service.proto` for each one's code and metadata). Reasons are only ever added; treat an
 * unknown one by its status code. The service's own table (`queue_service/api/road/status.py`) is the
 * source: `tests/repository/test_reason_vocabulary.py` fails when this list differs from it.
 */
export const QUEUE_REASONS = [
  "INVALID_REQUEST",
  "CORE_REJECTED",
  "INSUFFICIENT_CREDITS",
  "IDEMPOTENCY_KEY_REUSED",
  "DELTA_BASE_NOT_FOUND",
  "DELTA_BASE_NOT_FINISHED",
  "PROVIDER_BUDGET_EXHAUSTED",
  "CORE_AT_CAPACITY",
  "USER_QUEUE_FULL",
  "USER_DELTA_LIMIT",
  "USER_FREE_WORK_LIMIT",
  "TOO_MANY_STREAMS",
  "JOB_NOT_FOUND",
  "JOB_NOT_PENDING",
  "JOB_NOT_RETRYABLE",
  "JOB_INPUTS_PRUNED",
  "JOB_ALREADY_FINISHED",
  "RUN_NOT_FOUND",
  "RUN_NOT_YET_ADMITTED",
  "RUN_NOT_RELEASED",
  "CORE_UNAVAILABLE",
  "SHUTTING_DOWN",
  "REPLICA_BUSY",
  "DATABASE_UNAVAILABLE",
  "LOCK_TIMEOUT",
  "OUTCOME_UNKNOWN",
  "CONFLICT",
  "UNAUTHENTICATED",
  "PERMISSION_DENIED",
  "USER_ASSERTION_INVALID",
  "USER_MISMATCH",
  "INTERNAL",
] as const;

/** A reason the queue sends, as a union a `switch` can be checked against. */
export type QueueReason = (typeof QUEUE_REASONS)[number];

const KNOWN = new Set<string>(QUEUE_REASONS);

/** True when `reason` is one this client version knows. */
export function isQueueReason(reason: string): reason is QueueReason {
  return KNOWN.has(reason);
}

/** The queue's ErrorInfo reason of a failed call; `""` when it carries none. */
export function reasonOf(err: unknown): QueueReason | "" | (string & {}) {
  const infos = ConnectError.from(err).findDetails(ErrorInfoSchema);
  const info = infos.find((i) => i.domain === QUEUE_ERROR_DOMAIN) ?? infos[0];
  return info?.reason ?? "";
}

/**
 * True when the same request may be sent again: UNAVAILABLE (CORE_UNAVAILABLE, SHUTTING_DOWN,
 * DATABASE_UNAVAILABLE, LOCK_TIMEOUT, OUTCOME_UNKNOWN, REPLICA_BUSY, RUN_NOT_YET_ADMITTED, or a
 * transport failure without ErrorInfo) and ABORTED
 * (CONFLICT). For Admit and GrantCredits only with the same idempotency key.
 * DEADLINE_EXCEEDED is not: the caller's own deadline has passed.
 */
export function isRetryable(err: unknown): boolean {
  const code = ConnectError.from(err).code;
  return code === Code.Unavailable || code === Code.Aborted;
}

/** The delay the service asked for (`google.rpc.RetryInfo`), in milliseconds; undefined if none. */
export function retryDelayMs(err: unknown): number | undefined {
  const info = ConnectError.from(err).findDetails(RetryInfoSchema)[0];
  const delay = info?.retryDelay;
  if (delay === undefined) {
    return undefined;
  }
  return Number(delay.seconds) * 1000 + Math.round(delay.nanos / 1e6);
}
