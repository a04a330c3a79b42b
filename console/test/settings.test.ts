// The Settings & audit page in Debian's Chromium against the live `queue-service dev` that
// .ci/console-browser-test starts: an operator pauses the fleet's releases and one user's behind a
// confirmation (the Overview and the User queue show it; an admit meanwhile is accepted and held;
// a resume releases it), sets and removes the core's capacity, reads the changes with their
// actors on the audit timeline, and filters the ledger by actor. Everything is resumed and unlimited again at the end.
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
import { CONSOLE_URL, env, grpc, holdAnswers, launchChromium, SHOTS, signIn, thesis, until, WAIT_MS } from "./support.js";

const TOKENS = { operator: env("OPERATOR_TOKEN"), web: env("WEB_TOKEN") };
const OPERATOR_ACTOR = "operator:operator-console-test";

const asWeb = createClient(AnalysisQueueService, grpc(TOKENS.web));
const asCredits = createClient(CreditsService, grpc(TOKENS.operator));
const asOperator = createClient(OperatorService, grpc(TOKENS.operator));

let browser: Browser;
let page: Page;
const stamp = Date.now().toString(36);
const admitted: string[] = [];

async function admit(user: string) {
  await asCredits.grantCredits({ userId: user, amount: 3n, idempotencyKey: `settings-grant-${user}` });
  const response = await asWeb.admit(thesis(user, `settings-${user}`));
  admitted.push(response.job!.jobId);
  return response.job!;
}

const getJob = async (jobId: string) => (await asWeb.getJob({ jobId })).job!;

async function confirmIn(testId: string, note = "") {
  await page.getByTestId(testId).click();
  const dialog = page.getByRole("alertdialog");
  await dialog.waitFor({ timeout: WAIT_MS });
  if (note) await dialog.getByTestId("pause-note").fill(note);
  await dialog.getByTestId(`${testId}-confirm`).click();
  await dialog.waitFor({ state: "detached", timeout: WAIT_MS });
}

before(async () => {
  mkdirSync(SHOTS, { recursive: true });
  browser = await launchChromium();
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  page = await context.newPage();
  page.on("pageerror", (error) => console.error(`page error: ${error.message}`));
  await signIn(page, TOKENS.operator);
});

after(async () => {
  await asOperator.setReleasesPaused({ paused: false });
  await asOperator.setCoreCapacity({ capacity: 0, unlimited: true });
  for (const jobId of admitted) await asWeb.cancelJob({ jobId }).catch(() => undefined);
  await browser?.close();
});

test("a fleet-wide pause is confirmed, shown on the Overview, holds an admit, and a resume releases it", async () => {
  await page.goto(`${CONSOLE_URL}#/settings`);
  await page.getByTestId("settings-page").waitFor({ timeout: WAIT_MS });
  await confirmIn("pause-fleet", `console check ${stamp}`);
  await page.getByTestId("fleet-pause-state").filter({ hasText: "Paused fleet-wide" }).waitFor({ timeout: WAIT_MS });
  // The change on the audit timeline, with its actor and note.
  const row = page.getByTestId("audit-event").and(page.locator('[data-kind="pause"]')).filter({ hasText: `console check ${stamp}` });
  await row.waitFor({ timeout: WAIT_MS });
  assert.equal((await row.getByTestId("audit-event-actor").locator("a").first().innerText()).trim(), OPERATOR_ACTOR);
  assert.match(await row.innerText(), /releases paused[\s\S]*released → paused/);
  await page.screenshot({ path: join(SHOTS, "settings-paused.png"), fullPage: true });

  const user = `settings-fleet-${stamp}`;
  const job = await admit(user);
  assert.equal(job.status, JobStatus.PENDING);
  await new Promise((resolve) => setTimeout(resolve, 500));
  assert.equal((await getJob(job.jobId)).status, JobStatus.PENDING, "held while paused");

  await page.goto(`${CONSOLE_URL}#/`);
  const banner = page.getByTestId("releases-paused");
  await banner.filter({ hasText: `console check ${stamp}` }).waitFor({ timeout: WAIT_MS });
  assert.match(await banner.innerText(), /Releases are paused fleet-wide/);
  await page.screenshot({ path: join(SHOTS, "overview-paused.png"), fullPage: true });

  await page.goto(`${CONSOLE_URL}#/users/${encodeURIComponent(user)}`);
  await page.getByTestId("user-paused").filter({ hasText: "releases paused fleet-wide" }).waitFor({ timeout: WAIT_MS });
  // Her held job promises no start (the service sends no estimate while it is paused).
  await page.getByTestId("no-start-paused").filter({ hasText: "while releases are paused fleet-wide" }).waitFor({ timeout: WAIT_MS });

  await page.goto(`${CONSOLE_URL}#/settings`);
  await confirmIn("resume-fleet");
  await page.getByTestId("fleet-pause-state").filter({ hasText: "no fleet-wide pause" }).waitFor({ timeout: WAIT_MS });
  await until("the held job released", () => getJob(job.jobId), (j) => j.status === JobStatus.RUNNING);
  await page.goto(`${CONSOLE_URL}#/`);
  await page.getByTestId("overview").waitFor({ timeout: WAIT_MS });
  await page.getByTestId("releases-paused").waitFor({ state: "detached", timeout: WAIT_MS });
});

test("one user's pause and her limit show on her queue; a resume releases her job", async () => {
  const user = `settings-user-${stamp}`;
  await page.goto(`${CONSOLE_URL}#/settings`);
  await page.getByTestId("settings-page").waitFor({ timeout: WAIT_MS });
  await page.locator('input[name="pause-user"]').fill(user);
  await page.getByTestId("user-pause-state").filter({ hasText: "not paused" }).waitFor({ timeout: WAIT_MS });
  await confirmIn("pause-user", "review");
  await page.getByTestId("user-pause-state").filter({ hasText: /^paused$/ }).waitFor({ timeout: WAIT_MS });
  const job = await admit(user);

  await page.goto(`${CONSOLE_URL}#/users/${encodeURIComponent(user)}`);
  const paused = page.getByTestId("user-paused");
  await paused.filter({ hasText: "releases paused since" }).waitFor({ timeout: WAIT_MS });
  assert.match(await paused.innerText(), new RegExp(`${OPERATOR_ACTOR}[\\s\\S]*review`));
  assert.match(await page.getByTestId("user-limit").innerText(), /At most 1 active at once \(the service's default\)/);
  const held = await getJob(job.jobId);
  assert.equal(held.status, JobStatus.PENDING);
  assert.equal(held.estimatedStartTime, undefined, "a paused job is sent an estimated start");
  await page.getByTestId("no-start-paused").filter({ hasText: "while her releases are paused" }).waitFor({ timeout: WAIT_MS });
  await page.screenshot({ path: join(SHOTS, "user-queue-paused.png"), fullPage: true });

  await page.goto(`${CONSOLE_URL}#/settings`);
  await page.locator('input[name="pause-user"]').fill(user);
  await page.getByTestId("user-pause-state").filter({ hasText: /^paused$/ }).waitFor({ timeout: WAIT_MS });
  await confirmIn("resume-user");
  await until("her job released", () => getJob(job.jobId), (j) => j.status === JobStatus.RUNNING);
});

test("the capacity is set and removed behind a confirmation, and the ledger filters by actor", async () => {
  await page.goto(`${CONSOLE_URL}#/settings`);
  await page.getByTestId("settings-page").waitFor({ timeout: WAIT_MS });
  await page.locator('input[name="capacity"]').fill("7");
  await confirmIn("capacity-set");
  await page.getByTestId("capacity-now").filter({ hasText: "7 runs at once" }).waitFor({ timeout: WAIT_MS });
  await confirmIn("capacity-unlimited");
  await page.getByTestId("capacity-now").filter({ hasText: "unlimited" }).waitFor({ timeout: WAIT_MS });
  const capacityRows = page.getByTestId("audit-event").and(page.locator('[data-kind="capacity"]'));
  await capacityRows.first().filter({ hasText: "7 → unlimited" }).waitFor({ timeout: WAIT_MS });

  // The actor of a change leads to the ledger entries of the same actor (the grants above).
  await capacityRows.first().getByTestId("audit-event-actor").getByRole("link", { name: "ledger" }).click();
  await page.getByTestId("ledger-page").waitFor({ timeout: WAIT_MS });
  assert.equal(await page.locator('input[name="actor"]').inputValue(), OPERATOR_ACTOR);
  await page.getByTestId("ledger-row").first().waitFor({ timeout: WAIT_MS });
  const actors = await page.getByTestId("ledger-actor").allInnerTexts();
  assert.ok(actors.length > 0 && actors.every((a) => a.trim() === OPERATOR_ACTOR), actors.join(", "));
  // Another actor typed in: only theirs (the web backend's charges). The new filter's answer is
  // held back a while: until it comes, the page says it is loading and shows none of the previous
  // filter's rows under the new one.
  const ledgerReads = await holdAnswers(page, "OperatorService/ListLedgerEntries");
  await page.locator('input[name="actor"]').fill("web:web-console-test");
  await page.locator('input[name="actor"]').press("Enter");
  await page.getByTestId("ledger-page").getByText("Loading…").waitFor({ timeout: WAIT_MS });
  assert.equal(await page.getByTestId("ledger-row").count(), 0, "the previous filter's rows are shown under the new filter");
  ledgerReads.release();
  // (An operator's retry is a charge too: wait for the web backend's own row, then check that
  // no row of the previous filter is left under the new one.)
  await page.getByTestId("ledger-row").and(page.locator('[data-kind="charge"]')).filter({ hasText: "web:web-console-test" }).first().waitFor({ timeout: WAIT_MS });
  await ledgerReads.done();
  const webActors = await page.getByTestId("ledger-actor").allInnerTexts();
  assert.ok(webActors.every((a) => a.trim() === "web:web-console-test"), webActors.join(", "));
  await page.screenshot({ path: join(SHOTS, "ledger-by-actor.png"), fullPage: true });
});
