// Clients for the queue's services over the Connect protocol, on the page's own origin (the
// service serves the console and the endpoint together), with the bearer token the person
// entered, and errors turned into one readable line with the ErrorInfo reason.
import { createClient, ConnectError, Code, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";

import { AnalysisQueueService } from "./gen/acurio/queue/v1/queue_service_pb.js";
import { CreditsService } from "./gen/acurio/queue/v1/credits_service_pb.js";
import { OperatorService } from "./gen/acurio/queue/v1/operator_service_pb.js";
import { ErrorInfoSchema, BadRequestSchema } from "./gen/google/rpc/error_details_pb.js";

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

const transport = createConnectTransport({
  baseUrl: window.location.origin,
  useBinaryFormat: true,
  interceptors: [bearer],
});

export const queue = createClient(AnalysisQueueService, transport);
export const credits = createClient(CreditsService, transport);
export const operator = createClient(OperatorService, transport);

/** One line for a person: `REASON: message`, plus the fields a BadRequest names. */
export function describeError(error: unknown): string {
  const err = ConnectError.from(error);
  const info = err.findDetails(ErrorInfoSchema)[0];
  const fields = err.findDetails(BadRequestSchema).flatMap((b) => b.fieldViolations.map((v) => v.description));
  const reason = info?.reason ?? Code[err.code];
  return [`${reason}: ${err.rawMessage}`, ...fields].join(" · ");
}

/** True for the error a stream ends with when it was aborted on purpose. */
export function isCanceled(error: unknown): boolean {
  return ConnectError.from(error).code === Code.Canceled;
}

export function date(ts: Timestamp | undefined): Date | undefined {
  return ts === undefined ? undefined : timestampDate(ts);
}
