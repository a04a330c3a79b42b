// What an on-call operator relies on, in Debian's Chromium against the live `queue-service dev`
// that .ci/console-browser-test starts: keyboard and dialogs (Enter in a filter, Escape, focus,
// a bulk cancel across all users), pages that stay live (job detail, a user's balance), a live
// mark that turns when calls are refused, and a stuck release told as such. Each test has its own
// users, so it runs beside console.test.ts on the same service.
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { createClient } from "@connectrpc/connect";
import { type Browser, type Page } from "playwright-core";

import { CoreCallbackService, RunOutcome } from "@acurio/queue-client/gen/acurio/queue/v1/core_callback_service_pb.js";
import { CreditsService } from "@acurio/queue-client/gen/acurio/queue/v1/credits_service_pb.js";
import { JobStatus } from "@acurio/queue-client/gen/acurio/queue/v1/job_pb.js";
import { AnalysisQueueService } from "@acurio/queue-client/gen/acurio/queue/v1/queue_service_pb.js";
import { CONSOLE_URL, env, grpc, launchChromium, SHOTS, signIn, thesis, until, WAIT_MS } from "./support.js";

const TOKENS = { operator: env("OPERATOR_TOKEN"), web: env("WEB_TOKEN"), core: env("CORE_TOKEN") };

const asWeb = createClient(AnalysisQueueService, grpc(TOKENS.web));
const asOperator = createClient(CreditsService, grpc(TOKENS.operator));
const asCore = createClient(CoreCallbackService, grpc(TOKENS.core));

let browser: Browser;
let page: Page;
const stamp = Date.now().toString(36);
let keyCount = 0;

async function shot(target: Page, name: string): Promise<void> {
  await target.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });
}

/** A page of its own (a fresh context: no token in its session storage unless given). */
async function openPage(token: string): Promise<Page> {
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  const opened = await context.newPage();
  opened.on("pageerror", (error) => console.error(`page error: ${error.message}`));
  if (token !== "") {
    await signIn(opened, token);
  }
  return opened;
}

async function admit(user: string, uri = `s3://theses/${user}.pdf`) {
  keyCount += 1;
  const response = await asWeb.admit(thesis(user, `oncall-${keyCount}`, { uri }));
  return response.job!;
}

/** A fresh load of the console at `path` (nothing left open by an earlier test). */
async function visit(target: Page, path: string): Promise<void> {
  await target.goto("about:blank");
  await target.goto(`${CONSOLE_URL}#/${path}`);
}

const activeInside = (target: Page, selector: string) =>
  target.evaluate((sel) => document.querySelector(sel)?.contains(document.activeElement) ?? false, selector);

before(async () => {
  mkdirSync(SHOTS, { recursive: true });
  browser = await launchChromium();
  page = await openPage(TOKENS.operator);
});

after(async () => {
  await browser?.close();
});

test("Enter in a Jobs filter field applies the filter and opens no dialog", async () => {
  const user = `enter-${stamp}`;
  await asOperator.grantCredits({ userId: user, amount: 1n, idempotencyKey: "grant" });
  await admit(user);
  await visit(page, `jobs`);
  const field = page.getByTestId("jobs").locator('input[name="user"]');
  await field.fill(user);
  await field.press("Enter");
  await page.waitForFunction((u) => window.location.hash.includes(`user=${u}`), user, { timeout: WAIT_MS });
  await page.waitForFunction(() => document.querySelectorAll('[data-testid="job-row"]').length === 1, null, { timeout: WAIT_MS });
  assert.equal(await page.getByRole("alertdialog").count(), 0, "Enter in a filter field must not open the bulk-cancel dialog");
  await shot(page, "oncall-filter-enter");
});

test("Escape closes the bulk-cancel and token dialogs; focus is inside each while it is open and returns after", async () => {
  const user = `escape-${stamp}`;
  await asOperator.grantCredits({ userId: user, amount: 1n, idempotencyKey: "grant" });
  await admit(user);
  await visit(page, `jobs?user=${user}`);
  const opener = page.getByTestId("bulk-cancel");
  await opener.click();
  const dialog = page.getByRole("alertdialog");
  await dialog.waitFor({ timeout: WAIT_MS });
  assert.ok(await activeInside(page, '[role="alertdialog"]'), "focus must move into the bulk-cancel dialog");
  await page.keyboard.press("Tab");
  await page.keyboard.press("Tab");
  await page.keyboard.press("Tab");
  assert.ok(await activeInside(page, '[role="alertdialog"]'), "Tab must stay inside the bulk-cancel dialog");
  await shot(page, "oncall-bulk-cancel-dialog");
  await page.keyboard.press("Escape");
  await dialog.waitFor({ state: "detached", timeout: WAIT_MS });
  assert.equal(await page.evaluate(() => document.activeElement?.getAttribute("data-testid")), "bulk-cancel", "focus returns to the button");

  await page.keyboard.press("t");
  const tokenDialog = page.getByRole("dialog", { name: "Bearer token" });
  await tokenDialog.waitFor({ timeout: WAIT_MS });
  assert.ok(await activeInside(page, '[role="dialog"]'), "focus must move into the token dialog");
  await page.keyboard.press("Escape");
  await tokenDialog.waitFor({ state: "detached", timeout: WAIT_MS });
});

test("a bulk cancel with no user filter says it spans all users and takes more than one keystroke", async () => {
  const user = `everyone-${stamp}`;
  await asOperator.grantCredits({ userId: user, amount: 1n, idempotencyKey: "grant" });
  const job = await admit(user);
  await visit(page, `jobs`);
  await page.getByTestId("bulk-cancel").click();
  const dialog = page.getByRole("alertdialog");
  await dialog.waitFor({ timeout: WAIT_MS });
  assert.match(await dialog.innerText(), /all users/i);
  const confirm = page.getByTestId("bulk-cancel-confirm");
  assert.equal(await confirm.isDisabled(), true, "the confirm button waits for the typed count");
  await page.keyboard.press("Enter");
  await shot(page, "oncall-bulk-cancel-all-users");
  assert.equal(await dialog.count(), 1, "one keystroke neither confirms nor closes it");
  assert.notEqual((await asWeb.getJob({ jobId: job.jobId })).job!.status, JobStatus.CANCELED);
  const count = await page.getByTestId("bulk-cancel-count").getAttribute("data-count");
  await dialog.locator("input").fill(count!);
  assert.equal(await confirm.isDisabled(), false, "typing the count enables the confirm button");
  await page.keyboard.press("Escape"); // not confirmed: other tests' jobs stay
  await dialog.waitFor({ state: "detached", timeout: WAIT_MS });
  assert.notEqual((await asWeb.getJob({ jobId: job.jobId })).job!.status, JobStatus.CANCELED);
});

test("the job detail page is live: a queued job turns running without a reload", async () => {
  const user = `detail-${stamp}`;
  await asOperator.grantCredits({ userId: user, amount: 2n, idempotencyKey: "grant" });
  const first = await admit(user);
  const second = await admit(user);
  const running = await until("the first job runs", async () => (await asWeb.getJob({ jobId: first.jobId })).job!, (j) => j.status === JobStatus.RUNNING);
  await visit(page, `jobs/${second.jobId}`);
  const detail = page.getByTestId("job-detail");
  await detail.locator(".badge.queued").first().waitFor({ timeout: WAIT_MS });
  await page.evaluate(() => ((window as unknown as { marker: string }).marker = "same page"));
  await asCore.completeRun({ runId: running.runId, outcome: RunOutcome.SUCCEEDED });
  await detail.locator("h1 .badge.running").waitFor({ timeout: WAIT_MS });
  assert.equal(await page.evaluate(() => (window as unknown as { marker?: string }).marker), "same page");
  await shot(page, "oncall-job-detail-live");
});

test("the User queue's balance follows admits and grants made elsewhere", async () => {
  const user = `balance-${stamp}`;
  await asOperator.grantCredits({ userId: user, amount: 3n, idempotencyKey: "grant-3" });
  await visit(page, `users/${user}`);
  const balance = page.getByTestId("balance");
  await balance.filter({ hasText: "Balance: 3" }).waitFor({ timeout: WAIT_MS });
  await admit(user);
  await admit(user);
  await balance.filter({ hasText: "Balance: 1" }).waitFor({ timeout: WAIT_MS });
  await asOperator.grantCredits({ userId: user, amount: 10n, idempotencyKey: "grant-10" });
  await balance.filter({ hasText: "Balance: 11" }).waitFor({ timeout: WAIT_MS });
  await shot(page, "oncall-balance-live");
});

test("refused calls turn the live mark off; with no token the page says to press t", async () => {
  const fresh = await openPage("");
  try {
    await visit(fresh, ``);
    const mark = fresh.getByTestId("live-state");
    await fresh.waitForFunction(() => document.querySelector('[data-testid="live-state"]')?.getAttribute("data-state") === "refused", null, {
      timeout: WAIT_MS,
    });
    assert.doesNotMatch(await mark.innerText(), /^live$/);
    await fresh.getByText("press t to set a token").first().waitFor({ timeout: WAIT_MS });
    assert.doesNotMatch(await fresh.locator("main").innerText(), /authorization: Bearer/);
    await shot(fresh, "oncall-no-token");
  } finally {
    await fresh.context().close();
  }
  const web = await openPage(TOKENS.web); // the overview is for operators: PERMISSION_DENIED
  try {
    await visit(web, ``);
    await web.waitForFunction(() => document.querySelector('[data-testid="live-state"]')?.getAttribute("data-state") === "refused", null, {
      timeout: WAIT_MS,
    });
    await web.getByText("PERMISSION_DENIED").first().waitFor({ timeout: WAIT_MS });
    await shot(web, "oncall-web-token-on-overview");
  } finally {
    await web.context().close();
  }
});

test("a refusal without ErrorInfo is named by its gRPC code as the client names it (UNAVAILABLE)", async () => {
  const cut = await openPage(TOKENS.operator);
  try {
    // Something in front of the service answers 503 with no gRPC status: no ErrorInfo reason.
    await cut.route(/\/acurio\.queue\.v1\.\w+\/\w+$/, (route) => route.fulfill({ status: 503, body: "" }));
    await visit(cut, ``);
    await cut.waitForFunction(() => document.querySelector('[data-testid="live-state"]')?.getAttribute("data-state") === "unreachable", null, {
      timeout: WAIT_MS,
    });
    assert.match((await cut.getByTestId("live-state").getAttribute("title")) ?? "", /^UNAVAILABLE: /);
    await shot(cut, "oncall-unavailable-without-reason");
  } finally {
    await cut.context().close();
  }
});

test("the job behind a stuck release says so instead of starting any moment", async () => {
  const user = `stuck-${stamp}`;
  await asOperator.grantCredits({ userId: user, amount: 2n, idempotencyKey: "grant" });
  const stuck = await admit(user, `s3://theses/${user}-fail-release.pdf`); // the dev core fails its releases
  const behind = await admit(user);
  await until("the release failed once", async () => (await asWeb.getJob({ jobId: stuck.jobId })).job!, (j) => j.status === JobStatus.PENDING && j.lastError !== "");
  await visit(page, `users/${user}`);
  const row = page.locator(`[data-testid="queue-row"][data-job-id="${behind.jobId}"]`);
  await row.waitFor({ timeout: WAIT_MS });
  await row.filter({ hasText: "behind a release being retried" }).waitFor({ timeout: WAIT_MS });
  assert.doesNotMatch(await row.innerText(), /starting any moment/);
  await shot(page, "oncall-stuck-release-queue");
});

test("a Release now that fails is told as an error, not as a success", async () => {
  const user = `release-${stamp}`;
  await asOperator.grantCredits({ userId: user, amount: 1n, idempotencyKey: "grant" });
  const stuck = await admit(user, `s3://theses/${user}-fail-release.pdf`);
  await until("the release failed once", async () => (await asWeb.getJob({ jobId: stuck.jobId })).job!, (j) => j.status === JobStatus.PENDING && j.lastError !== "");
  await visit(page, `jobs/${stuck.jobId}`);
  await page.getByRole("button", { name: "Release now" }).click();
  const notice = page.getByTestId("notice");
  await notice.waitFor({ timeout: WAIT_MS });
  assert.match((await notice.getAttribute("class")) ?? "", /\berror\b/, `a failed release is an error: ${await notice.innerText()}`);
  assert.match(await notice.innerText(), /still pending/);
  await shot(page, "oncall-release-now-failed");
});
