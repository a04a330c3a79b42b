// Public surface of @acurio/queue-client.
export {
  bearerTokenInterceptor,
  createQueueClients,
  toBaseUrl,
  type QueueClientOptions,
  type QueueClients,
} from "./clients.js";
export {
  codeName,
  describeError,
  formatError,
  QUEUE_ERROR_DOMAIN,
  type DescribedError,
  type FieldViolation,
} from "./errors.js";

// Generated contract: messages, enums and service descriptors.
export * from "./gen/acurio/queue/v1/job_pb.js";
export * from "./gen/acurio/queue/v1/queue_service_pb.js";
export * from "./gen/acurio/queue/v1/credits_service_pb.js";
export * from "./gen/acurio/queue/v1/core_callback_service_pb.js";
export { BadRequestSchema, ErrorInfoSchema } from "./gen/google/rpc/error_details_pb.js";
export type { BadRequest, BadRequest_FieldViolation, ErrorInfo } from "./gen/google/rpc/error_details_pb.js";
export { Code, ConnectError } from "@connectrpc/connect";
