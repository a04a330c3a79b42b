// Shared helpers for the live tests: the service address, unique ids, request builders.
import { randomBytes } from "node:crypto";

import { createQueueClients, type QueueClients } from "../src/index.js";

/**
 * The live queue service's address from QUEUE_ADDR. Throws (so the test fails, never skips)
 * when it is unset: these tests exist to prove the client against the real service.
 */
export function queueAddr(): string {
  const addr = process.env["QUEUE_ADDR"]?.trim() ?? "";
  if (addr === "") {
    throw new Error(
      "QUEUE_ADDR is not set: these tests need a live queue service. " +
        "Start one from the repository root (QUEUE_LISTEN_ADDR=127.0.0.1:50071 .venv/bin/queue-service dev) " +
        "and run: QUEUE_ADDR=127.0.0.1:50071 npm test",
    );
  }
  return addr;
}

/**
 * Runs `fn` with clients for the live service (10 s default deadline for unary calls) and
 * closes them afterwards. Called inside each test, so a missing QUEUE_ADDR fails every test.
 */
export async function withClients<T>(fn: (c: QueueClients) => Promise<T>): Promise<T> {
  const c = createQueueClients({ address: queueAddr(), timeoutMs: 10_000 });
  try {
    return await fn(c);
  } finally {
    c.close();
  }
}

const runId = `${Date.now()}-${randomBytes(3).toString("hex")}`;
let counter = 0;

/** A user id unique to this test run (reruns against the same database never collide). */
export function uniqueUser(label: string): string {
  counter += 1;
  return `ts-${runId}-${label}-${counter}`;
}

/** A valid first-pass Admit request for `userId` with idempotency key `key`. */
export function admitRequest(userId: string, key: string) {
  return {
    userId,
    idempotencyKey: key,
    document: { uri: "s3://theses/x.pdf", title: `Thesis ${key}` },
    sources: [{ doi: "10.1234/abc", citation: "Doe, J. (2020). A study of citations." }],
  };
}
