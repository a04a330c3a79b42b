// Public surface of @acurio/queue-client (ES module only; Node >= 20).
export {
  bearerTokenInterceptor,
  createQueueClients,
  toBaseUrl,
  type QueueClientOptions,
  type QueueClients,
} from "./clients.js";
export {
  USER_ASSERTION_HEADER,
  userAssertionInterceptor,
  withUserAssertion,
  type MintUserAssertion,
} from "./assertions.js";
export {
  camelCaseFieldPath,
  codeName,
  describeError,
  formatError,
  type DescribedError,
  type FieldViolation,
} from "./errors.js";
export {
  isQueueReason,
  isRetryable,
  QUEUE_ERROR_DOMAIN,
  QUEUE_REASONS,
  reasonOf,
  retryDelayMs,
  type QueueReason,
} from "./reasons.js";
export { retryInterceptor, type RetryOptions } from "./retry.js";
export { watchJobs, type JobWatch, type JobWatchEvent, type WatchJobsOptions } from "./watch.js";
export { listAllJobs, toJobJson, type ListAllJobsOptions } from "./jobs.js";

// Generated contract: messages, enums and service descriptors (with their JSON types).
export * from "./gen/acurio/queue/v1/job_pb.js";
export * from "./gen/acurio/queue/v1/queue_service_pb.js";
export * from "./gen/acurio/queue/v1/credits_service_pb.js";
export * from "./gen/acurio/queue/v1/core_callback_service_pb.js";
export * from "./gen/acurio/queue/v1/operator_service_pb.js";
export { BadRequestSchema, ErrorInfoSchema, RetryInfoSchema } from "./gen/google/rpc/error_details_pb.js";
export type { BadRequest, BadRequest_FieldViolation, ErrorInfo, RetryInfo } from "./gen/google/rpc/error_details_pb.js";
export { Code, ConnectError } from "@connectrpc/connect";
// Timestamps (Job.createTime, ...): to and from Date.
export { timestampDate, timestampFromDate, timestampMs, type Timestamp } from "@bufbuild/protobuf/wkt";
