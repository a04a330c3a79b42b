// The console in a real browser (Debian's Chromium through playwright-core) against a live
// `queue-service dev`, started by .ci/console-browser-test, which passes its addresses and
// tokens in the environment. Five jobs are admitted over gRPC; the page must show them at
// positions 0-4, move everyone up after a completion without a reload, refund a cancel made in
// the page, show PERMISSION_DENIED when a web-role token tries an operator action, and follow
// an address that changes while the page starts.
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
import { CONSOLE_URL, env, grpc, launchChromium, SHOTS, WAIT_MS } from "./support.js";

const TOKENS = { operator: env("OPERATOR_TOKEN"), web: env("WEB_TOKEN"), core: env("CORE_TOKEN") };

const asWeb = createClient(AnalysisQueueService, grpc(TOKENS.web));
const asOperator = createClient(CreditsService, grpc(TOKENS.operator));
const asCore = createClient(CoreCallbackService, grpc(TOKENS.core));

let browser: Browser;
let page: Page;
const user = `lecturer-${Date.now().toString(36)}`;
const timings: string[] = [];

async function timed<T>(name: string, step: () => Promise<T>): Promise<T> {
  const started = performance.now();
  const result = await step();
  timings.push(`${name}: ${Math.round(performance.now() - started)} ms`);
  return result;
}

async function shot(name: string): Promise<void> {
  await page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });
}

// As a person sets a token: `t`, then a paste where the cursor is (nothing cleared first), Enter.
async function useToken(token: string): Promise<void> {
  await page.keyboard.press("t");
  const input = page.getByRole("dialog", { name: "Bearer token" }).locator("input");
  await input.waitFor({ timeout: WAIT_MS });
  await page.keyboard.insertText(token);
  assert.equal(await input.inputValue(), token, "the field holds the pasted token and nothing else (no `t`, no previous token)");
  await Promise.all([page.waitForEvent("load"), input.press("Enter")]);
  assert.equal(await page.evaluate(() => sessionStorage.getItem("acurio-queue-console-token")), token);
}

const shownPositions = () =>
  page.evaluate(() => [...document.querySelectorAll('[data-testid="queue-row"]')].map((r) => Number(r.getAttribute("data-position"))));

async function waitForPositions(expected: number[]): Promise<void> {
  try {
    await page.waitForFunction(
      (want) =>
        JSON.stringify([...document.querySelectorAll('[data-testid="queue-row"]')].map((r) => Number(r.getAttribute("data-position")))) ===
        JSON.stringify(want),
      expected,
      { timeout: WAIT_MS },
    );
  } catch (error) {
    // Say what the page showed instead: the rows, the stream's problem line, the address.
    await shot(`positions-${expected.join("")}-timeout`).catch(() => undefined);
    const problem = await page.locator(".problem").allInnerTexts().catch(() => []);
    const notice = await page.getByTestId("notice").allInnerTexts().catch(() => []);
    throw new Error(
      `positions ${JSON.stringify(expected)} not shown within ${WAIT_MS} ms at ${page.url()}: rows ${JSON.stringify(await shownPositions())}, ` +
        `problem ${JSON.stringify(problem)}, notice ${JSON.stringify(notice)}`,
      { cause: error },
    );
  }
}

before(async () => {
  mkdirSync(SHOTS, { recursive: true });
  browser = await timed("launch chromium", launchChromium);
  page = await browser.newPage({ viewport: { width: 1280, height: 860 } });
  page.on("pageerror", (error) => console.error(`page error: ${error.message}`));
  page.on("console", (message) => message.type() === "error" && console.error(`page console: ${message.text()}`));
  await timed("open the console", () => page.goto(CONSOLE_URL));
  await useToken(TOKENS.operator);
});

after(async () => {
  await browser?.close();
  console.log(`browser test timings:\n  ${timings.join("\n  ")}`);
  console.log(`screenshots in ${SHOTS}`);
});

test("t opens the token field without typing a t into it, and a pasted token replaces the one set", async () => {
  // The page has the operator's token (before); a paste of the same token must give it once.
  await useToken(TOKENS.operator);
  await shot("token-set-by-paste");
});

test("five admitted jobs appear at positions 0-4 and move up on a completion, without a reload", async () => {
  await asOperator.grantCredits({ userId: user, amount: 5n, idempotencyKey: "browser-test" });
  const jobs = [];
  for (let click = 0; click < 5; click += 1) {
    const response = await asWeb.admit({
      userId: user,
      idempotencyKey: `click-${click}`,
      document: { uri: `s3://theses/${user}.pdf`, title: "A thesis" },
      sources: [{ doi: "10.1234/abc" }],
    });
    jobs.push(response.job!);
  }
  await page.goto(`${CONSOLE_URL}#/users/${user}`);
  await timed("five positions shown", () => waitForPositions([0, 1, 2, 3, 4]));
  await page.evaluate(() => ((window as unknown as { marker: string }).marker = "same page"));
  await shot("user-queue");

  const first = (await asWeb.getJob({ jobId: jobs[0].jobId })).job!;
  assert.notEqual(first.status, JobStatus.QUEUED);
  // The core reports the first run finished: the next job takes the slot, everyone moves up.
  await asCore.completeRun({ runId: first.runId, outcome: RunOutcome.SUCCEEDED });
  await timed("positions moved up live", () => waitForPositions([0, 1, 2, 3]));
  assert.equal(await page.evaluate(() => (window as unknown as { marker?: string }).marker), "same page");
  await shot("user-queue-after-completion");
});

test("cancel in the page cancels the job and refunds its credit", async () => {
  const before = (await asOperator.getBalance({ userId: user })).balance;
  const last = page.locator('[data-testid="queue-row"][data-position="3"]');
  const jobId = await last.getAttribute("data-job-id");
  await timed("cancel from the page", async () => {
    await last.getByTestId("cancel").click();
    // A single cancel asks first.
    await page.getByRole("alertdialog").getByTestId("cancel-job-confirm").click();
    await waitForPositions([0, 1, 2]);
  });
  await page.getByTestId("notice").filter({ hasText: "refunded" }).waitFor({ timeout: WAIT_MS });
  const job = (await asWeb.getJob({ jobId: jobId! })).job!;
  assert.equal(job.status, JobStatus.CANCELED);
  assert.equal(job.refunded, true);
  assert.equal((await asOperator.getBalance({ userId: user })).balance, before + 1n);
  await page.getByTestId("balance").filter({ hasText: `Balance: ${before + 1n}` }).waitFor({ timeout: WAIT_MS });
  await shot("user-queue-after-cancel");
});

test("overview, jobs and job detail pages render the live queue", async () => {
  await page.keyboard.press("1");
  await page.getByTestId("figure-queued").waitFor({ timeout: WAIT_MS });
  await page.waitForFunction(() => Number(document.querySelector('[data-testid="figure-queued"] .value')?.textContent) >= 2, null, {
    timeout: WAIT_MS,
  });
  await shot("overview");

  await page.goto(`${CONSOLE_URL}#/jobs?user=${user}`);
  await page.waitForFunction(() => document.querySelectorAll('[data-testid="job-row"]').length === 5, null, { timeout: WAIT_MS });
  await shot("jobs");

  await page.locator('[data-testid="job-row"] a.mono').last().click();
  await page.getByTestId("job-detail").getByText("Ended succeeded").waitFor({ timeout: WAIT_MS });
  await shot("job-detail");
});

test("an operator action with a web-role token shows PERMISSION_DENIED", async () => {
  await useToken(TOKENS.web);
  await page.goto(`${CONSOLE_URL}#/users/${user}`);
  await waitForPositions([0, 1, 2]); // the web role may watch the queue
  // The ledger is the operator's: its panel says so in place, and the page's notice stays free
  // for what the page itself is asked to do.
  await page.getByTestId("ledger-refused").waitFor({ timeout: WAIT_MS });
  assert.match(await page.getByTestId("ledger-refused").innerText(), /PERMISSION_DENIED/);
  assert.equal(await page.getByTestId("notice").filter({ hasText: "ListLedgerEntries" }).count(), 0);
  await page.getByTestId("promote").click();
  const notice = page.getByTestId("notice");
  await notice.filter({ hasText: "PERMISSION_DENIED" }).waitFor({ timeout: WAIT_MS });
  assert.match(await notice.innerText(), /role web\) may not call \/acurio\.queue\.v1\.AnalysisQueueService\/Promote/);
  await shot("permission-denied");
});

test("an address changed while the console starts is followed, not missed", async () => {
  // The moment the page's script has rendered its first route but before a deferred effect
  // could listen: the hash moves on then, as when a test or a person navigates right after a
  // reload. The console must show the new address's page.
  const fresh = await browser.newPage({ viewport: { width: 1280, height: 860 } });
  try {
    await fresh.addInitScript((target) => {
      document.addEventListener("DOMContentLoaded", () => {
        window.location.hash = target;
      });
    }, `#/users/${user}`);
    await fresh.goto(`${CONSOLE_URL}#/jobs`);
    await fresh.getByTestId("user-queue").waitFor({ timeout: WAIT_MS });
    assert.match(await fresh.locator("h1").innerText(), new RegExp(`Queue of ${user}`));
  } finally {
    await fresh.close();
  }
});
