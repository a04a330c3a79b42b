import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { timestampMs } from "@bufbuild/protobuf/wkt";

import type { Job } from "../src/index.js";
import { admitRequest, uniqueUser, withClients } from "./support.js";

describe("ListJobs", () => {
  test("pages through five jobs two at a time, newest first, without duplicates", () =>
    withClients(async (c) => {
      const userId = uniqueUser("list");
      await c.credits.grantCredits({ userId, amount: 5n, idempotencyKey: `grant-${userId}` });
      const admitted: string[] = [];
      for (const click of [1, 2, 3, 4, 5]) {
        const { job } = await c.queue.admit(admitRequest(userId, `click-${click}`));
        assert.ok(job);
        admitted.push(job.jobId);
      }

      const pages: Job[][] = [];
      let pageToken = "";
      do {
        assert.ok(pages.length < 10, "pagination does not terminate");
        const res = await c.queue.listJobs({ userId, pageSize: 2, pageToken });
        pages.push(res.jobs);
        pageToken = res.nextPageToken;
      } while (pageToken !== "");

      assert.deepEqual(
        pages.map((p) => p.length),
        [2, 2, 1],
        "expected 3 pages of 2, 2 and 1 jobs",
      );
      const listed = pages.flat();
      const ids = listed.map((j) => j.jobId);
      assert.equal(new Set(ids).size, ids.length, `duplicate job ids: ${ids.join(", ")}`);
      assert.deepEqual(ids, [...admitted].reverse(), "expected all five jobs, newest first");
      for (const job of listed) {
        assert.equal(job.userId, userId);
      }
      const created = listed.map((j) => (j.createTime ? timestampMs(j.createTime) : NaN));
      for (let i = 1; i < created.length; i++) {
        assert.ok(created[i - 1]! >= created[i]!, `create_time not descending at index ${i}: ${created.join(", ")}`);
      }
    }));
});
