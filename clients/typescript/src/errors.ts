import { Code, ConnectError } from "@connectrpc/connect";

import { BadRequestSchema, ErrorInfoSchema } from "./gen/google/rpc/error_details_pb.js";
import { isRetryable, QUEUE_ERROR_DOMAIN, type QueueReason, retryDelayMs } from "./reasons.js";

/** One `google.rpc.BadRequest` field violation. */
export interface FieldViolation {
  /**
   * The offending request field as this client's messages spell it: camelCase, with indexes
   * (`userId`, `idempotencyKey`, `sources[1].doi`), so it names the property you set.
   */
  field: string;
  /** The same field as the service sent it, in the contract's snake_case (`user_id`); the
   * `description` is worded with this name. */
  protoField: string;
  /** Why the value is invalid. */
  description: string;
}

/**
 * A field path of the contract (`sources[1].doi`, `idempotency_key`) as protobuf-es names the
 * properties (`sources[1].doi`, `idempotencyKey`); what stands in brackets (an index, a map key)
 * is kept as it is.
 */
export function camelCaseFieldPath(path: string): string {
  return path.replace(/\[[^\]]*\]|_([a-z0-9])/g, (match: string, letter: string | undefined) =>
    letter === undefined ? match : letter.toUpperCase(),
  );
}

/** A failed call, decoded from the gRPC status and its details. */
export interface DescribedError {
  /** The gRPC status code (Connect's numeric `Code`, identical to gRPC's numbering). */
  code: Code;
  /** The canonical gRPC name of the code, for example `FAILED_PRECONDITION`. */
  codeName: string;
  /** The status message as the service sent it (without Connect's `[code]` prefix). */
  message: string;
  /** `ErrorInfo.reason` (for example `INSUFFICIENT_CREDITS`); empty when there is none. */
  reason: QueueReason | "" | (string & {});
  /** `ErrorInfo.domain` (`queue.acurio.app` for the queue's own errors); empty when none. */
  domain: string;
  /** `ErrorInfo.metadata` (for example `balance` and `required`, as decimal strings). */
  metadata: Record<string, string>;
  /** Every `BadRequest` field violation (set for `INVALID_REQUEST`, and for `CORE_REJECTED`
   * when the core named the offending sources). */
  fieldViolations: FieldViolation[];
  /** True when the same request may be sent again (see `isRetryable`). */
  retryable: boolean;
  /** The delay the service asked for before a retry (`google.rpc.RetryInfo`), in ms. */
  retryDelayMs: number | undefined;
}

const CODE_NAMES: Readonly<Record<Code, string>> = {
  [Code.Canceled]: "CANCELLED",
  [Code.Unknown]: "UNKNOWN",
  [Code.InvalidArgument]: "INVALID_ARGUMENT",
  [Code.DeadlineExceeded]: "DEADLINE_EXCEEDED",
  [Code.NotFound]: "NOT_FOUND",
  [Code.AlreadyExists]: "ALREADY_EXISTS",
  [Code.PermissionDenied]: "PERMISSION_DENIED",
  [Code.ResourceExhausted]: "RESOURCE_EXHAUSTED",
  [Code.FailedPrecondition]: "FAILED_PRECONDITION",
  [Code.Aborted]: "ABORTED",
  [Code.OutOfRange]: "OUT_OF_RANGE",
  [Code.Unimplemented]: "UNIMPLEMENTED",
  [Code.Internal]: "INTERNAL",
  [Code.Unavailable]: "UNAVAILABLE",
  [Code.DataLoss]: "DATA_LOSS",
  [Code.Unauthenticated]: "UNAUTHENTICATED",
};

/** The canonical gRPC name of a status code, for example `FAILED_PRECONDITION`. */
export function codeName(code: Code): string {
  return CODE_NAMES[code] ?? `CODE_${String(code)}`;
}

/**
 * Decodes a failed call into its code, message, `google.rpc.ErrorInfo` (reason, domain,
 * metadata) and `google.rpc.BadRequest` field violations. Accepts anything a call can throw:
 * a non-Connect error (say, an aborted signal) is converted with `ConnectError.from` first.
 */
export function describeError(err: unknown): DescribedError {
  const error = ConnectError.from(err);
  // The queue sends one ErrorInfo; prefer one from our domain should several ever arrive.
  const infos = error.findDetails(ErrorInfoSchema);
  const info = infos.find((i) => i.domain === QUEUE_ERROR_DOMAIN) ?? infos[0];
  const fieldViolations = error
    .findDetails(BadRequestSchema)
    .flatMap((badRequest) => badRequest.fieldViolations)
    .map((v) => ({ field: camelCaseFieldPath(v.field), protoField: v.field, description: v.description }));
  return {
    code: error.code,
    codeName: codeName(error.code),
    message: error.rawMessage,
    reason: info?.reason ?? "",
    domain: info?.domain ?? "",
    metadata: { ...(info?.metadata ?? {}) },
    fieldViolations,
    retryable: isRetryable(error),
    retryDelayMs: retryDelayMs(error),
  };
}

type Formatter = (e: DescribedError) => string;

const meta = (e: DescribedError, key: string): string => e.metadata[key] ?? "?";

/** `field: description`, or just the description when it already starts with the field's name. */
const describeViolation = (v: FieldViolation): string =>
  v.description.startsWith(v.protoField) ? v.description : `${v.field}: ${v.description}`;

/** User-facing wording per reason, built from structured fields only (never the message). */
const FORMATTERS: Readonly<Record<string, Formatter>> = {
  INSUFFICIENT_CREDITS: (e) =>
    `insufficient credits: balance ${meta(e, "balance")}, required ${meta(e, "required")}`,
  INVALID_REQUEST: (e) =>
    e.fieldViolations.length === 0
      ? `invalid request: ${e.message}`
      : `invalid request: ${e.fieldViolations.map(describeViolation).join("; ")}`,
  USER_QUEUE_FULL: (e) => `queue full: at most ${meta(e, "maxQueued")} queued jobs`,
};

/**
 * A short one-line description of a failed call, for logs and simple UIs, for example
 * `insufficient credits: balance 0, required 1`. Known reasons are worded from the
 * ErrorInfo metadata / BadRequest violations; other reasons read `<reason in words>: <message>`
 * (followed by `(field: description; ...)` when the error names field violations) and errors
 * without ErrorInfo read `<CODE_NAME>: <message>`.
 */
export function formatError(err: unknown): string {
  const e = describeError(err);
  const formatter = FORMATTERS[e.reason];
  if (formatter !== undefined) {
    return formatter(e);
  }
  const label = e.reason !== "" ? e.reason.toLowerCase().replaceAll("_", " ") : e.codeName;
  const text = e.message !== "" ? `${label}: ${e.message}` : label;
  // Any reason may carry field violations (CORE_REJECTED names the sources the core refused):
  // each one's field and description, as the Rust client's Display writes them.
  if (e.fieldViolations.length === 0) {
    return text;
  }
  return `${text} (${e.fieldViolations.map(describeViolation).join("; ")})`;
}
