// Per-user assertions end to end: a real `queue-service serve` with an auth file and the web
// backend's Ed25519 public key (QUEUE_USER_ASSERTION_KEY_FILE), called by this client with
// userAssertionInterceptor() minting a JWT per call. Run through .ci/clients_live.py
// (`npm run test:replicas`), which provides the database and the dev core.
import assert from "node:assert/strict";
import { createHash, generateKeyPairSync, type KeyObject, randomBytes, sign } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { Code, ConnectError } from "@connectrpc/connect";

import {
  createQueueClients,
  describeError,
  JobStatus,
  listAllJobs,
  reasonOf,
  userAssertionInterceptor,
  watchJobs,
  type QueueClients,
} from "../../src/index.js";
import { admitRequest, uniqueUser } from "../support.js";
import { Replica } from "./replica.js";

const ISSUER = "https://web.acurio.example";

/** What the web backend does with its private key (here with node:crypto; `jose` does the same). */
function mintAssertion(privateKey: KeyObject, userId: string, lifetimeSeconds = 60): string {
  const encode = (value: object) => Buffer.from(JSON.stringify(value)).toString("base64url");
  const now = Math.floor(Date.now() / 1000);
  const signingInput = `${encode({ alg: "EdDSA", typ: "JWT" })}.${encode({
    sub: userId,
    aud: "acurio-queue",
    iss: ISSUER,
    iat: now,
    exp: now + lifetimeSeconds,
  })}`;
  return `${signingInput}.${sign(null, Buffer.from(signingInput), privateKey).toString("base64url")}`;
}

describe("per-user assertions against a live replica", () => {
  const folder = mkdtempSync(join(tmpdir(), "queue-assertions-"));
  const { privateKey, publicKey } = generateKeyPairSync("ed25519");
  const tokens = { web: randomBytes(24).toString("hex"), operator: randomBytes(24).toString("hex") };
  let replica: Replica;
  let operator: QueueClients;

  const webClients = (mint?: (userId: string) => string) =>
    createQueueClients({
      address: replica.address,
      timeoutMs: 10_000,
      bearerToken: tokens.web,
      interceptors: mint ? [userAssertionInterceptor(mint)] : [],
    });

  before(async () => {
    const sha256 = (token: string) => createHash("sha256").update(token).digest("hex");
    writeFileSync(
      join(folder, "auth.json"),
      JSON.stringify({
        tokens: Object.entries(tokens).map(([role, token]) => ({ name: `${role}-caller`, role, sha256: sha256(token) })),
      }),
    );
    writeFileSync(join(folder, "web-backend.pub.pem"), publicKey.export({ type: "spki", format: "pem" }));
    replica = await Replica.start(undefined, {
      env: {
        QUEUE_AUTH_FILE: join(folder, "auth.json"),
        QUEUE_USER_ASSERTION_KEY_FILE: join(folder, "web-backend.pub.pem"),
        QUEUE_USER_ASSERTION_ISSUER: ISSUER,
      },
      probeToken: tokens.operator,
    });
    operator = createQueueClients({ address: replica.address, timeoutMs: 10_000, bearerToken: tokens.operator });
  });
  after(async () => {
    operator?.close();
    const code = await replica?.stop();
    rmSync(folder, { recursive: true, force: true });
    assert.equal(code, 0, `the replica did not drain cleanly:\n${replica?.log.slice(-2000)}`);
  });

  test("the web backend acts for the user its assertion names: admit, list, get, watch, cancel", async () => {
    const alice = uniqueUser("assert");
    await operator.credits.grantCredits({ userId: alice, amount: 2n, idempotencyKey: `grant-${alice}` });
    const c = webClients((userId) => mintAssertion(privateKey, userId));
    const watch = watchJobs(c.queue, alice, { maxBackoffMs: 500 });
    try {
      await watch.nextSync();
      const job = (await c.queue.admit(admitRequest(alice, "click-1"))).job!;
      const listed = [];
      for await (const found of listAllJobs(c.queue, alice)) {
        listed.push(found.jobId);
      }
      assert.deepEqual(listed, [job.jobId]);
      assert.equal((await c.queue.getJob({ jobId: job.jobId, userId: alice })).job?.jobId, job.jobId);
      const deadline = Date.now() + 15_000;
      while (!watch.jobs.has(job.jobId)) {
        assert.ok(Date.now() < deadline, "the watch never showed the admitted job");
        await new Promise((r) => setTimeout(r, 50));
      }
      const canceled = (await c.queue.cancelJob({ jobId: job.jobId, userId: alice })).job!;
      assert.equal(canceled.status, JobStatus.CANCELED);
      assert.equal((await operator.credits.getBalance({ userId: alice })).balance, 2n, "charged once, refunded once");
    } finally {
      watch.close();
      c.close();
    }
  });

  test("a mismatched user is PERMISSION_DENIED USER_MISMATCH and spends nothing; no assertion is UNAUTHENTICATED", async () => {
    const alice = uniqueUser("victim");
    const mallory = uniqueUser("other");
    await operator.credits.grantCredits({ userId: alice, amount: 1n, idempotencyKey: `grant-${alice}` });
    // A backend bug: the session is mallory's, the request names alice.
    const buggy = webClients(() => mintAssertion(privateKey, mallory));
    const bare = webClients();
    try {
      const refused = await buggy.queue.admit(admitRequest(alice, "click")).then(
        () => assert.fail("an admit for another user must be refused"),
        (err: unknown) => err,
      );
      assert.equal(ConnectError.from(refused).code, Code.PermissionDenied);
      assert.equal(reasonOf(refused), "USER_MISMATCH");
      assert.deepEqual(
        { userId: describeError(refused).metadata["userId"], subject: describeError(refused).metadata["assertionSubject"] },
        { userId: alice, subject: mallory },
      );
      assert.equal((await operator.credits.getBalance({ userId: alice })).balance, 1n, "nothing was charged");

      const missing = await bare.queue.listJobs({ userId: alice }).then(
        () => assert.fail("a web call without an assertion must be refused"),
        (err: unknown) => err,
      );
      assert.equal(ConnectError.from(missing).code, Code.Unauthenticated);
      assert.equal(reasonOf(missing), "USER_ASSERTION_INVALID");
      assert.equal(describeError(missing).metadata["problem"], "missing");

      // A token signed by another key is refused as well (the queue holds the public key only).
      const forged = webClients((userId) => mintAssertion(generateKeyPairSync("ed25519").privateKey, userId));
      try {
        const err = await forged.queue.listJobs({ userId: alice }).then(
          () => assert.fail("a forged assertion must be refused"),
          (e: unknown) => e,
        );
        assert.equal(describeError(err).metadata["problem"], "bad_signature");
      } finally {
        forged.close();
      }
    } finally {
      buggy.close();
      bare.close();
    }
  });
});
