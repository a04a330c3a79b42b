// Every RPC of the queue's services against the live service (QUEUE_ADDR), through the public API.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  Code,
  describeError,
  isRetryable,
  JobStatus,
  listAllJobs,
  reasonOf,
  RunOutcome,
  timestampDate,
  toJobJson,
  watchJobs,
} from "../src/index.js";
import { admitRequest, uniqueUser, withClients } from "./support.js";

async function failure(call: () => Promise<unknown>): Promise<ReturnType<typeof describeError>> {
  try {
    await call();
  } catch (err) {
    return describeError(err);
  }
  assert.fail("expected the call to fail, but it succeeded");
}

async function eventually<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 20_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) {
      return value;
    }
    if (Date.now() > deadline) {
      assert.fail(`timed out waiting for ${what}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe("every RPC", () => {
  test("Admit is idempotent by key; the same key with another payload is IDEMPOTENCY_KEY_REUSED", () =>
    withClients(async (c) => {
      const userId = uniqueUser("replay");
      await c.credits.grantCredits({ userId, amount: 3n, idempotencyKey: `grant-${userId}` });
      const first = (await c.queue.admit(admitRequest(userId, "click-1"))).job;
      const replay = (await c.queue.admit(admitRequest(userId, "click-1"))).job;
      assert.ok(first && replay);
      assert.equal(replay.jobId, first.jobId, "a replay returns the same job");
      assert.equal((await c.credits.getBalance({ userId })).balance, 2n, "charged once");

      const other = { ...admitRequest(userId, "click-1"), document: { uri: "s3://theses/other.pdf", title: "" } };
      const d = await failure(() => c.queue.admit(other));
      assert.equal(d.code, Code.FailedPrecondition);
      assert.equal(d.reason, "IDEMPOTENCY_KEY_REUSED");
      assert.equal(d.metadata["jobId"], first.jobId);
      assert.equal(d.retryable, false);
    }));

  test("GetJob returns the job; an unknown id is JOB_NOT_FOUND, a malformed one INVALID_REQUEST", () =>
    withClients(async (c) => {
      const userId = uniqueUser("get");
      await c.credits.grantCredits({ userId, amount: 1n, idempotencyKey: `grant-${userId}` });
      const admitted = (await c.queue.admit(admitRequest(userId, "click-1"))).job;
      assert.ok(admitted);
      const got = (await c.queue.getJob({ jobId: admitted.jobId })).job;
      assert.equal(got?.jobId, admitted.jobId);
      assert.equal(got?.price, 1n);
      assert.ok(got?.createTime && timestampDate(got.createTime) instanceof Date);

      const unknown = await failure(() => c.queue.getJob({ jobId: "00000000-0000-4000-8000-000000000000" }));
      assert.equal(unknown.reason, "JOB_NOT_FOUND");
      assert.equal(unknown.code, Code.NotFound);
      const malformed = await failure(() => c.queue.getJob({ jobId: "nope" }));
      assert.equal(malformed.reason, "INVALID_REQUEST");
    }));

  test("CancelJob cancels a queued job and refunds it; again is idempotent; a finished job is JOB_ALREADY_FINISHED", () =>
    withClients(async (c) => {
      const userId = uniqueUser("cancel");
      await c.credits.grantCredits({ userId, amount: 2n, idempotencyKey: `grant-${userId}` });
      const running = (await c.queue.admit(admitRequest(userId, "click-1"))).job;
      const queued = (await c.queue.admit(admitRequest(userId, "click-2"))).job;
      assert.ok(running && queued);
      assert.equal(queued.status, JobStatus.QUEUED);

      const canceled = (await c.queue.cancelJob({ jobId: queued.jobId, userId })).job;
      assert.equal(canceled?.status, JobStatus.CANCELED);
      assert.equal(canceled?.refunded, true);
      assert.equal((await c.credits.getBalance({ userId })).balance, 1n, "2 granted - 2 charged + 1 refunded");
      assert.equal((await c.queue.cancelJob({ jobId: queued.jobId, userId })).job?.status, JobStatus.CANCELED);

      const other = await failure(() => c.queue.cancelJob({ jobId: queued.jobId, userId: uniqueUser("stranger") }));
      assert.equal(other.reason, "JOB_NOT_FOUND");

      await eventually("the first job to succeed", async () => {
        const job = (await c.queue.getJob({ jobId: running.jobId })).job;
        return job?.status === JobStatus.SUCCEEDED ? job : undefined;
      });
      const finished = await failure(() => c.queue.cancelJob({ jobId: running.jobId, userId }));
      assert.equal(finished.reason, "JOB_ALREADY_FINISHED");
      assert.equal(finished.metadata["jobId"], running.jobId);
    }));

  test("Promote with nothing queued returns no job; Release of a job that is not PENDING is JOB_NOT_PENDING", () =>
    withClients(async (c) => {
      const userId = uniqueUser("promote");
      assert.equal((await c.queue.promote({ userId })).job, undefined);
      await c.credits.grantCredits({ userId, amount: 2n, idempotencyKey: `grant-${userId}` });
      await c.queue.admit(admitRequest(userId, "click-1"));
      const queued = (await c.queue.admit(admitRequest(userId, "click-2"))).job;
      assert.ok(queued);
      assert.equal((await c.queue.promote({ userId })).job, undefined, "the slot is taken");

      const d = await failure(() => c.queue.release({ jobId: queued.jobId }));
      assert.equal(d.code, Code.FailedPrecondition);
      assert.equal(d.reason, "JOB_NOT_PENDING");
      assert.equal(d.metadata["status"], "QUEUED");
      const unknown = await failure(() => c.queue.release({ jobId: "00000000-0000-4000-8000-000000000000" }));
      assert.equal(unknown.reason, "JOB_NOT_FOUND");
    }));

  test("CompleteRun for an unknown run is RUN_NOT_FOUND; GrantCredits replays by key", () =>
    withClients(async (c) => {
      const d = await failure(() =>
        c.coreCallback.completeRun({ runId: "00000000-0000-4000-8000-000000000000", outcome: RunOutcome.SUCCEEDED }),
      );
      assert.equal(d.reason, "RUN_NOT_FOUND");
      const userId = uniqueUser("grant");
      await c.credits.grantCredits({ userId, amount: 4n, idempotencyKey: "once" });
      assert.equal((await c.credits.grantCredits({ userId, amount: 4n, idempotencyKey: "once" })).balance, 4n);
      const reused = await failure(() => c.credits.grantCredits({ userId, amount: 5n, idempotencyKey: "once" }));
      assert.equal(reused.reason, "IDEMPOTENCY_KEY_REUSED");
      assert.equal(reused.metadata["grantedAmount"], "4");
    }));

  test("operator: GetOverview counts the queue; SearchJobs finds a user's jobs across the queue", () =>
    withClients(async (c) => {
      const userId = uniqueUser("operator");
      await c.credits.grantCredits({ userId, amount: 2n, idempotencyKey: `grant-${userId}` });
      const first = (await c.queue.admit(admitRequest(userId, "click-1"))).job;
      const second = (await c.queue.admit(admitRequest(userId, "click-2"))).job;
      assert.ok(first && second);
      const overview = (await c.operator.getOverview({ windowMinutes: 15 })).overview;
      assert.ok(overview);
      assert.ok(overview.queued >= 1n, "the second click waits");
      assert.ok(overview.usersWaiting >= 1n);
      const found = await c.operator.searchJobs({ filter: { userId }, pageSize: 10 });
      assert.deepEqual(
        found.jobs.map((j) => j.jobId),
        [second.jobId, first.jobId],
        "newest admitted first",
      );
    }));

  test("listAllJobs walks every page; toJobJson survives JSON.stringify", () =>
    withClients(async (c) => {
      const userId = uniqueUser("pages");
      await c.credits.grantCredits({ userId, amount: 5n, idempotencyKey: `grant-${userId}` });
      const admitted = [];
      for (const click of [1, 2, 3, 4, 5]) {
        admitted.push((await c.queue.admit(admitRequest(userId, `click-${click}`))).job?.jobId);
      }
      const listed = [];
      for await (const job of listAllJobs(c.queue, userId, { pageSize: 2 })) {
        listed.push(job);
      }
      assert.deepEqual(listed.map((j) => j.jobId), admitted.reverse(), "every job once, newest first");
      const first = listed[0];
      assert.ok(first);
      assert.throws(() => JSON.stringify(first), TypeError, "a raw Job has a bigint");
      const json = JSON.parse(JSON.stringify(toJobJson(first))) as Record<string, unknown>;
      assert.equal(json["jobId"], first.jobId);
      assert.equal(json["price"], "1");
      assert.equal(json["status"], "JOB_STATUS_QUEUED");
    }));

  test("watchJobs() syncs, follows changes, and ends equal to GetJob", () =>
    withClients(async (c) => {
      const userId = uniqueUser("watcher");
      await c.credits.grantCredits({ userId, amount: 2n, idempotencyKey: `grant-${userId}` });
      const first = (await c.queue.admit(admitRequest(userId, "click-1"))).job;
      const watch = watchJobs(c.queue, userId);
      try {
        await watch.nextSync();
        assert.ok(first && watch.jobs.has(first.jobId), "the snapshot holds the active job");
        const second = (await c.queue.admit(admitRequest(userId, "click-2"))).job;
        assert.ok(second);
        await eventually("both jobs to succeed on the watch", async () =>
          [first.jobId, second.jobId].every((id) => watch.jobs.get(id)?.status === JobStatus.SUCCEEDED) ? true : undefined,
        );
        for (const id of [first.jobId, second.jobId]) {
          const truth = (await c.queue.getJob({ jobId: id })).job;
          assert.ok(truth);
          assert.deepEqual(toJobJson(watch.jobs.get(id)!), toJobJson(truth));
        }
      } finally {
        watch.close();
        await watch.done;
      }
    }));

  test("typed reasons: reasonOf and isRetryable read a live error", () =>
    withClients(async (c) => {
      try {
        await c.queue.admit(admitRequest(uniqueUser("broke"), "k"));
        assert.fail("a user without credits cannot admit");
      } catch (err) {
        assert.equal(reasonOf(err), "INSUFFICIENT_CREDITS");
        assert.equal(isRetryable(err), false);
      }
    }));
});
