// The client across a replica drain and a replica restart, with real `queue-service serve`
// processes (see replica.ts). Run through .ci/clients_live.py (`npm run test:replicas`).
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { createQueueClients, JobStatus, listAllJobs, toJobJson, watchJobs } from "../../src/index.js";
import { admitRequest, uniqueUser } from "../support.js";
import { callbackPort, Replica } from "./replica.js";

describe("replica drain and restart", () => {
  let stable: Replica; // the dev core's callback target; stays up throughout

  before(async () => {
    stable = await Replica.start(callbackPort());
  });
  after(async () => {
    assert.equal(await stable.stop(), 0, `the stable replica did not drain cleanly:\n${stable.log.slice(-2000)}`);
  });

  test("Admit is retried across a drain and restart: one job, one charge", async () => {
    const replica = await Replica.start();
    const userId = uniqueUser("drain");
    let attempts = 0;
    const c = createQueueClients({
      address: replica.address,
      timeoutMs: 60_000,
      retry: { maxAttempts: 50, maxBackoffMs: 500 },
      interceptors: [(next) => (req) => ((attempts += req.method.name === "Admit" ? 1 : 0), next(req))],
    });
    try {
      await c.credits.grantCredits({ userId, amount: 3n, idempotencyKey: `grant-${userId}` });
      replica.beginDrain();
      // Admit while the replica drains and after it is gone; it comes back on the same port.
      const admitted = c.queue.admit(admitRequest(userId, "click-during-drain"));
      assert.equal(await replica.exited(), 0, `the drain did not end cleanly:\n${replica.log.slice(-2000)}`);
      await replica.start();
      const job = (await admitted).job;
      assert.ok(job);
      assert.ok(attempts >= 2, `Admit reached the replica ${attempts} time(s): the drain was not in its way`);

      const jobs = [];
      for await (const listed of listAllJobs(c.queue, userId)) {
        jobs.push(listed);
      }
      assert.deepEqual(jobs.map((j) => j.jobId), [job.jobId], "exactly one job");
      assert.equal((await c.credits.getBalance({ userId })).balance, 2n, "exactly one charge");
    } finally {
      c.close();
      await replica.stop();
    }
  });

  test("watchJobs() survives a replica restart and ends equal to GetJob", async () => {
    const replica = await Replica.start();
    const userId = uniqueUser("restart");
    const watcherClients = createQueueClients({ address: replica.address, timeoutMs: 10_000 });
    const c = createQueueClients({ address: stable.address, timeoutMs: 10_000 });
    const watch = watchJobs(watcherClients.queue, userId, { maxBackoffMs: 500 });
    const events: string[] = [];
    watch.subscribe((e) => events.push(e.type));
    try {
      await c.credits.grantCredits({ userId, amount: 3n, idempotencyKey: `grant-${userId}` });
      await watch.nextSync();
      const ids = [];
      for (const click of [1, 2, 3]) {
        ids.push((await c.queue.admit(admitRequest(userId, `click-${click}`))).job!.jobId);
      }
      assert.equal(await replica.stop(), 0, "the watched replica drains cleanly");
      await new Promise((r) => setTimeout(r, 1_500)); // jobs move on while the watch is cut off
      await replica.start();
      await watch.nextSync();

      const deadline = Date.now() + 30_000;
      for (;;) {
        const truth = await Promise.all(ids.map(async (id) => (await c.queue.getJob({ jobId: id })).job!));
        const allDone = truth.every((j) => j.status === JobStatus.SUCCEEDED);
        // After a reset a job finished while cut off is gone from the view; anything the view
        // still holds must equal GetJob, and every active job must be in it.
        const consistent = truth.every((j) => {
          const seen = watch.jobs.get(j.jobId);
          const active = j.status === JobStatus.QUEUED || j.status === JobStatus.PENDING || j.status === JobStatus.RUNNING;
          return seen === undefined ? !active : JSON.stringify(toJobJson(seen)) === JSON.stringify(toJobJson(j));
        });
        if (allDone && consistent && watch.synced) {
          break;
        }
        assert.ok(Date.now() < deadline, `the watch never matched GetJob; events: ${events.join(",")}`);
        await new Promise((r) => setTimeout(r, 100));
      }
      assert.ok(events.includes("disconnected"), `the restart was not seen: ${events.join(",")}`);
      assert.ok(events.filter((e) => e === "reset").length >= 2, `no re-sync after the restart: ${events.join(",")}`);
    } finally {
      watch.close();
      await watch.done;
      watcherClients.close();
      c.close();
      await replica.stop();
    }
  });
});
