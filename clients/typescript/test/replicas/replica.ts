// Starts and stops `queue-service serve` replicas for the drain / restart tests. They share the
// database and dev core that `.ci/clients_live.py` provides through the environment:
// QUEUE_TEST_DATABASE_URL, QUEUE_TEST_CORE_ADDR, QUEUE_TEST_CALLBACK_PORT (the port the dev
// core calls back: the first replica started listens there), QUEUE_SERVICE_PYTHON and
// QUEUE_SERVICE_ROOT (the interpreter and the repository to run `queue_service.cli` from).
import { type ChildProcess, spawn } from "node:child_process";
import { once } from "node:events";
import { createServer } from "node:net";

import { createQueueClients } from "../../src/index.js";

function required(name: string): string {
  const value = process.env[name]?.trim() ?? "";
  if (value === "") {
    throw new Error(
      `${name} is not set: the replica tests start their own \`queue-service serve\` processes; ` +
        "run them through .ci/clients_live.py --ts-test 'npm run test:replicas'",
    );
  }
  return value;
}

export async function freePort(): Promise<number> {
  const server = createServer();
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const port = (server.address() as { port: number }).port;
  server.close();
  await once(server, "close");
  return port;
}

/** What a replica runs with beyond the shared database and core. */
export interface ReplicaOptions {
  /** Extra environment of `queue-service serve` (for example QUEUE_AUTH_FILE). */
  env?: Record<string, string>;
  /** The token the readiness probe sends (GetBalance: an `operator` token) when the replica authenticates. */
  probeToken?: string;
}

/** One `queue-service serve` process on a fixed port (so a restart comes back at the same address). */
export class Replica {
  private process: ChildProcess | undefined;
  private output = "";

  private constructor(
    readonly port: number,
    private readonly options: ReplicaOptions = {},
  ) {}

  get address(): string {
    return `127.0.0.1:${this.port}`;
  }

  static async start(port?: number, options: ReplicaOptions = {}): Promise<Replica> {
    const replica = new Replica(port ?? (await freePort()), options);
    await replica.start();
    return replica;
  }

  /** Starts the process and waits until it answers a call. */
  async start(): Promise<void> {
    const child = spawn(required("QUEUE_SERVICE_PYTHON"), ["-m", "queue_service.cli", "serve"], {
      cwd: required("QUEUE_SERVICE_ROOT"),
      env: {
        ...process.env,
        DATABASE_URL: required("QUEUE_TEST_DATABASE_URL"),
        QUEUE_CORE_ADDR: required("QUEUE_TEST_CORE_ADDR"),
        QUEUE_LISTEN_ADDR: this.address,
        QUEUE_MIGRATE_ON_START: "false",
        QUEUE_GRACE_PERIOD_SECONDS: "5",
        QUEUE_LOG_FORMAT: "text",
        ...this.options.env,
      },
      stdio: ["ignore", "pipe", "pipe"],
    });
    child.stdout?.on("data", (chunk: Buffer) => (this.output += chunk.toString()));
    child.stderr?.on("data", (chunk: Buffer) => (this.output += chunk.toString()));
    this.process = child;
    const probe = createQueueClients({ address: this.address, timeoutMs: 1_000, retry: false, bearerToken: this.options.probeToken });
    try {
      const deadline = Date.now() + 90_000;
      for (;;) {
        if (child.exitCode !== null) {
          throw new Error(`replica ${this.address} exited with ${child.exitCode}:\n${this.output.slice(-3000)}`);
        }
        try {
          await probe.credits.getBalance({ userId: "replica-probe" });
          return;
        } catch {
          if (Date.now() > deadline) {
            throw new Error(`replica ${this.address} did not answer within 90 s:\n${this.output.slice(-3000)}`);
          }
          await new Promise((r) => setTimeout(r, 100));
        }
      }
    } finally {
      probe.close();
    }
  }

  /** Sends SIGTERM (a drain) without waiting. */
  beginDrain(): void {
    this.process?.kill("SIGTERM");
  }

  /** Waits for the process to end; returns its exit code. */
  async exited(): Promise<number | null> {
    const child = this.process;
    if (child === undefined || child.exitCode !== null || child.signalCode !== null) {
      return child?.exitCode ?? null;
    }
    const [code] = (await once(child, "exit")) as [number | null];
    return code;
  }

  /** Drains (SIGTERM) and waits for the exit; returns the exit code. */
  async stop(): Promise<number | null> {
    this.beginDrain();
    return this.exited();
  }

  get log(): string {
    return this.output;
  }
}

/** The port the dev core calls back (the replica that must stay up while others restart). */
export function callbackPort(): number {
  return Number(required("QUEUE_TEST_CALLBACK_PORT"));
}
