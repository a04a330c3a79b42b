// The fleet-wide capacity at the core as a user and an operator see it, in Debian's Chromium
// against the live `queue-service dev` that .ci/console-browser-test starts (its dev core judges
// for an hour, so a run holds the capacity until the test ends it). The capacity is set to 1
// through OperatorService and set back to unlimited at the end, so the other files' tests run
// as before.
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { createClient } from "@connectrpc/connect";
import { type Browser, type Page } from "playwright-core";

import { CreditsService } from "@acurio/queue-client/gen/acurio/queue/v1/credits_service_pb.js";
import { JobStatus } from "@acurio/queue-client/gen/acurio/queue/v1/job_pb.js";
import { OperatorService } from "@acurio/queue-client/gen/acurio/queue/v1/operator_service_pb.js";
import { AnalysisQueueService } from "@acurio/queue-client/gen/acurio/queue/v1/queue_service_pb.js";
import { CONSOLE_URL, env, grpc, launchChromium, SHOTS, signIn, thesis, until, WAIT_MS } from "./support.js";

const TOKENS = { operator: env("OPERATOR_TOKEN"), web: env("WEB_TOKEN") };

const asWeb = createClient(AnalysisQueueService, grpc(TOKENS.web));
const asCredits = createClient(CreditsService, grpc(TOKENS.operator));
const asOperator = createClient(OperatorService, grpc(TOKENS.operator));

let browser: Browser;
let page: Page;
const stamp = Date.now().toString(36);
let keyCount = 0;
const admitted: string[] = [];

async function admit(user: string) {
  keyCount += 1;
  const response = await asWeb.admit(thesis(user, `capacity-${keyCount}`));
  admitted.push(response.job!.jobId);
  return response.job!;
}

const ordinal = (n: number) => `${n}${({ 1: "st", 2: "nd", 3: "rd" } as Record<number, string>)[n] ?? "th"}`;
const getJob = async (jobId: string) => (await asWeb.getJob({ jobId })).job!;

before(async () => {
  mkdirSync(SHOTS, { recursive: true });
  browser = await launchChromium();
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  page = await context.newPage();
  page.on("pageerror", (error) => console.error(`page error: ${error.message}`));
  await signIn(page, TOKENS.operator);
});

after(async () => {
  // Unlimited again, and nothing of this file left holding a slot for the tests after it.
  await asOperator.setCoreCapacity({ capacity: 0, unlimited: true });
  for (const jobId of admitted) await asWeb.cancelJob({ jobId }).catch(() => undefined);
  await browser?.close();
});

test("a job that holds its slot but waits for the core shows its place in line; the overview shows the capacity", async () => {
  await asOperator.setCoreCapacity({ capacity: 1 });
  const holder = `cap-holder-${stamp}`;
  const first = `cap-first-${stamp}`;
  const second = `cap-second-${stamp}`;
  for (const user of [holder, first, second]) await asCredits.grantCredits({ userId: user, amount: 1n, idempotencyKey: "grant" });

  // The one unit of capacity is taken (by this holder, or by a run another file left judging).
  await admit(holder);
  await until("the capacity is in use", async () => (await asOperator.getOverview({})).overview!, (o) => o.capacityInUse >= 1n);
  const firstJob = await admit(first);
  const secondJob = await admit(second);
  const [a, b] = await until(
    "both jobs wait for the core",
    async () => [await getJob(firstJob.jobId), await getJob(secondJob.jobId)],
    ([x, y]) => x.capacityPosition > 0 && y.capacityPosition > 0,
  );
  assert.notEqual(a.status, JobStatus.RUNNING);
  assert.ok(a.capacityPosition < b.capacityPosition, `the user who waited longer is ahead: ${a.capacityPosition} vs ${b.capacityPosition}`);

  for (const [user, job] of [[first, a], [second, b]] as const) {
    await page.goto("about:blank");
    await page.goto(`${CONSOLE_URL}#/users/${user}`);
    const row = page.locator(`[data-testid="queue-row"][data-job-id="${job.jobId}"]`);
    await row.waitFor({ timeout: WAIT_MS });
    const told = row.getByTestId("capacity-position");
    // A turn at the fleet's capacity, said as such: not the words of an outage.
    await told.filter({ hasText: `waiting for its turn at the fleet's capacity (the core answers; others' runs go first): ${ordinal(job.capacityPosition)} in line` }).waitFor({ timeout: WAIT_MS });
    assert.doesNotMatch(await row.innerText(), /unreachable/);
    assert.doesNotMatch(await row.innerText(), /running for/);
    await page.screenshot({ path: join(SHOTS, `capacity-waiting-${user === first ? "first" : "second"}.png`), fullPage: true });
  }

  await page.goto("about:blank");
  await page.goto(`${CONSOLE_URL}#/`);
  const figure = page.getByTestId("figure-core-capacity");
  await figure.locator(".value").filter({ hasText: / \/ 1$/ }).waitFor({ timeout: WAIT_MS });
  const overview = (await asOperator.getOverview({})).overview!;
  assert.ok(overview.capacityWaitingUsers >= 2n, `two users at least wait: ${overview.capacityWaitingUsers}`);
  await figure.locator(".value").filter({ hasText: `${overview.capacityInUse} / 1` }).waitFor({ timeout: WAIT_MS });
  await figure.locator(".hint").filter({ hasText: new RegExp(`^${overview.capacityWaitingUsers} users waiting for a turn, longest turn wait \\d`) }).waitFor({ timeout: WAIT_MS });
  await page.screenshot({ path: join(SHOTS, "capacity-overview.png"), fullPage: true });
});
