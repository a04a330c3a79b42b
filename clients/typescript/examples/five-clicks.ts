// Five clicks on "Start analysis": five admits for one user, printing each job's queue position.
// Run against a live service:  QUEUE_ADDR=127.0.0.1:50051 npx tsx examples/five-clicks.ts
import { randomUUID } from "node:crypto";

import { createQueueClients, describeError, formatError, JobStatus } from "../src/index.js";

const { queue, credits, close } = createQueueClients({
  address: process.env["QUEUE_ADDR"] ?? "127.0.0.1:50051",
  timeoutMs: 10_000,
});

const userId = `demo-${Date.now()}`;
try {
  // Admin tooling: give the user 3 credits, so clicks 4 and 5 show INSUFFICIENT_CREDITS.
  await credits.grantCredits({ userId, amount: 3n, idempotencyKey: `welcome-${userId}` });

  for (let click = 1; click <= 5; click++) {
    try {
      const { job } = await queue.admit({
        userId,
        idempotencyKey: randomUUID(), // one key per click; reuse it when retrying that click
        document: { uri: "s3://theses/x.pdf", title: `Thesis ${click}` },
        sources: [{ doi: "10.1234/abc", citation: "Doe, J. (2020). A study of citations." }],
      });
      if (!job) throw new Error("admit returned no job");
      const where = job.queuePosition === 0 ? "starts now" : `queue position ${job.queuePosition}`;
      console.log(`click ${click}: job ${job.jobId} ${JobStatus[job.status]}, ${where}`);
    } catch (err) {
      const e = describeError(err);
      console.log(`click ${click}: ${formatError(err)}`); // "insufficient credits: balance 0, required 1"
      if (e.reason === "INSUFFICIENT_CREDITS") {
        console.log(`  -> top up ${Number(e.metadata["required"]) - Number(e.metadata["balance"])} credit(s)`);
      } else if (e.reason === "INVALID_REQUEST") {
        for (const v of e.fieldViolations) console.log(`  -> ${v.field}: ${v.description}`);
      }
    }
  }
} finally {
  close();
}
