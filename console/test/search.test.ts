// The Jobs page's search box, in Debian's Chromium against the live `queue-service dev` that
// .ci/console-browser-test starts: an operator with a lecturer on the phone types a thesis title's
// words, pastes a DOI in any case (or a doi.org link), or a document uri, and finds the jobs; a
// search the service refuses says why. Its own users and words, so it runs beside other files.
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { createClient } from "@connectrpc/connect";
import { type Browser, type Page } from "playwright-core";

import { CreditsService } from "@acurio/queue-client/gen/acurio/queue/v1/credits_service_pb.js";
import { OperatorService } from "@acurio/queue-client/gen/acurio/queue/v1/operator_service_pb.js";
import { AnalysisQueueService } from "@acurio/queue-client/gen/acurio/queue/v1/queue_service_pb.js";
import { CONSOLE_URL, env, grpc, holdAnswers, launchChromium, SHOTS, signIn, thesis, WAIT_MS } from "./support.js";

const TOKENS = { operator: env("OPERATOR_TOKEN"), web: env("WEB_TOKEN") };
const asWeb = createClient(AnalysisQueueService, grpc(TOKENS.web));
const asOperator = createClient(CreditsService, grpc(TOKENS.operator));
const operator = createClient(OperatorService, grpc(TOKENS.operator));

let browser: Browser;
let page: Page;
const stamp = Date.now().toString(36);

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

async function admit(user: string, key: string, title: string, doi: string) {
  const response = await asWeb.admit(thesis(user, key, { uri: `s3://search-${stamp}/${user}/${key}.pdf`, title, sources: [{ doi, citation: `Cited as ${doi}` }] }));
  return response.job!;
}

/** Types into the search box and presses Enter; waits until the rows shown are exactly `jobIds`. */
async function search(text: string, jobIds: string[]): Promise<void> {
  const box = page.getByTestId("job-search");
  await box.fill(text);
  await box.press("Enter");
  const expected = [...jobIds].sort().join(",");
  await page.waitForFunction(
    (want) => {
      const rows = [...document.querySelectorAll<HTMLElement>('[data-testid="job-row"]')].map((row) => row.dataset.jobId ?? "");
      return rows.sort().join(",") === want;
    },
    expected,
    { timeout: WAIT_MS },
  );
}

/** Waits until the page re-renders on its own: a row's "judging for N s" moves on with the page's
 * clock, which re-renders the page every second. */
async function pageRerendered(): Promise<void> {
  const states = () => page.evaluate(() => [...document.querySelectorAll('[data-testid="job-state"]')].map((cell) => cell.textContent).join("|"));
  const before = await states();
  await page.waitForFunction(
    (was) => [...document.querySelectorAll('[data-testid="job-state"]')].map((cell) => cell.textContent).join("|") !== was,
    before,
    { timeout: WAIT_MS },
  );
}

test("the Jobs page finds jobs by title words, a source's DOI in any case, or a document uri", async () => {
  const user = `search-${stamp}`;
  await asOperator.grantCredits({ userId: user, amount: 2n, idempotencyKey: "grant" });
  const word = `w${stamp}`;
  const fair = await admit(user, "fair", `Fair queues ${word} for citation checks`, `10.5555/${stamp}.Fair`);
  const graphs = await admit(user, "graphs", `Citation graphs ${word}`, `10.5555/${stamp}.other`);

  await page.goto("about:blank");
  await page.goto(`${CONSOLE_URL}#/jobs`);
  await page.getByTestId("job-search").waitFor({ timeout: WAIT_MS });
  // (as the search box below) the user field keeps what is typed through a re-render
  const userField = page.locator('input[name="user"]');
  await userField.fill(`${user}-half`);
  await pageRerendered();
  assert.equal(await userField.inputValue(), `${user}-half`, "a re-render set the user field back");
  await userField.fill("");

  await search(`${word} citation`, [fair.jobId, graphs.jobId]);
  assert.match(await page.getByTestId("job-search-as").innerText(), /words of the title/);

  // What is typed stays in the box, not yet searched, while the page re-renders (its clock, its
  // live re-reads): a slow typist's words are not set back to the search shown.
  await page.getByTestId("job-search").fill(`${word} half typ`);
  await pageRerendered();
  assert.equal(await page.getByTestId("job-search").inputValue(), `${word} half typ`, "a re-render set the search box back");
  await search(`queues ${word.toUpperCase()}`, [fair.jobId]);
  await shot("search-title-words");

  await search(`https://doi.org/10.5555/${stamp.toUpperCase()}.FAIR`, [fair.jobId]);
  assert.match(await page.getByTestId("job-search-as").innerText(), /a source's DOI/);
  await shot("search-doi");

  // While a new search's answer is on its way, the previous search's rows are not shown under it.
  const searches = await holdAnswers(page, "OperatorService/SearchJobs");
  await page.getByTestId("job-search").fill(`s3://search-${stamp}/${user}/gra`);
  await page.getByTestId("job-search").press("Enter");
  await page.getByTestId("jobs-loading").waitFor({ timeout: WAIT_MS });
  assert.equal(await page.getByTestId("job-row").count(), 0, "the previous search's rows are shown under the new one");
  searches.release();
  await search(`s3://search-${stamp}/${user}/gra`, [graphs.jobId]);
  await searches.done();
  assert.match(await page.getByTestId("job-search-as").innerText(), /start of a document uri/);

  // A search the service refuses (no word in it) says why, naming the field.
  await page.getByTestId("job-search").fill("-- !!");
  await page.getByTestId("job-search").press("Enter");
  const notice = page.getByTestId("notice");
  await notice.filter({ hasText: "title_words" }).waitFor({ timeout: WAIT_MS });
  assert.match(await notice.innerText(), /at least one word/);
  await page.getByTestId("jobs-refused").waitFor({ timeout: WAIT_MS });
  assert.equal(await page.getByTestId("job-row").count(), 0, "a refused search still shows the previous search's rows");
  await shot("search-refused");
});

test("a search, or its refusal, slower than the overview's changes still lands on a busy fleet", async () => {
  const user = `slow-search-${stamp}`;
  const churn = `churn-${stamp}`;
  await asOperator.grantCredits({ userId: user, amount: 1n, idempotencyKey: "grant" });
  await asOperator.grantCredits({ userId: churn, amount: 200n, idempotencyKey: "grant" });
  const word = `slow${stamp}`;
  const wanted = await admit(user, "slow", `A slow search ${word}`, `10.5555/${stamp}.slow`);
  await page.goto("about:blank");
  await page.goto(`${CONSOLE_URL}#/jobs`);
  await page.getByTestId("job-search").waitFor({ timeout: WAIT_MS });

  // Every search is answered 2.5 s late, while another user's admits change the overview (which
  // the page re-reads on) every few hundred milliseconds: a re-read must not throw away the
  // answer on its way, or none ever shows.
  const searchCall = /\/acurio\.queue\.v1\.OperatorService\/SearchJobs$/;
  await page.route(searchCall, async (route) => {
    await new Promise((resolve) => setTimeout(resolve, 2500));
    await route.continue().catch(() => {}); // (the page may have gone on meanwhile)
  });
  let churning = true;
  const churned = (async () => {
    for (let n = 0; churning && n < 150; n++) {
      await asWeb.admit(thesis(churn, `churn-${n}`));
      await new Promise((resolve) => setTimeout(resolve, 300));
    }
  })();
  try {
    await search(word, [wanted.jobId]);
    // A refusal answered as late is said too, though the page has re-read meanwhile.
    await page.getByTestId("job-search").fill("-- !!");
    await page.getByTestId("job-search").press("Enter");
    await page.getByTestId("notice").filter({ hasText: "title_words" }).waitFor({ timeout: WAIT_MS });
    await page.getByTestId("jobs-refused").waitFor({ timeout: WAIT_MS });
  } finally {
    churning = false;
    await churned;
    await page.unrouteAll({ behavior: "ignoreErrors" });
    await operator.cancelJobs({ filter: { userId: churn }, maxJobs: 1000 });
  }
});

async function shot(name: string): Promise<void> {
  await page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });
}
