// Tests of the typed layer that need no queue service: an in-process gRPC server (Connect's
// Node adapter over HTTP/2) plays the service, so headers and error details travel over the wire.
import assert from "node:assert/strict";
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";

import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";

import {
  AnalysisQueueService,
  BadRequestSchema,
  camelCaseFieldPath,
  createQueueClients,
  CreditsService,
  describeError,
  ErrorInfoSchema,
  formatError,
  QUEUE_ERROR_DOMAIN,
  toBaseUrl,
} from "../src/index.js";

function routes(router: ConnectRouter) {
  router.service(CreditsService, {
    // Echoes the bearer token's length as the balance, so the test can see the header arrived.
    getBalance(_req, ctx) {
      const auth = ctx.requestHeader.get("authorization") ?? "";
      if (auth !== "Bearer s3cret") {
        throw new ConnectError(`bad authorization header: "${auth}"`, Code.Unauthenticated);
      }
      return { balance: 7n };
    },
    grantCredits() {
      throw new ConnectError("not implemented", Code.Unimplemented);
    },
  });
  router.service(AnalysisQueueService, {
    async admit(req) {
      if (req.userId === "") {
        throw new ConnectError("invalid request", Code.InvalidArgument, undefined, [
          {
            desc: ErrorInfoSchema,
            value: { reason: "INVALID_REQUEST", domain: QUEUE_ERROR_DOMAIN },
          },
          {
            desc: BadRequestSchema,
            value: {
              fieldViolations: [
                { field: "user_id", description: "must not be empty" },
                { field: "sources", description: "at least one source is required" },
              ],
            },
          },
        ]);
      }
      if (req.userId === "core-rejects") {
        throw new ConnectError("the core rejected the analysis", Code.InvalidArgument, undefined, [
          {
            desc: ErrorInfoSchema,
            value: { reason: "CORE_REJECTED", domain: QUEUE_ERROR_DOMAIN },
          },
          {
            desc: BadRequestSchema,
            value: { fieldViolations: [{ field: "sources[1].doi", description: "DOI not found at the registrar" }] },
          },
        ]);
      }
      if (req.userId === "slow") {
        await new Promise((resolve) => setTimeout(resolve, 2_000));
      }
      throw new ConnectError("insufficient credits", Code.FailedPrecondition, undefined, [
        {
          desc: ErrorInfoSchema,
          value: create(ErrorInfoSchema, {
            reason: "INSUFFICIENT_CREDITS",
            domain: QUEUE_ERROR_DOMAIN,
            metadata: { balance: "0", required: "1" },
          }),
        },
      ]);
    },
  });
}

describe("typed layer (in-process gRPC server, no QUEUE_ADDR needed)", () => {
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

  test("toBaseUrl turns host:port into an http or https URL", () => {
    assert.equal(toBaseUrl("127.0.0.1:50051", false), "http://127.0.0.1:50051");
    assert.equal(toBaseUrl("queue.internal:443", true), "https://queue.internal:443");
    assert.equal(toBaseUrl("https://queue.internal/", false), "https://queue.internal");
    assert.throws(() => toBaseUrl(" ", false), /address is empty/);
  });

  test("camelCaseFieldPath spells a contract field path as the messages' properties", () => {
    assert.equal(camelCaseFieldPath("idempotency_key"), "idempotencyKey");
    assert.equal(camelCaseFieldPath("sources[1].doi"), "sources[1].doi");
    assert.equal(camelCaseFieldPath("delta_of_job_id"), "deltaOfJobId");
    assert.equal(camelCaseFieldPath("labels[some_key].long_name"), "labels[some_key].longName");
  });

  test("sends the bearer token as an authorization header", async () => {
    const c = createQueueClients({ address, bearerToken: "s3cret", timeoutMs: 5_000 });
    try {
      assert.equal((await c.credits.getBalance({ userId: "u" })).balance, 7n);
    } finally {
      c.close();
    }
    const anonymous = createQueueClients({ address, timeoutMs: 5_000 });
    try {
      await assert.rejects(anonymous.credits.getBalance({ userId: "u" }), (err) => {
        assert.equal(describeError(err).codeName, "UNAUTHENTICATED");
        return true;
      });
    } finally {
      anonymous.close();
    }
  });

  test("decodes ErrorInfo metadata from the status details", async () => {
    const c = createQueueClients({ address, timeoutMs: 5_000 });
    try {
      const err = await c.queue.admit({ userId: "u", idempotencyKey: "k" }).then(
        () => assert.fail("admit should fail"),
        (e: unknown) => e,
      );
      assert.deepEqual(describeError(err), {
        code: Code.FailedPrecondition,
        codeName: "FAILED_PRECONDITION",
        message: "insufficient credits",
        reason: "INSUFFICIENT_CREDITS",
        domain: QUEUE_ERROR_DOMAIN,
        metadata: { balance: "0", required: "1" },
        fieldViolations: [],
        retryable: false,
        retryDelayMs: undefined,
      });
      assert.equal(formatError(err), "insufficient credits: balance 0, required 1");
    } finally {
      c.close();
    }
  });

  test("decodes BadRequest field violations", async () => {
    const c = createQueueClients({ address, timeoutMs: 5_000 });
    try {
      const err = await c.queue.admit({ userId: "" }).then(
        () => assert.fail("admit should fail"),
        (e: unknown) => e,
      );
      const d = describeError(err);
      assert.equal(d.code, Code.InvalidArgument);
      assert.equal(d.reason, "INVALID_REQUEST");
      // Fields as the client's messages spell them; the service's own name kept beside.
      assert.deepEqual(d.fieldViolations, [
        { field: "userId", protoField: "user_id", description: "must not be empty" },
        { field: "sources", protoField: "sources", description: "at least one source is required" },
      ]);
      assert.equal(
        formatError(err),
        "invalid request: userId: must not be empty; sources: at least one source is required",
      );
    } finally {
      c.close();
    }
  });

  test("formatError names each field violation of any reason, not only INVALID_REQUEST's", async () => {
    const c = createQueueClients({ address, timeoutMs: 5_000 });
    try {
      const err = await c.queue.admit({ userId: "core-rejects" }).then(
        () => assert.fail("admit should fail"),
        (e: unknown) => e,
      );
      assert.equal(formatError(err), "core rejected: the core rejected the analysis (sources[1].doi: DOI not found at the registrar)");
    } finally {
      c.close();
    }
  });

  test("applies the default deadline to unary calls", async () => {
    const c = createQueueClients({ address, timeoutMs: 200 });
    try {
      const err = await c.queue.admit({ userId: "slow" }).then(
        () => assert.fail("admit should time out"),
        (e: unknown) => e,
      );
      assert.equal(describeError(err).code, Code.DeadlineExceeded);
      assert.equal(formatError(err).startsWith("DEADLINE_EXCEEDED"), true);
    } finally {
      c.close();
    }
  });

  test("describes errors that are not ConnectErrors", () => {
    const d = describeError(new Error("boom"));
    assert.equal(d.code, Code.Unknown);
    assert.equal(d.message, "boom");
    assert.equal(d.reason, "");
    assert.deepEqual(d.fieldViolations, []);
    assert.equal(formatError(new Error("boom")), "UNKNOWN: boom");
  });
});
