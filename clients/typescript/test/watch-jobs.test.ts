import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { equals } from "@bufbuild/protobuf";

import { describeError, type Job, JobSchema, JobStatus, watchJobs } from "../src/index.js";
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

  test("watchJobs reports a change only when the job differs from the version it holds", () =>
    withClients(async (c) => {
      // Three jobs run one after another; each hand-over sends the user's other jobs again, often
      // exactly as they were. Those repeats are no change, and `previous` is what the watch held.
      const userId = uniqueUser("watch-changes");
      await c.credits.grantCredits({ userId, amount: 3n, idempotencyKey: `grant-${userId}` });
      const watch = watchJobs(c.queue, userId);
      const held = new Map<string, Job>();
      const repeats: string[] = [];
      const wrongPrevious: string[] = [];
      const succeeded = new Set<string>();
      let allSucceeded!: () => void;
      const finished = new Promise<void>((resolve) => (allSucceeded = resolve));
      watch.subscribe((event) => {
        if (event.type !== "change") return;
        const before = held.get(event.job.jobId);
        if (before !== undefined && equals(JobSchema, before, event.job)) {
          repeats.push(`${event.job.jobId} ${JobStatus[event.job.status]}`);
        }
        if (event.previous !== before) wrongPrevious.push(event.job.jobId);
        held.set(event.job.jobId, event.job);
        if (event.job.status === JobStatus.SUCCEEDED) succeeded.add(event.job.jobId);
        if (succeeded.size === 3) allSucceeded();
      });
      let timer: NodeJS.Timeout | undefined;
      try {
        await watch.nextSync();
        for (let click = 1; click <= 3; click++) await c.queue.admit(admitRequest(userId, `click-${click}`));
        await Promise.race([
          finished,
          new Promise((_, reject) => {
            timer = setTimeout(() => reject(new Error(`3 jobs not SUCCEEDED on the watch within ${WATCH_DEADLINE_MS} ms`)), WATCH_DEADLINE_MS);
          }),
        ]);
      } finally {
        clearTimeout(timer);
        watch.close();
      }
      assert.deepEqual(repeats, [], "change events that repeat the job as the watch held it");
      assert.deepEqual(wrongPrevious, [], "change events whose `previous` is not the job the watch held");
    }));
});
