// What the browser tests share: the settings .ci/console-browser-test passes, Debian's Chromium
// as CI runs it, and gRPC clients that carry a role's bearer token.
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";

import { type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { chromium, type Browser, type Page } from "playwright-core";

export const env = (name: string): string => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set (run .ci/console-browser-test)`);
  return value;
};
export const CONSOLE_URL = env("CONSOLE_URL");
export const SHOTS = env("SCREENSHOT_DIR");
export const WAIT_MS = 30_000; // conditions, never sleeps; generous for a slow shared machine
// Debian's Chromium as CI runs it: no sandbox (containers), nothing fetched on its own.
const CHROMIUM_ARGS = [
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];
/** Debian's Chromium (or $CHROMIUM), headless, with the flags above. */
export const launchChromium = (): Promise<Browser> =>
  chromium.launch({ executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium", headless: true, args: CHROMIUM_ARGS });

const bearer = (token: string): Interceptor => (next) => (req) => {
  req.header.set("authorization", `Bearer ${token}`);
  return next(req);
};
/** A gRPC transport to the live service that authenticates as the token's role. */
export const grpc = (token: string) => createGrpcTransport({ baseUrl: `http://${env("QUEUE_ADDR")}`, interceptors: [bearer(token)] });

/** Reads until `ok` holds (every `pollMs`), or fails after `within` ms naming what it waited for
 * and the last value read. A condition, never a sleep. */
export async function until<T>(what: string, read: () => Promise<T>, ok: (value: T) => boolean, within = WAIT_MS, pollMs = 100): Promise<T> {
  const deadline = Date.now() + within;
  for (;;) {
    const value = await read();
    if (ok(value)) return value;
    if (Date.now() > deadline) throw new Error(`${what}: still ${JSON.stringify(value, (_, v) => (typeof v === "bigint" ? String(v) : v))}`);
    await new Promise((resolve) => setTimeout(resolve, pollMs));
  }
}

/** An Admit request for a one-source thesis of `user` (the tests' usual job); `document` and
 * `sources` override its parts. */
export const thesis = (
  user: string,
  idempotencyKey: string,
  { uri = `s3://theses/${user}.pdf`, title = "A thesis", sources = [{ doi: "10.1234/abc" }] }: { uri?: string; title?: string; sources?: { doi: string; citation?: string }[] } = {},
) => ({ userId: user, idempotencyKey, document: { uri, title }, sources });

/** Holds the page's calls of one method (`"OperatorService/SearchJobs"`) until `release()`, to see
 * what the page shows while an answer is on its way; `done()`, once the held calls were
 * answered (their handlers have finished), lifts the hold. */
export async function holdAnswers(page: Page, method: string): Promise<{ release: () => void; done: () => Promise<void> }> {
  let release = () => {};
  const held = new Promise<void>((resolve) => (release = resolve));
  const call = new RegExp(`/acurio\\.queue\\.v1\\.${method}$`);
  await page.route(call, async (route) => {
    await held;
    await route.continue();
  });
  return { release, done: () => page.unroute(call) };
}

/** Signs every document the page opens in with `token`, as the console's token field would (its
 * sessionStorage key); not about:blank, which has no storage to write. */
export async function signIn(page: Page, token: string): Promise<void> {
  await page.addInitScript((value) => {
    if (window.location.protocol.startsWith("http")) sessionStorage.setItem("acurio-queue-console-token", value);
  }, token);
}

/** Runs `statement` (psycopg's %(name)s parameters from `params`) on the live service's database,
 * in one transaction: to seed rows that no call may write any more (text the service refuses now,
 * kept from before). Through the repository's .venv, whose psycopg the service uses. */
export function sql(statement: string, params: Record<string, string> = {}): void {
  const python = fileURLToPath(new URL("../../.venv/bin/python", import.meta.url));
  const program = "import json, sys, psycopg\nwith psycopg.connect(sys.argv[1]) as conn:\n    conn.execute(sys.argv[2], json.loads(sys.argv[3]))";
  execFileSync(python, ["-c", program, env("QUEUE_TEST_DATABASE_URL"), statement, JSON.stringify(params)], { stdio: ["ignore", "inherit", "inherit"] });
}
