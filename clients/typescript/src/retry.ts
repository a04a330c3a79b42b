import { ConnectError, type Interceptor, type UnaryRequest } from "@connectrpc/connect";

import { isRetryable, retryDelayMs } from "./reasons.js";

/** How {@link retryInterceptor} retries. */
export interface RetryOptions {
  /** At most this many attempts in all (default 5; 1 turns retries off). */
  maxAttempts?: number;
  /** Upper bound of the first backoff in ms (default 100); doubled per attempt. */
  initialBackoffMs?: number;
  /** Cap on one backoff in ms (default 3000). */
  maxBackoffMs?: number;
  /** Called before each retry, for logs and metrics. */
  onRetry?: (info: { method: string; attempt: number; delayMs: number; error: ConnectError }) => void;
}

const sleep = (ms: number, signal: AbortSignal) =>
  new Promise<void>((resolve, reject) => {
    if (signal.aborted) {
      reject(signal.reason);
      return;
    }
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    signal.addEventListener("abort", onAbort, { once: true });
  });

/** The `grpc-timeout` header as milliseconds (`10000m`, `10S`, ...); undefined when absent. */
function grpcTimeoutMs(header: Headers): number | undefined {
  const value = header.get("grpc-timeout");
  const match = value === null ? null : /^(\d+)([HMSmun])$/.exec(value);
  if (match === null) {
    return undefined;
  }
  const unitMs: Record<string, number> = { H: 3_600_000, M: 60_000, S: 1000, m: 1, u: 1e-3, n: 1e-6 };
  return Number(match[1]) * (unitMs[match[2] ?? "m"] ?? 1);
}

/**
 * Whether this request may be sent again as it is: every unary queue RPC is idempotent or a
 * read, except that Admit and GrantCredits are only with their idempotency key.
 */
function replayable(req: UnaryRequest): boolean {
  const message = req.message as { idempotencyKey?: unknown };
  return !("idempotencyKey" in message) || (typeof message.idempotencyKey === "string" && message.idempotencyKey !== "");
}

/**
 * Retries unary calls that failed with UNAVAILABLE (CORE_UNAVAILABLE, SHUTTING_DOWN during a
 * replica drain, a refused connection, ...) or ABORTED (CONFLICT): exponential backoff with
 * full jitter, never shorter than the service's `RetryInfo` delay, and always inside the
 * caller's deadline (`timeoutMs` / signal): no attempt starts after it, and each attempt's
 * `grpc-timeout` is what is left of it. Streams (WatchJobs) are not retried here; see
 * `watchJobs()`. On by default in `createQueueClients`.
 */
export function retryInterceptor(options: RetryOptions = {}): Interceptor {
  const maxAttempts = Math.max(1, options.maxAttempts ?? 5);
  const initial = options.initialBackoffMs ?? 100;
  const cap = options.maxBackoffMs ?? 3000;
  return (next) => async (req) => {
    if (req.stream || maxAttempts === 1 || !replayable(req)) {
      return next(req);
    }
    const budgetMs = grpcTimeoutMs(req.header);
    const deadline = budgetMs === undefined ? undefined : Date.now() + budgetMs;
    for (let attempt = 1; ; attempt++) {
      try {
        return await next(req);
      } catch (err) {
        const error = ConnectError.from(err);
        if (attempt >= maxAttempts || !isRetryable(error) || req.signal.aborted) {
          throw error;
        }
        const ceiling = Math.min(cap, initial * 2 ** (attempt - 1));
        const delayMs = Math.max(Math.random() * ceiling, retryDelayMs(error) ?? 0);
        if (deadline !== undefined && Date.now() + delayMs >= deadline) {
          throw error;
        }
        options.onRetry?.({ method: req.method.name, attempt, delayMs, error });
        await sleep(delayMs, req.signal);
        if (deadline !== undefined) {
          req.header.set("grpc-timeout", `${Math.max(1, Math.floor(deadline - Date.now()))}m`);
        }
      }
    }
  };
}
