// withUserAssertion() and userAssertionInterceptor() against an in-process gRPC server that
// reports the `x-user-assertion` header it received (no QUEUE_ADDR needed). The live check
// against a queue that verifies assertions is test/replicas/user-assertions.test.ts.
import assert from "node:assert/strict";
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";

import type { ConnectRouter, HandlerContext } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";

import {
  AnalysisQueueService,
  createQueueClients,
  CreditsService,
  USER_ASSERTION_HEADER,
  userAssertionInterceptor,
  withUserAssertion,
} from "../src/index.js";

/** The header the server saw, as a job id, so the client can read it back from the answer. */
const seen = (ctx: HandlerContext) => ctx.requestHeader.get(USER_ASSERTION_HEADER) ?? "(none)";

function routes(router: ConnectRouter) {
  router.service(AnalysisQueueService, {
    getJob: (req, ctx) => ({ job: { jobId: seen(ctx), userId: req.userId } }),
    listJobs: (_req, ctx) => ({ jobs: [{ jobId: seen(ctx) }] }),
    async *watchJobs(req, ctx) {
      yield { job: { jobId: seen(ctx), userId: req.userId }, snapshotComplete: true };
    },
  });
  router.service(CreditsService, { getBalance: (_req, ctx) => ({ balance: BigInt(seen(ctx).length) }) });
}

describe("per-user assertions (in-process gRPC server)", () => {
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

  test("withUserAssertion() sends the assertion and keeps the other call options", async () => {
    const c = createQueueClients({ address, timeoutMs: 5_000 });
    try {
      const options = withUserAssertion("jwt-for-alice", { timeoutMs: 4_000, headers: { "x-other": "kept" } });
      assert.equal(new Headers(options.headers).get("x-other"), "kept");
      assert.equal(options.timeoutMs, 4_000);
      assert.equal((await c.queue.getJob({ jobId: "j", userId: "alice" }, options)).job?.jobId, "jwt-for-alice");
      assert.equal((await c.queue.getJob({ jobId: "j", userId: "alice" })).job?.jobId, "(none)");
    } finally {
      c.close();
    }
  });

  test("userAssertionInterceptor() mints one per call for the request's user, streams included", async () => {
    const minted: string[] = [];
    const c = createQueueClients({
      address,
      timeoutMs: 5_000,
      interceptors: [
        userAssertionInterceptor(async (userId, method) => {
          minted.push(`${method}:${userId}`);
          return `jwt-${method}-${userId}`;
        }),
      ],
    });
    try {
      assert.equal((await c.queue.listJobs({ userId: "alice" })).jobs[0]?.jobId, "jwt-ListJobs-alice");
      const watched = [];
      for await (const message of c.queue.watchJobs({ userId: "bob" })) {
        watched.push(message.job);
      }
      // The stream's one request message still reaches the server after the interceptor read it.
      assert.deepEqual(watched.map((job) => [job?.jobId, job?.userId]), [["jwt-WatchJobs-bob", "bob"]]);
      // An assertion given for the call wins; a call without a userId, or of another service, gets none.
      assert.equal((await c.queue.getJob({ jobId: "j", userId: "alice" }, withUserAssertion("explicit"))).job?.jobId, "explicit");
      assert.equal((await c.queue.getJob({ jobId: "j" })).job?.jobId, "(none)");
      assert.equal((await c.credits.getBalance({ userId: "alice" })).balance, BigInt("(none)".length));
      assert.deepEqual(minted, ["ListJobs:alice", "WatchJobs:bob"]);
    } finally {
      c.close();
    }
  });
});
