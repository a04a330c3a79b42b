// The retry interceptor against an in-process gRPC server that fails on purpose (no QUEUE_ADDR).
import assert from "node:assert/strict";
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";

import { Code, ConnectError, type ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";

import {
  AnalysisQueueService,
  createQueueClients,
  CreditsService,
  describeError,
  ErrorInfoSchema,
  QUEUE_ERROR_DOMAIN,
  RetryInfoSchema,
} from "../src/index.js";

/** Calls per user id, so each test reads its own count. */
const calls = new Map<string, number>();
const count = (key: string) => {
  const n = (calls.get(key) ?? 0) + 1;
  calls.set(key, n);
  return n;
};

function unavailable(reason: string, retryDelayMs?: number): ConnectError {
  const details = [{ desc: ErrorInfoSchema, value: { reason, domain: QUEUE_ERROR_DOMAIN } }];
  const retry =
    retryDelayMs === undefined
      ? []
      : [{ desc: RetryInfoSchema, value: { retryDelay: { seconds: 0n, nanos: retryDelayMs * 1e6 } } }];
  return new ConnectError(reason, Code.Unavailable, undefined, [...details, ...retry]);
}

function routes(router: ConnectRouter) {
  router.service(CreditsService, {
    // "flaky-N": N failures (SHUTTING_DOWN, 50 ms RetryInfo), then an answer; "down": always fails.
    getBalance(req) {
      const n = count(req.userId);
      if (req.userId === "down") {
        throw unavailable("SHUTTING_DOWN", 900);
      }
      const failures = Number(req.userId.split("-")[1] ?? "0");
      if (n <= failures) {
        throw unavailable("SHUTTING_DOWN", 50);
      }
      return { balance: BigInt(n) };
    },
    grantCredits() {
      throw new ConnectError("not implemented", Code.Unimplemented);
    },
  });
  router.service(AnalysisQueueService, {
    admit(req) {
      count(`admit-${req.userId}`);
      throw unavailable("CORE_UNAVAILABLE");
    },
    getJob(req) {
      count(`get-${req.jobId}`);
      throw new ConnectError("no such job", Code.NotFound);
    },
  });
}

describe("retry interceptor (in-process gRPC server, no QUEUE_ADDR needed)", () => {
  let server: http2.Http2Server;
  let address = "";

  before(async () => {
    server = http2.createServer(connectNodeAdapter({ routes, grpc: true, connect: false, grpcWeb: false }));
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    address = `127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  after(() => {
    server.close();
  });

  test("retries UNAVAILABLE until it succeeds, waiting at least the RetryInfo delay", async () => {
    const c = createQueueClients({ address, timeoutMs: 5_000 });
    try {
      const started = Date.now();
      const { balance } = await c.credits.getBalance({ userId: "flaky-3" });
      assert.equal(balance, 4n, "three failures, the fourth attempt answers");
      assert.ok(Date.now() - started >= 150, "three RetryInfo delays of 50 ms");
    } finally {
      c.close();
    }
  });

  test("gives up within the caller's deadline rather than waiting past it", async () => {
    const c = createQueueClients({ address, timeoutMs: 400 });
    try {
      const started = Date.now();
      const err = await c.credits.getBalance({ userId: "down" }).catch((e: unknown) => e);
      const d = describeError(err);
      assert.equal(d.reason, "SHUTTING_DOWN");
      assert.equal(d.retryable, true);
      assert.equal(d.retryDelayMs, 900);
      assert.equal(calls.get("down"), 1, "the 900 ms delay would pass the 400 ms deadline: no retry");
      assert.ok(Date.now() - started < 400);
    } finally {
      c.close();
    }
  });

  test("retries Admit only with an idempotency key, and never a non-retryable code", async () => {
    const c = createQueueClients({ address, timeoutMs: 5_000, retry: { maxAttempts: 3, initialBackoffMs: 1 } });
    try {
      await c.queue.admit({ userId: "keyed", idempotencyKey: "click-1" }).catch(() => undefined);
      assert.equal(calls.get("admit-keyed"), 3, "with a key: every attempt");
      await c.queue.admit({ userId: "unkeyed", idempotencyKey: "" }).catch(() => undefined);
      assert.equal(calls.get("admit-unkeyed"), 1, "without a key: one attempt");
      await c.queue.getJob({ jobId: "x" }).catch(() => undefined);
      assert.equal(calls.get("get-x"), 1, "NOT_FOUND is final");
    } finally {
      c.close();
    }
  });

  test("retry: false turns it off", async () => {
    const c = createQueueClients({ address, retry: false });
    try {
      await c.credits.getBalance({ userId: "flaky-1" }).catch(() => undefined);
      assert.equal(calls.get("flaky-1"), 1);
    } finally {
      c.close();
    }
  });
});
