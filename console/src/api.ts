// Clients for the queue's services over the Connect protocol, on the page's own origin (the
// service serves the console and the endpoint together), with the bearer token the person
// entered, and errors turned into one readable line with the ErrorInfo reason (decoded by the
// TypeScript client, whose reason vocabulary the service's tests keep in step). Every read and
// stream reports its outcome to `callHealth`, so the header's live mark says when calls are refused.
import { createClient, ConnectError, Code, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";

import { AnalysisQueueService } from "@acurio/queue-client/gen/acurio/queue/v1/queue_service_pb.js";
import { CreditsService } from "@acurio/queue-client/gen/acurio/queue/v1/credits_service_pb.js";
import { OperatorService } from "@acurio/queue-client/gen/acurio/queue/v1/operator_service_pb.js";
import { describeError as decodeError } from "@acurio/queue-client/errors.js";
import type { QueueReason } from "@acurio/queue-client/reasons.js";

const TOKEN_KEY = "acurio-queue-console-token";

export function token(): string {
  return sessionStorage.getItem(TOKEN_KEY) ?? "";
}

export function setToken(value: string): void {
  if (value.trim() === "") sessionStorage.removeItem(TOKEN_KEY);
  else sessionStorage.setItem(TOKEN_KEY, value.trim());
}

const bearer: Interceptor = (next) => async (req) => {
  const value = token();
  if (value !== "") req.header.set("authorization", `Bearer ${value}`);
  return next(req);
};

/** What the page's reads and streams last heard: answers, refusals, or nothing at all. */
export type CallState = "waiting" | "ok" | "refused" | "unreachable";
export interface CallHealth {
  state: CallState;
  text: string;
}

let health: CallHealth = { state: "waiting", text: "" }; // no answer yet
const healthListeners = new Set<(h: CallHealth) => void>();

export function callHealth(): CallHealth {
  return health;
}

export function onCallHealth(listener: (h: CallHealth) => void): () => void {
  healthListeners.add(listener);
  return () => healthListeners.delete(listener);
}

function report(error: unknown): void {
  let next: CallHealth = { state: "ok", text: "" };
  if (error !== null) {
    const code = ConnectError.from(error).code;
    if (code === Code.Canceled) return; // a page that closed its own stream
    if (code === Code.Unauthenticated || code === Code.PermissionDenied) next = { state: "refused", text: describeError(error) };
    else if (code === Code.Unavailable || code === Code.Unknown || code === Code.DeadlineExceeded)
      next = { state: "unreachable", text: describeError(error) };
    else return; // an answer about the request itself: the service is there and let us in
  }
  if (next.state === health.state && next.text === health.text) return;
  health = next;
  for (const listener of healthListeners) listener(health);
}

// Reads and streams (what keeps a page current) decide the live mark; an action refused for
// its role says so in the notice line and leaves the mark alone.
const READS = /^(Get|List|Search|Watch)/;

const tracked: Interceptor = (next) => async (req) => {
  if (!req.stream && !READS.test(req.method.name)) return next(req);
  let res;
  try {
    res = await next(req);
  } catch (error) {
    report(error);
    throw error;
  }
  if (!res.stream) {
    report(null);
    return res;
  }
  const messages = res.message;
  return {
    ...res,
    message: (async function* () {
      try {
        for await (const message of messages) {
          report(null);
          yield message;
        }
      } catch (error) {
        report(error);
        throw error;
      }
    })(),
  };
};

const transport = createConnectTransport({
  baseUrl: window.location.origin,
  useBinaryFormat: true,
  interceptors: [bearer, tracked],
});

export const queue = createClient(AnalysisQueueService, transport);
export const credits = createClient(CreditsService, transport);
export const operator = createClient(OperatorService, transport);

/** An outcome the console itself judges a failure (a call that answered, but did not do it). */
export class Problem extends Error {}

/** One line for a person: `REASON: message` (the gRPC code's name, e.g. `UNAVAILABLE`, when the
 * error carries no ErrorInfo), plus the fields a BadRequest names. A refusal for want of a token
 * says which key sets one, not which header the service expected. */
export function describeError(error: unknown): string {
  if (error instanceof Problem) return error.message;
  const e = decodeError(error);
  const unauthenticated: QueueReason = "UNAUTHENTICATED";
  if (e.code === Code.Unauthenticated && (e.reason === "" || e.reason === unauthenticated)) {
    return token() === ""
      ? "UNAUTHENTICATED: this service needs a token: press t to set a token"
      : "UNAUTHENTICATED: the token was not accepted: press t to set another token";
  }
  if ((e.code === Code.Unknown || e.code === Code.Unavailable) && e.reason === "" && /failed to fetch|network|load failed/i.test(e.message)) {
    return `UNAVAILABLE: the service is unreachable (${e.message})`;
  }
  if (e.code === Code.PermissionDenied) {
    // The token's role, as the service names it: a viewer may watch but not act; any other role
    // but an operator's cannot use the console at all.
    const role = e.metadata.role ?? "";
    if (role === "viewer") return `PERMISSION_DENIED: a viewer token watches only; this action needs an operator token (${e.message}); press t to set one`;
    if (role !== "" && role !== "operator") {
      return `PERMISSION_DENIED: the console needs an operator or viewer token (this one is a ${role} token: ${e.message}); press t to set another token`;
    }
  }
  const fields = e.fieldViolations.map((v) => v.description);
  return [`${e.reason || e.codeName}: ${e.message}`, ...fields].join(" · ");
}

/** True for the error a stream ends with when it was aborted on purpose. */
export function isCanceled(error: unknown): boolean {
  return ConnectError.from(error).code === Code.Canceled;
}

export function date(ts: Timestamp | undefined): Date | undefined {
  return ts === undefined ? undefined : timestampDate(ts);
}
