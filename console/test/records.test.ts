// What a job is and what it cost, in Debian's Chromium against the live `queue-service dev` that
// .ci/console-browser-test starts: the job's document and sources (detail, optional column), a
// Retry of a failed job (a new admit, charged, the operator its actor), the ledger per job and per
// user with a grant's note, and a bulk cancel of exactly the ticked rows. Each test has its own
// users, so it runs beside the other files' tests on the same service.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { createClient } from "@connectrpc/connect";
import { type Browser, type Locator, type Page } from "playwright-core";

import { CoreCallbackService, RunOutcome } from "@acurio/queue-client/gen/acurio/queue/v1/core_callback_service_pb.js";
import { CreditsService } from "@acurio/queue-client/gen/acurio/queue/v1/credits_service_pb.js";
import { JobStatus } from "@acurio/queue-client/gen/acurio/queue/v1/job_pb.js";
import { LedgerEntryKind, OperatorService } from "@acurio/queue-client/gen/acurio/queue/v1/operator_service_pb.js";
import { AnalysisQueueService } from "@acurio/queue-client/gen/acurio/queue/v1/queue_service_pb.js";
import { CONSOLE_URL, env, grpc, launchChromium, SHOTS, signIn, sql, thesis, until, WAIT_MS } from "./support.js";

const TOKENS = { operator: env("OPERATOR_TOKEN"), web: env("WEB_TOKEN"), core: env("CORE_TOKEN") };

const asWeb = createClient(AnalysisQueueService, grpc(TOKENS.web));
const asOperator = createClient(CreditsService, grpc(TOKENS.operator));
const asOperatorConsole = createClient(OperatorService, grpc(TOKENS.operator));
const asCore = createClient(CoreCallbackService, grpc(TOKENS.core));

let browser: Browser;
let page: Page;
const stamp = Date.now().toString(36);
let keyCount = 0;

async function shot(target: Page, name: string): Promise<void> {
  await target.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });
}

const SOURCES = Array.from({ length: 12 }, (_, i) => ({ doi: `10.1234/src-${i}`, citation: `Author ${i}, A study of queues (${2000 + i})` }));

async function admit(user: string, title = "Fair queues for citation checks") {
  keyCount += 1;
  const response = await asWeb.admit(thesis(user, `records-${keyCount}`, { title, sources: SOURCES }));
  return response.job!;
}

async function visit(target: Page, path: string): Promise<void> {
  await target.goto("about:blank");
  await target.goto(`${CONSOLE_URL}#/${path}`);
}

before(async () => {
  mkdirSync(SHOTS, { recursive: true });
  browser = await launchChromium();
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  page = await context.newPage();
  page.on("pageerror", (error) => console.error(`page error: ${error.message}`));
  await signIn(page, TOKENS.operator);
});

after(async () => {
  await browser?.close();
});

test("the job detail shows the document and its sources; the Jobs table shows them as a column on request", async () => {
  const user = `doc-${stamp}`;
  await asOperator.grantCredits({ userId: user, amount: 1n, idempotencyKey: "grant" });
  const job = await admit(user);
  await visit(page, `jobs/${job.jobId}`);
  const detail = page.getByTestId("job-detail");
  await detail.getByTestId("job-document").filter({ hasText: "Fair queues for citation checks" }).waitFor({ timeout: WAIT_MS });
  assert.match(await detail.getByTestId("job-document").innerText(), new RegExp(`s3://theses/${user}\\.pdf`));
  const sources = detail.getByTestId("job-sources").locator("li");
  assert.equal(await sources.count(), 10, "the first 10 sources are shown");
  assert.match(await sources.first().innerText(), /10\.1234\/src-0 · Author 0, A study of queues/);
  assert.match(await detail.getByTestId("more-sources").innerText(), /and 2 more/);
  await shot(page, "records-job-detail-document");

  await visit(page, `jobs?user=${user}`);
  await page.locator('[data-testid="job-row"]').first().waitFor({ timeout: WAIT_MS });
  assert.equal(await page.getByTestId("document-header").count(), 0, "the document column is off by default");
  await page.getByTestId("column-document").check();
  const cell = page.getByTestId("document-cell").first();
  await cell.filter({ hasText: "Fair queues for citation checks" }).waitFor({ timeout: WAIT_MS });
  assert.match(await cell.innerText(), /12 sources/);
  await shot(page, "records-jobs-document-column");
  // The choice is kept for the browser: a fresh load shows the column again.
  await visit(page, `jobs?user=${user}`);
  await page.getByTestId("document-cell").first().waitFor({ timeout: WAIT_MS });
  await page.getByTestId("column-document").uncheck();
});

test("Retry on a failed job admits it again as its user, charged, with the operator as the actor", async () => {
  const user = `retry-${stamp}`;
  await asOperator.grantCredits({ userId: user, amount: 2n, idempotencyKey: "grant" });
  const job = await admit(user);
  const running = await until("the job runs", async () => (await asWeb.getJob({ jobId: job.jobId })).job!, (j) => j.status === JobStatus.RUNNING);
  await asCore.completeRun({ runId: running.runId, outcome: RunOutcome.FAILED, message: "the provider timed out" });
  await visit(page, `jobs/${job.jobId}`);
  const detail = page.getByTestId("job-detail");
  await detail.locator("h1 .badge.failed").waitFor({ timeout: WAIT_MS });
  // The first Retry charges too: it asks first, and a click alone charges nothing.
  await detail.getByTestId("retry-job").click();
  const question = page.getByRole("alertdialog", { name: "Confirm the retry" });
  await question.getByTestId("retry-question").filter({ hasText: "is charged its price (1 credit) again" }).waitFor({ timeout: WAIT_MS });
  await shot(page, "records-retry-confirm");
  assert.equal((await asOperator.getBalance({ userId: user })).balance, 1n, "the Retry button alone charged");
  await question.getByTestId("retry-job-confirm").click();
  const retried = detail.getByTestId("retried-as");
  await retried.waitFor({ timeout: WAIT_MS });
  const link = await retried.locator("a").getAttribute("href");
  const newJobId = link!.replace("#/jobs/", "");
  assert.notEqual(newJobId, job.jobId);
  assert.match(await page.getByTestId("notice").innerText(), /Retried as job .* charged 1 to/);
  await shot(page, "records-retry-done");

  const again = (await asWeb.getJob({ jobId: newJobId })).job!;
  assert.equal(again.userId, user);
  assert.equal(again.document?.title, "Fair queues for citation checks");
  assert.equal(again.sourceCount, 12);
  assert.equal((await asOperator.getBalance({ userId: user })).balance, 0n, "charged as an admit is (1 for the failed job, 1 for the retry)");

  // The new job's ledger: its charge, by the operator who clicked.
  await retried.locator("a").click();
  await page.waitForFunction((id) => window.location.hash === `#/jobs/${id}`, newJobId, { timeout: WAIT_MS });
  const row = page.locator('[data-testid="ledger-row"][data-kind="charge"]');
  await row.waitFor({ timeout: WAIT_MS });
  assert.match(await row.getByTestId("ledger-actor").innerText(), /^operator:/);
  // An operator's charge is a retry's (operators never admit), and reads as one.
  assert.equal(await row.getByTestId("ledger-reason").innerText(), "retry");
  await shot(page, "records-retried-job-ledger");
});

async function failedJob(user: string) {
  const job = await admit(user);
  const running = await until("the job runs", async () => (await asWeb.getJob({ jobId: job.jobId })).job!, (j) => j.status === JobStatus.RUNNING);
  await asCore.completeRun({ runId: running.runId, outcome: RunOutcome.FAILED, message: "the provider timed out" });
  return job;
}

const charges = async (user: string) =>
  (await asOperatorConsole.listLedgerEntries({ userId: user, pageSize: 100 })).entries.filter((e) => e.kind === LedgerEntryKind.CHARGE).length;

test("a double-clicked Retry charges once, a stale page's Retry says it was retried, the lineage shows both ways after a reload, and Retry again asks first", async () => {
  const user = `retry-once-${stamp}`;
  await asOperator.grantCredits({ userId: user, amount: 4n, idempotencyKey: "grant" });
  const job = await failedJob(user);
  // A second console (a colleague, or a tab left open) shows the same failed job with its Retry.
  const stale = await page.context().newPage();
  await signIn(stale, TOKENS.operator);
  await visit(stale, `jobs/${job.jobId}`);
  await stale.getByTestId("retry-job").waitFor({ timeout: WAIT_MS });

  await visit(page, `jobs/${job.jobId}`);
  const detail = page.getByTestId("job-detail");
  await detail.locator("h1 .badge.failed").waitFor({ timeout: WAIT_MS });
  await detail.getByTestId("retry-job").click();
  await page.getByRole("alertdialog", { name: "Confirm the retry" }).getByTestId("retry-job-confirm").dblclick();
  const retriedAs = detail.getByTestId("retried-as");
  await retriedAs.locator("a").waitFor({ timeout: WAIT_MS });
  assert.equal(await retriedAs.locator("a").count(), 1);
  const newJobId = (await retriedAs.locator("a").getAttribute("href"))!.replace("#/jobs/", "");
  assert.equal(await detail.getByTestId("retry-job").count(), 0, "Retry is gone once the job was retried");
  await detail.getByTestId("retry-again").waitFor({ timeout: WAIT_MS });

  // The stale page's click 1.5 s later: the service answers the same retry, nothing charged.
  await stale.waitForTimeout(1500);
  await stale.getByTestId("retry-job").click();
  await stale.getByRole("alertdialog", { name: "Confirm the retry" }).getByTestId("retry-job-confirm").click();
  await stale.getByTestId("notice").filter({ hasText: "Already retried as job" }).waitFor({ timeout: WAIT_MS });
  await stale.getByTestId("retried-as").locator(`a[href="#/jobs/${newJobId}"]`).waitFor({ timeout: WAIT_MS });
  await stale.close();
  assert.equal((await asOperator.getBalance({ userId: user })).balance, 2n, "one charge for the job, one for its single retry");
  assert.equal(await charges(user), 2);

  // Reloaded: the lineage is read back, both ways.
  await visit(page, `jobs/${job.jobId}`);
  await detail.getByTestId("retried-as").locator(`a[href="#/jobs/${newJobId}"]`).waitFor({ timeout: WAIT_MS });
  await shot(page, "records-retried-lineage");
  await visit(page, `jobs/${newJobId}`);
  await detail.getByTestId("retry-of").locator(`a[href="#/jobs/${job.jobId}"]`).waitFor({ timeout: WAIT_MS });

  // Another retry only after a confirmation; a double click of its confirm is still one retry.
  await visit(page, `jobs/${job.jobId}`);
  await detail.getByTestId("retry-again").click();
  const dialog = page.getByRole("alertdialog");
  await dialog.getByTestId("retry-again-question").waitFor({ timeout: WAIT_MS });
  await shot(page, "records-retry-again-dialog");
  await dialog.getByTestId("retry-again-confirm").dblclick();
  await detail.getByTestId("retried-as").locator("a").nth(1).waitFor({ timeout: WAIT_MS });
  assert.equal((await asOperator.getBalance({ userId: user })).balance, 1n);
  assert.equal(await charges(user), 3);
});

test("a single cancel asks first; an operator's cancel is shown as the operator's, a user's as the user's, and neither as an error", async () => {
  const user = `cancel-by-${stamp}`;
  await asOperator.grantCredits({ userId: user, amount: 3n, idempotencyKey: "grant" });
  const running = await admit(user);
  const byUser = await admit(user);
  await asWeb.cancelJob({ jobId: byUser.jobId, userId: user });
  await until("the job runs", async () => (await asWeb.getJob({ jobId: running.jobId })).job!, (j) => j.status === JobStatus.RUNNING);

  await visit(page, `jobs/${running.jobId}`);
  const detail = page.getByTestId("job-detail");
  await detail.getByTestId("cancel-job").click();
  const dialog = page.getByRole("alertdialog");
  await dialog.getByTestId("cancel-job-question").waitFor({ timeout: WAIT_MS });
  await shot(page, "records-cancel-one-dialog");
  await page.keyboard.press("Escape");
  await dialog.waitFor({ state: "detached", timeout: WAIT_MS });
  assert.equal((await asWeb.getJob({ jobId: running.jobId })).job!.status, JobStatus.RUNNING, "Escape keeps the job");
  await detail.getByTestId("cancel-job").click();
  await dialog.getByTestId("cancel-job-confirm").click();
  const canceledBy = detail.getByTestId("canceled-by");
  await canceledBy.waitFor({ timeout: WAIT_MS });
  assert.match(await canceledBy.innerText(), /^operator operator-console-test$/);
  assert.equal(await detail.locator(".step.bad").count(), 0, "a cancel is not drawn as a failure");
  assert.match(await detail.locator(".step.ended").innerText(), /canceled by operator operator-console-test/);
  const job = (await asWeb.getJob({ jobId: running.jobId })).job!;
  assert.equal(job.canceledBy, "operator:operator-console-test");
  await shot(page, "records-canceled-by-operator");

  await visit(page, `jobs?user=${user}`);
  const rowOf = (jobId: string) => page.locator(`[data-testid="job-row"][data-job-id="${jobId}"]`);
  await rowOf(running.jobId).getByTestId("canceled-text").filter({ hasText: "canceled by operator operator-console-test" }).waitFor({ timeout: WAIT_MS });
  assert.match(await rowOf(byUser.jobId).getByTestId("canceled-text").innerText(), /^canceled by the user \(web:web-console-test\)$/);
  assert.equal(await rowOf(running.jobId).locator("td.error-text").count(), 0, "a cancel is not shown as an error");
  await shot(page, "records-canceled-by-in-table");
});

test("ticked failed jobs are retried once each, skipping those retried already, and so are a filter's", async () => {
  const user = `retry-many-${stamp}`;
  await asOperator.grantCredits({ userId: user, amount: 6n, idempotencyKey: "grant" });
  const jobs = [await failedJob(user), await failedJob(user), await failedJob(user)];
  await asOperatorConsole.retryJob({ jobId: jobs[0].jobId });
  await until("the first retry runs", async () => (await asWeb.getJob({ jobId: jobs[0].jobId })).job!.retriedAsJobIds, (ids) => ids.length === 1);
  const retriedFirst = (await asWeb.getJob({ jobId: jobs[0].jobId })).job!.retriedAsJobIds[0];
  await until("the retry runs", async () => (await asWeb.getJob({ jobId: retriedFirst })).job!, (j) => j.status === JobStatus.RUNNING);
  await asCore.completeRun({ runId: (await asWeb.getJob({ jobId: retriedFirst })).job!.runId, outcome: RunOutcome.SUCCEEDED });
  const before = await charges(user);

  await visit(page, `jobs?user=${user}&status=failed`);
  const rowOf = (jobId: string) => page.locator(`[data-testid="job-row"][data-job-id="${jobId}"]`);
  await rowOf(jobs[2].jobId).waitFor({ timeout: WAIT_MS });
  await rowOf(jobs[0].jobId).getByTestId("select-job").check();
  await rowOf(jobs[1].jobId).getByTestId("select-job").check();
  const button = page.getByTestId("retry-selected");
  assert.equal(await button.innerText(), "Retry selected (2)");
  await button.click();
  const dialog = page.getByRole("alertdialog");
  const count = dialog.getByTestId("retry-selected-count");
  await count.waitFor({ timeout: WAIT_MS });
  assert.equal(await count.getAttribute("data-count"), "1");
  assert.equal(await count.getAttribute("data-skipped"), "1");
  await shot(page, "records-retry-selected-dialog");
  await dialog.getByTestId("retry-selected-confirm").dblclick();
  await page.getByTestId("notice").filter({ hasText: "Retried 1 job" }).waitFor({ timeout: WAIT_MS });
  assert.equal(await charges(user), before + 1);

  // By filter: the one failed job left; the two retried are counted and skipped.
  await page.getByTestId("bulk-retry").click();
  const bulk = page.getByRole("alertdialog");
  await bulk.getByTestId("bulk-retry-count").waitFor({ timeout: WAIT_MS });
  assert.equal(await bulk.getByTestId("bulk-retry-count").getAttribute("data-count"), "1");
  assert.equal(await bulk.getByTestId("bulk-retry-skipped").getAttribute("data-count"), "2");
  await shot(page, "records-bulk-retry-dialog");
  await bulk.getByTestId("bulk-retry-confirm").click();
  await bulk.waitFor({ state: "detached", timeout: WAIT_MS });
  await page.getByTestId("notice").filter({ hasText: "Retried 1 job" }).waitFor({ timeout: WAIT_MS });
  await until("the filter's job is retried", () => charges(user), (n) => n >= before + 2);
  assert.equal(await charges(user), before + 2);
  for (const job of jobs) assert.equal((await asWeb.getJob({ jobId: job.jobId })).job!.retriedAsJobIds.length, 1, "each job retried once");
});

test("the User queue's ledger lists every movement with its actor and reason, and a grant keeps its note", async () => {
  const user = `ledger-${stamp}`;
  await asOperator.grantCredits({ userId: user, amount: 2n, idempotencyKey: "grant" });
  const job = await admit(user);
  await asWeb.cancelJob({ jobId: job.jobId, userId: user });
  await visit(page, `users/${user}`);
  const ledger = page.getByTestId("ledger");
  await ledger.locator('[data-kind="refund"]').waitFor({ timeout: WAIT_MS });
  assert.deepEqual(
    await ledger.locator('[data-testid="ledger-row"]').evaluateAll((rows) => rows.map((r) => r.getAttribute("data-kind"))),
    ["refund", "charge", "grant"],
  );
  assert.equal(await ledger.locator('[data-kind="refund"] [data-testid="ledger-reason"]').innerText(), "cancel");

  await page.getByLabel("Credits to grant").fill("4");
  await page.getByTestId("grant-note").fill("goodwill after the outage");
  // Money moves only after a confirmation naming the amount, the user and the reason.
  await page.getByLabel("Credits to grant").press("Enter");
  const grantDialog = page.getByRole("alertdialog", { name: "Confirm the grant" });
  await grantDialog.getByTestId("grant-question").filter({ hasText: "Grant 4 credits to" }).waitFor({ timeout: WAIT_MS });
  assert.match(await grantDialog.innerText(), /goodwill after the outage/);
  assert.equal((await asOperator.getBalance({ userId: user })).balance, 2n, "Enter in the amount granted without a confirmation");
  await shot(page, "records-grant-confirm");
  await grantDialog.getByTestId("grant-confirm").click();
  await page.getByTestId("balance").filter({ hasText: "Balance: 6" }).waitFor({ timeout: WAIT_MS });
  const note = ledger.locator('[data-testid="ledger-row"]').first().getByTestId("ledger-note");
  await note.waitFor({ timeout: WAIT_MS });
  assert.match(await note.innerText(), /goodwill after the outage/);
  const entries = (await asOperatorConsole.listLedgerEntries({ userId: user })).entries;
  assert.equal(entries[0].note, "goodwill after the outage");
  assert.match(entries[0].actor, /^operator:/);
  await shot(page, "records-user-ledger-with-note");

  await visit(page, `ledger?user=${user}`);
  await page.getByTestId("ledger-page").locator('[data-testid="ledger-row"]').nth(3).waitFor({ timeout: WAIT_MS });
  await shot(page, "records-ledger-page");
});

test("text a caller chose is shown isolated, with its bidirectional control characters written out", async () => {
  const user = `bidi-${stamp}`;
  await asOperator.grantCredits({ userId: user, amount: 1n, idempotencyKey: "grant" });
  const job = await admit(user);
  const running = await until("the job runs", async () => (await asWeb.getJob({ jobId: job.jobId })).job!, (j) => j.status === JobStatus.RUNNING);
  // The core's words are kept as they came (the service refuses such characters in what users
  // send); unisolated, U+202E would show "gpj.exe" as "exe.jpg" and reverse the rest of the row.
  await asCore.completeRun({ runId: running.runId, outcome: RunOutcome.FAILED, message: "could not read \u202Egpj.exe" });
  await visit(page, `jobs?user=${user}`);
  const row = page.locator(`[data-testid="job-row"][data-job-id="${job.jobId}"]`);
  const error = row.locator("td.error-text bdi");
  await error.filter({ hasText: "\\u{202E}" }).waitFor({ timeout: WAIT_MS });
  assert.equal(await error.innerText(), "could not read \\u{202E}gpj.exe");
  assert.equal(await row.locator("a bdi").filter({ hasText: user }).count(), 1, "the user id is isolated too");
  assert.ok(!(await row.innerText()).includes("\u202E"), "no bidirectional control reaches the page");
  await shot(page, "records-bidi-isolated");

  await visit(page, `jobs/${job.jobId}`);
  const sources = page.getByTestId("job-sources");
  await sources.locator("li").first().waitFor({ timeout: WAIT_MS });
  assert.equal(await sources.locator("li").first().locator("bdi").count(), 2, "a source's DOI and citation are isolated");
  assert.equal(await page.getByTestId("job-document").locator("bdi").count(), 2, "the document's title and uri are isolated");
});

// Every character the service refuses now as invisible (validation.py, `invisible_character`),
// one of each kind: format characters (U+00AD, U+2060, U+FEFF, U+200B-U+200D, U+180E, a tag
// character), a C1 control, the line and paragraph separators, a Hangul filler.
const RAW_INVISIBLE = /[\p{Cf}\u0080-\u009F\u2028\u2029\u115F\u1160\u3164\uFFA0]/u;
const writtenOut = (scope: Locator) => scope.locator(".invisible-char").allInnerTexts();

test("text stored before the service refused invisible characters shows each of them written out", async () => {
  // Rows as they could be stored before: a job inserted straight into the database (no call
  // accepts such text any more), and a grant whose actor and note are rewritten to hold some.
  const user = `invisible-${stamp}`;
  const storedUser = `stored\u200B-${stamp}`;
  const word = `hidden${stamp}`;
  const jobId = randomUUID();
  const doi = `10.5555/${stamp}.hid\u200Cden`;
  sql(
    `INSERT INTO analysis_jobs (job_id, user_id, run_id, idempotency_key, request_digest, status, queue_seq, price, last_error,
                                end_time, document_uri, document_title, sources, source_count, sources_preview)
     VALUES (%(job)s, %(user)s, gen_random_uuid(), 'stored-before', '\\x00'::bytea, 'failed', nextval('analysis_jobs_queue_seq'), 1,
             %(error)s, clock_timestamp(), %(uri)s, %(title)s, %(sources)s::jsonb, 1, %(sources)s::jsonb)`,
    {
      job: jobId,
      user: storedUser,
      error: "could not read\u0085the file\u2028twice",
      uri: `s3://theses/${stamp}\uFEFF.pdf`,
      title: `Fair\u00ADqueues ${word} for\u2060citation checks`,
      sources: JSON.stringify([{ doi, citation: "Author\u3164A, Queues (2001)\u{E0041}" }]),
    },
  );
  await asOperator.grantCredits({ userId: user, amount: 1n, idempotencyKey: "grant", note: "goodwill" });
  sql("UPDATE credit_ledger SET actor = %(actor)s, note = %(note)s WHERE user_id = %(user)s AND kind = 'grant'", {
    user,
    actor: "operator:ops\u200D",
    note: "goodwill\u180E after\u2029the outage",
  });

  // The job's detail: the document's title and uri, the source's DOI and citation, the error.
  await visit(page, `jobs/${jobId}`);
  const detail = page.getByTestId("job-detail");
  const documentPart = detail.getByTestId("job-document");
  await documentPart.filter({ hasText: word }).waitFor({ timeout: WAIT_MS });
  assert.deepEqual(await writtenOut(documentPart), ["\\u{00AD}", "\\u{2060}", "\\u{FEFF}"]);
  assert.equal(await documentPart.locator("bdi").first().innerText(), `Fair\\u{00AD}queues ${word} for\\u{2060}citation checks`);
  const source = detail.getByTestId("job-sources").locator("li").first();
  assert.deepEqual(await writtenOut(source), ["\\u{200C}", "\\u{3164}", "\\u{E0041}"]);
  assert.deepEqual(await writtenOut(detail.locator(".step-detail")), ["\\u{0085}", "\\u{2028}"]);
  assert.doesNotMatch(await detail.innerText(), RAW_INVISIBLE, "an invisible character reaches the job's detail as it is");
  await shot(page, "records-invisible-written-out");

  // The DOI as it reads (as an operator types it; a search holding the character is refused)
  // finds the job: its search key is kept without the character. Then a search by a title word.
  await visit(page, "jobs");
  const rowsAre = (want: string) =>
    page.waitForFunction(
      (ids) => [...document.querySelectorAll<HTMLElement>('[data-testid="job-row"]')].map((row) => row.dataset.jobId).join(",") === ids,
      want,
      { timeout: WAIT_MS },
    );
  await page.getByTestId("job-search").fill(`https://doi.org/10.5555/${stamp}.hidden`);
  await page.getByTestId("job-search").press("Enter");
  await rowsAre(jobId);
  assert.match(await page.getByTestId("job-search-as").innerText(), /a source's DOI/);
  await page.getByTestId("job-search").fill(word);
  await page.getByTestId("job-search").press("Enter");
  await page.getByTestId("job-search-as").filter({ hasText: "words of the title" }).waitFor({ timeout: WAIT_MS });
  await rowsAre(jobId);
  const row = page.locator(`[data-testid="job-row"][data-job-id="${jobId}"]`);
  assert.deepEqual(await writtenOut(row), ["\\u{200B}", "\\u{00AD}", "\\u{2060}", "\\u{0085}", "\\u{2028}"]);
  assert.doesNotMatch(await row.innerText(), RAW_INVISIBLE, "an invisible character reaches a search result as it is");

  // The ledger's entry and the audit timeline's: actor and note.
  await visit(page, `ledger?user=${user}`);
  const entry = page.getByTestId("ledger-page").locator('[data-testid="ledger-row"]').first();
  await entry.getByTestId("ledger-note").waitFor({ timeout: WAIT_MS });
  assert.deepEqual(await writtenOut(entry), ["\\u{200D}", "\\u{180E}", "\\u{2029}"]);
  assert.doesNotMatch(await entry.innerText(), RAW_INVISIBLE, "an invisible character reaches the ledger as it is");
  await visit(page, `settings?user=${user}`);
  const event = page.locator('[data-testid="audit-event"][data-kind="grant"]').first();
  await event.waitFor({ timeout: WAIT_MS });
  assert.deepEqual(await writtenOut(event), ["\\u{200D}", "\\u{180E}", "\\u{2029}"]);
  assert.doesNotMatch(await event.innerText(), RAW_INVISIBLE, "an invisible character reaches the audit timeline as it is");
});

test("ticked rows are canceled, and only they", async () => {
  const user = `select-${stamp}`;
  await asOperator.grantCredits({ userId: user, amount: 4n, idempotencyKey: "grant" });
  const jobs = [await admit(user), await admit(user), await admit(user), await admit(user)];
  await visit(page, `jobs?user=${user}`);
  const rowOf = (jobId: string) => page.locator(`[data-testid="job-row"][data-job-id="${jobId}"]`);
  await rowOf(jobs[3].jobId).waitFor({ timeout: WAIT_MS });
  await rowOf(jobs[1].jobId).getByTestId("select-job").check();
  await rowOf(jobs[3].jobId).getByTestId("select-job").check();
  const button = page.getByTestId("cancel-selected");
  assert.equal(await button.innerText(), "Cancel selected (2)");
  await button.click();
  const dialog = page.getByRole("alertdialog");
  await dialog.waitFor({ timeout: WAIT_MS });
  assert.equal(await dialog.getByTestId("cancel-selected-count").getAttribute("data-count"), "2");
  await shot(page, "records-cancel-selected-dialog");
  await dialog.getByTestId("cancel-selected-confirm").click();
  await dialog.waitFor({ state: "detached", timeout: WAIT_MS });
  const statuses = await until(
    "the two ticked jobs are canceled",
    async () => Promise.all(jobs.map(async (j) => (await asWeb.getJob({ jobId: j.jobId })).job!.status)),
    (s) => s[1] === JobStatus.CANCELED && s[3] === JobStatus.CANCELED,
  );
  assert.notEqual(statuses[0], JobStatus.CANCELED);
  assert.notEqual(statuses[2], JobStatus.CANCELED);
  await rowOf(jobs[1].jobId).locator(".badge.canceled").waitFor({ timeout: WAIT_MS });
  assert.equal(await button.innerText(), "Cancel selected (0)");
  await shot(page, "records-cancel-selected-done");
});

test("the User queue lists the users with work, waiting longest first, to pick from", async () => {
  const user = `work-${stamp}`;
  await asOperator.grantCredits({ userId: user, amount: 3n, idempotencyKey: "grant" });
  await admit(user);
  await admit(user);
  await admit(user);
  await visit(page, `users`);
  const row = page.locator(`[data-testid="user-with-work"][data-user-id="${user}"]`);
  await row.waitFor({ timeout: WAIT_MS });
  const cells = await row.locator("td").allInnerTexts();
  assert.deepEqual(cells.slice(0, 2), [user, "2"]);
  assert.match(cells[4], /^queued for \d/);
  // The server's order: the oldest queued job first.
  const listed = (await asOperatorConsole.listUsersWithWork({ pageSize: 50 })).users.map((u) => u.userId);
  const shown = await page.locator('[data-testid="user-with-work"]').evaluateAll((rows) => rows.map((r) => r.getAttribute("data-user-id")));
  assert.deepEqual(shown, listed);
  await shot(page, "records-users-with-work");
  await row.locator("a").click();
  await page.getByTestId("user-queue").waitFor({ timeout: WAIT_MS });
  await page.waitForFunction(() => document.querySelectorAll('[data-testid="queue-row"]').length === 3, null, { timeout: WAIT_MS });
});

test("the overview's cards link to the jobs they count, and its charts show the last hour from the server", async () => {
  await visit(page, ``);
  const queued = page.getByTestId("figure-queued");
  await queued.waitFor({ timeout: WAIT_MS });
  // A full hour of points at once, not the samples since the page opened.
  await page.waitForFunction(() => document.querySelector('[data-testid="depth-chart"]')?.getAttribute("data-points") === "60", null, { timeout: WAIT_MS });
  assert.ok((await page.getByTestId("throughput-chart").locator("rect.bar").count()) === 60);
  const ticks = await page.getByTestId("depth-chart").locator("text.tick").allTextContents();
  assert.ok(ticks.includes("now") && ticks.includes("−60 min") && ticks.includes("0"), `axes: ${ticks.join(", ")}`);
  await shot(page, "records-overview-history");
  await queued.click();
  await page.waitForFunction(() => window.location.hash === "#/jobs?status=queued", null, { timeout: WAIT_MS });
  await page.locator('[data-testid="job-row"]').first().waitFor({ timeout: WAIT_MS });
  const badges = await page.locator('[data-testid="job-row"] .badge').allInnerTexts();
  assert.ok(badges.length > 0 && badges.every((b) => b === "queued"), `only queued jobs: ${badges.join(", ")}`);
  await visit(page, ``);
  await page.getByTestId("figure-failed").click();
  await page.waitForFunction(() => window.location.hash === "#/jobs?status=failed", null, { timeout: WAIT_MS });
});

test("relative times and durations, sortable columns, keyboard help on ?, and Escape back from a job", async () => {
  const users = [`zz-sort-${stamp}`, `aa-sort-${stamp}`];
  for (const user of users) await asOperator.grantCredits({ userId: user, amount: 2n, idempotencyKey: "grant" });
  const first = await admit(users[0]);
  await admit(users[0]);
  await admit(users[1]);
  await until("the first job runs", async () => (await asWeb.getJob({ jobId: first.jobId })).job!, (j) => j.status === JobStatus.RUNNING);
  await visit(page, `jobs?status=queued,pending,running&after=${new Date(Date.now() - 60_000).toISOString().slice(0, 16)}`);
  const row = (jobId: string) => page.locator(`[data-testid="job-row"][data-job-id="${jobId}"]`);
  await row(first.jobId).getByTestId("job-state").filter({ hasText: /^judging for \d+ s$/ }).waitFor({ timeout: WAIT_MS });
  await page.locator('[data-testid="job-state"]', { hasText: /^queued for \d+ s$/ }).first().waitFor({ timeout: WAIT_MS });

  const usersShown = () => page.locator('[data-testid="job-row"] td:nth-child(3)').allInnerTexts();
  await page.getByTestId("sort-user").click();
  const ascending = await usersShown();
  assert.deepEqual(ascending, [...ascending].sort(), "ascending by user");
  await page.getByTestId("sort-user").click();
  const descending = await usersShown();
  assert.deepEqual(descending, [...ascending].reverse(), "descending by user");
  await shot(page, "records-jobs-sorted-relative-times");

  await page.locator("body").press("?");
  const help = page.getByRole("dialog", { name: "Keyboard shortcuts" });
  await help.waitFor({ timeout: WAIT_MS });
  assert.match(await help.innerText(), /this help/);
  await shot(page, "records-keyboard-help");
  await page.keyboard.press("Escape");
  await help.waitFor({ state: "detached", timeout: WAIT_MS });

  await visit(page, `jobs/${first.jobId}`);
  await page.getByTestId("job-state-line").filter({ hasText: /^judging for/ }).waitFor({ timeout: WAIT_MS });
  await page.locator("body").press("Escape");
  await page.waitForFunction(() => window.location.hash === "#/jobs", null, { timeout: WAIT_MS });
});

test("at 800 px nothing overflows the window, and the system's dark mode is followed", async () => {
  const user = `narrow-${stamp}`;
  await asOperator.grantCredits({ userId: user, amount: 2n, idempotencyKey: "grant" });
  const job = await admit(user);
  await admit(user);
  await page.setViewportSize({ width: 800, height: 900 });
  try {
    for (const [path, ready, name] of [
      [``, "overview", "records-800px-overview"],
      [`jobs?user=${user}`, "jobs", "records-800px-jobs"],
      [`jobs/${job.jobId}`, "job-detail", "records-800px-job-detail"],
      [`users/${user}`, "user-queue", "records-800px-user-queue"],
    ]) {
      await visit(page, path);
      await page.getByTestId(ready).waitFor({ timeout: WAIT_MS });
      const width = await page.evaluate(() => document.documentElement.scrollWidth);
      assert.ok(width <= 800, `${path}: the page is ${width} px wide at an 800 px window`);
      await shot(page, name);
    }
    await page.emulateMedia({ colorScheme: "dark" });
    await visit(page, `jobs/${job.jobId}`);
    await page.getByTestId("job-detail").waitFor({ timeout: WAIT_MS });
    const background = await page.evaluate(() => getComputedStyle(document.body).backgroundColor || getComputedStyle(document.documentElement).backgroundColor);
    const paper = await page.evaluate(() => getComputedStyle(document.querySelector(".facts")!).backgroundColor);
    const [r, g, b] = paper.match(/\d+/g)!.map(Number);
    assert.ok(r + g + b < 150, `dark mode paints the facts dark: ${paper} (body ${background})`);
    await shot(page, "records-dark-job-detail");
    await visit(page, ``);
    await page.getByTestId("overview").waitFor({ timeout: WAIT_MS });
    await shot(page, "records-dark-overview");
  } finally {
    await page.emulateMedia({ colorScheme: "light" });
    await page.setViewportSize({ width: 1280, height: 860 });
  }
});

test("the Replicas page shows who serves, their calls and streams, and the core's answers and unknown outcomes", async () => {
  const user = `replica-${stamp}`;
  await asOperator.grantCredits({ userId: user, amount: 2n, idempotencyKey: "grant" });
  const stuck = (
    await asWeb.admit({ userId: user, idempotencyKey: "stuck", document: { uri: `s3://theses/${user}-fail-release.pdf` }, sources: SOURCES.slice(0, 1) })
  ).job!;
  await until("the release went unanswered", async () => (await asWeb.getJob({ jobId: stuck.jobId })).job!, (j) => j.lastError !== "");
  await visit(page, `replicas`);
  const row = page.locator('[data-testid="replica-row"]').first();
  await row.waitFor({ timeout: WAIT_MS });
  assert.equal(await row.getAttribute("data-state"), "serving");
  // Answers and unknown outcomes arrive with the next heartbeat (every 5 s).
  await page.waitForFunction(() => Number(document.querySelector('[data-testid="figure-core-unknown"] .value')?.textContent) >= 1, null, { timeout: WAIT_MS });
  assert.ok(Number(await page.getByTestId("figure-core-answered").locator(".value").innerText()) >= 1);
  assert.equal(await page.getByTestId("figure-serving").locator(".value").innerText(), "1");
  assert.equal((await asOperatorConsole.listReplicas({})).replicas.length, 1);
  // A WatchJobs stream held open: the next heartbeat counts it, in flight and as a job stream.
  const abort = new AbortController();
  const stream = asWeb.watchJobs({ userId: user }, { signal: abort.signal });
  const reading = (async () => {
    try {
      for await (const _ of stream);
    } catch {
      // aborted at the end of the test
    }
  })();
  try {
    await until("the stream is reported", async () => (await asOperatorConsole.listReplicas({})).replicas[0], (r) => r.watchStreams >= 1 && r.callsInFlight >= 1);
    await page.waitForFunction(() => Number(document.querySelector('[data-testid="replica-row"] td:nth-child(6)')?.textContent) >= 1, null, { timeout: WAIT_MS });
    await shot(page, "records-replicas");
  } finally {
    abort.abort();
    await reading;
  }
});
