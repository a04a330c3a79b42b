import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  Code,
  ConnectError,
  describeError,
  formatError,
  JobStatus,
  QUEUE_ERROR_DOMAIN,
} from "../src/index.js";
import { admitRequest, uniqueUser, withClients } from "./support.js";

/** Runs `call`, asserts it fails, and returns the error. */
async function expectFailure(call: () => Promise<unknown>): Promise<unknown> {
  try {
    await call();
  } catch (err) {
    return err;
  }
  assert.fail("expected the call to fail, but it succeeded");
}

describe("Admit", () => {
  test("admits three jobs: the first holds the slot, the next two queue at 1 and 2", () =>
    withClients(async (c) => {
      const userId = uniqueUser("admit");
      const grant = await c.credits.grantCredits({ userId, amount: 5n, idempotencyKey: `grant-${userId}` });
      assert.equal(grant.balance, 5n);

      const jobs = [];
      for (const click of [1, 2, 3]) {
        const { job } = await c.queue.admit(admitRequest(userId, `click-${click}`));
        assert.ok(job, `admit #${click} returned no job`);
        jobs.push(job);
      }
      const [first, second, third] = jobs;
      assert.ok(first && second && third);

      assert.ok(
        first.status === JobStatus.PENDING || first.status === JobStatus.RUNNING,
        `first job: expected PENDING or RUNNING, got ${JobStatus[first.status]}`,
      );
      assert.equal(first.queuePosition, 0);
      assert.equal(second.status, JobStatus.QUEUED, `second job is ${JobStatus[second.status]}`);
      assert.equal(second.queuePosition, 1);
      assert.equal(third.status, JobStatus.QUEUED, `third job is ${JobStatus[third.status]}`);
      assert.equal(third.queuePosition, 2);
      for (const job of jobs) {
        assert.equal(job.userId, userId);
        assert.match(job.jobId, /^[0-9a-f-]{36}$/i);
        assert.match(job.runId, /^[0-9a-f-]{36}$/i);
      }
      assert.equal(new Set(jobs.map((j) => j.jobId)).size, 3);

      const { balance } = await c.credits.getBalance({ userId });
      assert.equal(balance, 2n, "5 granted - 3 charged");
    }));

  test("a user without credits gets FAILED_PRECONDITION INSUFFICIENT_CREDITS", () =>
    withClients(async (c) => {
      const userId = uniqueUser("broke");
      const err = await expectFailure(() => c.queue.admit(admitRequest(userId, "click-1")));
      assert.ok(err instanceof ConnectError, `expected ConnectError, got ${String(err)}`);
      assert.equal(err.code, Code.FailedPrecondition);

      const d = describeError(err);
      assert.equal(d.code, Code.FailedPrecondition);
      assert.equal(d.codeName, "FAILED_PRECONDITION");
      assert.equal(d.reason, "INSUFFICIENT_CREDITS");
      assert.equal(d.domain, QUEUE_ERROR_DOMAIN);
      assert.equal(d.metadata["balance"], "0");
      assert.equal(d.metadata["required"], "1");
      assert.equal(formatError(err), "insufficient credits: balance 0, required 1");
    }));

  test("a malformed request gets INVALID_ARGUMENT INVALID_REQUEST with field violations", () =>
    withClients(async (c) => {
      const err = await expectFailure(() =>
        c.queue.admit({
          userId: "",
          idempotencyKey: "",
          document: { uri: "s3://theses/x.pdf", title: "no user, no key, no sources" },
          sources: [],
        }),
      );
      const d = describeError(err);
      assert.equal(d.code, Code.InvalidArgument, `got ${d.codeName}: ${d.message}`);
      assert.equal(d.reason, "INVALID_REQUEST");
      assert.equal(d.domain, QUEUE_ERROR_DOMAIN);
      // Named as the request's properties are (camelCase), with the service's name beside.
      const fields = d.fieldViolations.map((v) => [v.field, v.protoField]);
      for (const field of [
        ["userId", "user_id"],
        ["idempotencyKey", "idempotency_key"],
        ["sources", "sources"],
      ]) {
        assert.ok(
          fields.some(([camel, proto]) => camel === field[0] && proto === field[1]),
          `no violation for ${field.join(" / ")}; got ${JSON.stringify(d.fieldViolations)}`,
        );
      }
      for (const v of d.fieldViolations) {
        assert.notEqual(v.description, "", `violation for ${v.field} has no description`);
      }
      const formatted = formatError(err);
      assert.match(formatted, /^invalid request: /);
      for (const field of ["user_id", "idempotency_key", "sources"]) {
        assert.ok(formatted.includes(field), `formatError omits ${field}: ${formatted}`);
      }
    }));
});
