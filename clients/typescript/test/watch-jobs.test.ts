import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { describeError, JobStatus } from "../src/index.js";
import { admitRequest, uniqueUser, withClients } from "./support.js";

/** How long the stream may take to show the hand-over (dev core judges for ~1 s in CI). */
const WATCH_DEADLINE_MS = 20_000;

describe("WatchJobs", () => {
  test("streams the first job succeeding and the second one taking the slot", () =>
    withClients(async (c) => {
      const userId = uniqueUser("watch");
      await c.credits.grantCredits({ userId, amount: 2n, idempotencyKey: `grant-${userId}` });
      const first = (await c.queue.admit(admitRequest(userId, "click-1"))).job;
      const second = (await c.queue.admit(admitRequest(userId, "click-2"))).job;
      assert.ok(first && second);
      assert.equal(second.status, JobStatus.QUEUED);

      const seen: string[] = [];
      let snapshotComplete = false;
      let snapshotHadSecondQueued = false;
      let firstSucceeded = false;
      let secondStarted = false;

      const controller = new AbortController();
      try {
        for await (const msg of c.queue.watchJobs(
          { userId },
          { timeoutMs: WATCH_DEADLINE_MS, signal: controller.signal },
        )) {
          const job = msg.job;
          seen.push(
            `${job ? `${job.jobId === first.jobId ? "first" : job.jobId === second.jobId ? "second" : job.jobId}=${JobStatus[job.status]}` : "(no job)"}` +
              (msg.snapshotComplete ? " [snapshot complete]" : ""),
          );
          if (!snapshotComplete) {
            if (job?.jobId === second.jobId && job.status === JobStatus.QUEUED) {
              snapshotHadSecondQueued = true;
            }
            snapshotComplete = msg.snapshotComplete;
          }
          if (job?.jobId === first.jobId && job.status === JobStatus.SUCCEEDED) {
            firstSucceeded = true;
          }
          if (
            firstSucceeded &&
            job?.jobId === second.jobId &&
            (job.status === JobStatus.PENDING || job.status === JobStatus.RUNNING)
          ) {
            secondStarted = true;
            break; // Ends the stream (the client cancels the call).
          }
        }
      } catch (err) {
        const d = describeError(err);
        assert.fail(`WatchJobs ended with ${d.codeName}: ${d.message}; messages seen: ${seen.join(" | ")}`);
      } finally {
        controller.abort();
      }

      assert.ok(snapshotComplete, `no snapshot_complete marker; messages: ${seen.join(" | ")}`);
      assert.ok(snapshotHadSecondQueued, `snapshot lacked the second job as QUEUED; messages: ${seen.join(" | ")}`);
      assert.ok(firstSucceeded, `first job never SUCCEEDED on the stream; messages: ${seen.join(" | ")}`);
      assert.ok(secondStarted, `second job never became PENDING/RUNNING; messages: ${seen.join(" | ")}`);
    }));
});
