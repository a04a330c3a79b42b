import type * as http2 from "node:http2";
import { createClient, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";

import { CoreCallbackService } from "./gen/acurio/queue/v1/core_callback_service_pb.js";
import { CreditsService } from "./gen/acurio/queue/v1/credits_service_pb.js";
import { OperatorService } from "./gen/acurio/queue/v1/operator_service_pb.js";
import { AnalysisQueueService } from "./gen/acurio/queue/v1/queue_service_pb.js";
import { retryInterceptor, type RetryOptions } from "./retry.js";

/** Options for {@link createQueueClients}. */
export interface QueueClientOptions {
  /**
   * Where the queue service listens: `host:port` (for example `127.0.0.1:50051`), or a full
   * `http://` / `https://` URL. A bare `host:port` becomes `http://host:port`, or
   * `https://host:port` when `tls` is set.
   */
  address: string;
  /**
   * Default deadline in milliseconds for unary calls (Admit, ListJobs, GrantCredits, ...).
   * Streaming calls (WatchJobs) are open-ended unless the call passes its own `timeoutMs` or
   * `signal`, because a dashboard stream is meant to stay open. A per-call `timeoutMs` always
   * wins. Unset: no default deadline.
   */
  timeoutMs?: number;
  /**
   * Use TLS. `true` uses the system trust store; an object is passed to Node's
   * `http2.connect()` (for example `{ ca }` for a private CA, `{ cert, key }` for mTLS).
   */
  tls?: boolean | http2.SecureClientSessionOptions;
  /** Sent on every call as `authorization: Bearer <token>`. */
  bearerToken?: string;
  /**
   * Retries of unary calls on UNAVAILABLE / ABORTED inside the call's deadline (see
   * {@link retryInterceptor}). Default on (5 attempts); `false` turns them off.
   */
  retry?: RetryOptions | false;
  /**
   * HTTP/2 PING every this many ms on an open connection, which is closed (failing its calls
   * and streams with UNAVAILABLE) when a PING goes unanswered for 15 s: a half-open connection
   * never hangs a WatchJobs stream. Default 30000; `false` turns keepalive off.
   */
  keepaliveMs?: number | false;
  /**
   * Extra interceptors, run inside the retry and bearer-token interceptors (so they see every
   * attempt).
   */
  interceptors?: Interceptor[];
}

/** Typed clients for the queue's services, sharing one HTTP/2 connection. */
export interface QueueClients {
  /** AnalysisQueueService: Admit, ListJobs, GetJob, CancelJob, WatchJobs, Promote, Release. */
  queue: Client<typeof AnalysisQueueService>;
  /** CreditsService: GrantCredits, GetBalance (admin tooling). */
  credits: Client<typeof CreditsService>;
  /** CoreCallbackService: CompleteRun (called by the core; exposed for tooling and tests). */
  coreCallback: Client<typeof CoreCallbackService>;
  /**
   * OperatorService (operator role only): GetOverview, SearchJobs, WatchOverview, CancelJobs
   * (the web console's reads and bulk cancel), ListLedgerEntries (the credits' audit trail),
   * RetryJob and RetryJobs (failed or canceled jobs admitted again, once each unless asked again).
   */
  operator: Client<typeof OperatorService>;
  /** The underlying gRPC transport, for creating further clients. */
  transport: Transport;
  /**
   * Closes the HTTP/2 connection (in-flight calls fail with CANCELED). Call it when done, or
   * the open connection keeps a short-lived Node process (a script, a test) from exiting.
   */
  close(): void;
}

/** Turns `host:port` into the base URL the gRPC transport expects. */
export function toBaseUrl(address: string, tls: boolean): string {
  const trimmed = address.trim();
  if (trimmed === "") {
    throw new Error("queue client: address is empty (expected host:port, e.g. 127.0.0.1:50051)");
  }
  if (/^https?:\/\//i.test(trimmed)) {
    return trimmed.replace(/\/+$/, "");
  }
  return `${tls ? "https" : "http"}://${trimmed}`;
}

/** An interceptor that sends `authorization: Bearer <token>` on every call. */
export function bearerTokenInterceptor(token: string): Interceptor {
  const value = `Bearer ${token}`;
  return (next) => async (req) => {
    req.header.set("authorization", value);
    return next(req);
  };
}

/**
 * Creates typed clients for the queue's AnalysisQueueService, CreditsService and
 * CoreCallbackService over real gRPC (HTTP/2).
 */
export function createQueueClients(options: QueueClientOptions): QueueClients {
  const useTls = options.tls !== undefined && options.tls !== false;
  const baseUrl = toBaseUrl(options.address, useTls);
  const nodeOptions = typeof options.tls === "object" ? options.tls : {};

  const interceptors: Interceptor[] = [];
  if (options.retry !== false) {
    interceptors.push(retryInterceptor(options.retry ?? {}));
  }
  if (options.bearerToken !== undefined && options.bearerToken !== "") {
    interceptors.push(bearerTokenInterceptor(options.bearerToken));
  }
  interceptors.push(...(options.interceptors ?? []));

  // Our own session manager, so close() can end the connection.
  const keepaliveMs = options.keepaliveMs ?? 30_000;
  const pingOptions = keepaliveMs === false ? {} : { pingIntervalMs: keepaliveMs, pingTimeoutMs: 15_000 };
  const sessionManager = new Http2SessionManager(baseUrl, pingOptions, nodeOptions);
  const grpc = createGrpcTransport({ baseUrl, sessionManager, interceptors });

  const defaultTimeoutMs = options.timeoutMs;
  const transport: Transport = {
    unary(method, signal, timeoutMs, header, input, contextValues) {
      return grpc.unary(method, signal, timeoutMs ?? defaultTimeoutMs, header, input, contextValues);
    },
    stream(method, signal, timeoutMs, header, input, contextValues) {
      return grpc.stream(method, signal, timeoutMs, header, input, contextValues);
    },
  };

  return {
    queue: createClient(AnalysisQueueService, transport),
    credits: createClient(CreditsService, transport),
    coreCallback: createClient(CoreCallbackService, transport),
    operator: createClient(OperatorService, transport),
    transport,
    close() {
      sessionManager.abort();
    },
  };
}
