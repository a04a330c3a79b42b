import type { CallOptions, Interceptor } from "@connectrpc/connect";

import { AnalysisQueueService } from "./gen/acurio/queue/v1/queue_service_pb.js";

/**
 * The metadata key of a per-user assertion: a short-lived JWT the web backend signs for the user
 * a call acts for (`sub` = the request's `userId`). The queue requires it on every call of the
 * `web` role when it is configured with `QUEUE_USER_ASSERTION_KEY_FILE`; without one the call is
 * UNAUTHENTICATED `USER_ASSERTION_INVALID`, with one for another user PERMISSION_DENIED
 * `USER_MISMATCH`.
 */
export const USER_ASSERTION_HEADER = "x-user-assertion";

/**
 * Call options that send `assertion` as the call's per-user assertion, merged into `options`:
 *
 * ```ts
 * await c.queue.admit(request, withUserAssertion(jwt, { timeoutMs: 5_000 }));
 * ```
 *
 * Prefer {@link userAssertionInterceptor} for streams that reconnect (`watchJobs()`): an
 * assertion lives minutes, a watch much longer.
 */
export function withUserAssertion(assertion: string, options: CallOptions = {}): CallOptions {
  const headers = new Headers(options.headers);
  headers.set(USER_ASSERTION_HEADER, assertion);
  return { ...options, headers };
}

/**
 * Signs an assertion for `userId`; `method` is the RPC's name (`Admit`, `WatchJobs`, ...).
 * Called once per attempt, so a retry or a reconnect always carries a fresh assertion.
 */
export type MintUserAssertion = (userId: string, method: string) => string | Promise<string>;

/**
 * An interceptor that attaches a freshly minted assertion to every AnalysisQueueService call
 * whose request names a `userId` (Admit, ListJobs, GetJob, CancelJob, WatchJobs, ...), unless
 * the call already carries one (from {@link withUserAssertion}). Pass it in
 * `createQueueClients({ interceptors: [userAssertionInterceptor(mint)] })`: it runs inside the
 * retry interceptor, so each attempt, and each reconnect of `watchJobs()`, mints its own.
 */
export function userAssertionInterceptor(mint: MintUserAssertion): Interceptor {
  return (next) => async (req) => {
    if (req.service.typeName !== AnalysisQueueService.typeName || req.header.has(USER_ASSERTION_HEADER)) {
      return next(req);
    }
    if (!req.stream) {
      const userId = userIdOf(req.message);
      if (userId !== "") {
        req.header.set(USER_ASSERTION_HEADER, await mint(userId, req.method.name));
      }
      return next(req);
    }
    if (req.method.methodKind !== "server_streaming") {
      return next(req);
    }
    // A server stream sends exactly one request message: read it for its user, then send it.
    const messages = [];
    for await (const message of req.message) {
      messages.push(message);
    }
    const userId = userIdOf(messages[0]);
    if (userId !== "") {
      req.header.set(USER_ASSERTION_HEADER, await mint(userId, req.method.name));
    }
    return next({ ...req, message: replay(messages) });
  };
}

function userIdOf(message: unknown): string {
  const userId = (message as { userId?: unknown } | undefined)?.userId;
  return typeof userId === "string" ? userId : "";
}

async function* replay<T>(messages: T[]): AsyncIterable<T> {
  yield* messages;
}
