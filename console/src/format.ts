import { JobStatus } from "@acurio/queue-client/gen/acurio/queue/v1/job_pb.js";

export const STATUS_LABELS: Record<JobStatus, string> = {
  [JobStatus.UNSPECIFIED]: "unspecified",
  [JobStatus.QUEUED]: "queued",
  [JobStatus.PENDING]: "pending",
  [JobStatus.RUNNING]: "running",
  [JobStatus.SUCCEEDED]: "succeeded",
  [JobStatus.FAILED]: "failed",
  [JobStatus.CANCELED]: "canceled",
};

export const ACTIVE = new Set([JobStatus.QUEUED, JobStatus.PENDING, JobStatus.RUNNING]);

export function shortId(id: string): string {
  return id.slice(0, 8);
}

/** "4s", "3m 05s", "2h 10m": a duration at a glance. */
export function duration(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
}

export function clock(d: Date | undefined): string {
  return d === undefined ? "—" : d.toLocaleTimeString(undefined, { hour12: false });
}

export function dateTime(d: Date | undefined): string {
  return d === undefined ? "—" : `${d.toLocaleDateString()} ${clock(d)}`;
}

/** 1st, 2nd, 3rd, 4th … 11th, 12th, 13th, 21st: a place in line. */
export function ordinal(n: number): string {
  const tens = n % 100;
  const suffix = tens >= 11 && tens <= 13 ? "th" : ({ 1: "st", 2: "nd", 3: "rd" } as Record<number, string>)[n % 10] ?? "th";
  return `${n}${suffix}`;
}

/** "4 min", "35 s", "2 h 10 min": a duration as a phrase ("queued for 4 min"). */
export function spoken(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min`;
  const h = Math.floor(m / 60);
  if (h < 48) return m % 60 ? `${h} h ${m % 60} min` : `${h} h`;
  return `${Math.floor(h / 24)} days`;
}

/** "3 min ago", "just now": how long ago a moment was. */
export function ago(d: Date | undefined, now: number): string {
  if (d === undefined) return "—";
  const ms = now - d.getTime();
  return ms < 5000 ? "just now" : `${spoken(ms)} ago`;
}

export const RETRYABLE = new Set([JobStatus.FAILED, JobStatus.CANCELED]);

/** Who asked for a cancel, from the actor the job records (as the ledger names actors):
 * "the user" (through the web app), "operator alice", "the service". */
export function canceler(actor: string): string {
  const [role, ...rest] = actor.split(":");
  const name = rest.join(":");
  if (role === "web") return `the user (${actor})`;
  if (role === "operator") return `operator ${name}`;
  if (role === "system") return "the service";
  return actor;
}

/** What ended a canceled job, in words: who canceled it when the job records it (an operator's
 * cancel never reads as the user's), else the job's own message. */
export function canceledText(job: { canceledBy: string; lastError: string }): string {
  return job.canceledBy ? `canceled by ${canceler(job.canceledBy)}` : job.lastError;
}
