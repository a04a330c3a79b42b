import { useEffect, useState } from "preact/hooks";

import { date, operator } from "./api.js";
import { CoreHealthPanel } from "./core-health.js";
import { clock, duration } from "./format.js";
import { useNow } from "./hooks.js";
import { PausesTable, usePauses } from "./pauses.js";
import { useLiveStream } from "./stream.js";
import { UserText } from "./user-text.js";
import type { Overview } from "@acurio/queue-client/gen/acurio/queue/v1/operator_service_pb.js";

const HISTORY_MINUTES = 60;
// The history is read again this often (and the current minute follows the live overview).
const HISTORY_REFRESH_MS = 30_000;

function Figure({ label, value, hint, tone, href }: { label: string; value: string; hint?: string; tone?: string; href?: string }) {
  const body = (
    <>
      <div class="value">{value}</div>
      <div class="label">{label}</div>
      {hint && <div class="hint">{hint}</div>}
    </>
  );
  const testId = `figure-${label.toLowerCase().replace(/\s+/g, "-")}`;
  return href ? (
    <a class={`figure link ${tone ?? ""}`} data-testid={testId} href={href} title={`The jobs counted here`}>
      {body}
    </a>
  ) : (
    <div class={`figure ${tone ?? ""}`} data-testid={testId}>
      {body}
    </div>
  );
}

interface Point {
  at: Date;
  queued: number;
  active: number;
  admitted: number;
  ended: number;
}

const WIDTH = 560;
const HEIGHT = 150;
const LEFT = 34; // room for the y axis' labels
const BOTTOM = 20; // room for the x axis' labels
const TOP = 8;

/** A "nice" top for an axis: 1, 2, 5 times a power of ten, at least the largest value. */
function niceMax(value: number): number {
  if (value <= 1) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 5, 10]) if (step * power >= value) return step * power;
  return 10 * power;
}

/** Axes for a chart of the last `minutes`: the y ticks (0, half, top) and the x ticks in minutes ago. */
function Axes({ top, minutes }: { top: number; minutes: number }) {
  const y = (v: number) => HEIGHT - BOTTOM - (v / top) * (HEIGHT - BOTTOM - TOP);
  const ticks = [0, top / 2, top].filter((v, i, all) => all.indexOf(v) === i && (v === Math.round(v)));
  const xTicks = [minutes, (minutes * 3) / 4, minutes / 2, minutes / 4, 0];
  return (
    <g class="axes">
      <line x1={LEFT} x2={WIDTH} y1={HEIGHT - BOTTOM} y2={HEIGHT - BOTTOM} class="axis" />
      <line x1={LEFT} x2={LEFT} y1={TOP} y2={HEIGHT - BOTTOM} class="axis" />
      {ticks.map((v) => (
        <>
          <line x1={LEFT} x2={WIDTH} y1={y(v)} y2={y(v)} class="grid" />
          <text x={LEFT - 5} y={y(v) + 4} class="tick" text-anchor="end">
            {v}
          </text>
        </>
      ))}
      {xTicks.map((ago) => (
        <text x={LEFT + ((minutes - ago) / minutes) * (WIDTH - LEFT)} y={HEIGHT - 4} class="tick" text-anchor={ago === 0 ? "end" : ago === minutes ? "start" : "middle"}>
          {ago === 0 ? "now" : `−${ago} min`}
        </text>
      ))}
    </g>
  );
}

/** Queued and active (pending + running) at the end of each minute of the last hour. */
function DepthChart({ points }: { points: Point[] }) {
  const top = niceMax(Math.max(0, ...points.map((p) => Math.max(p.queued, p.active))));
  // Each point is the depth at its minute's end: the last one is now.
  const x = (i: number) => LEFT + ((i + 1) / Math.max(1, points.length)) * (WIDTH - LEFT);
  const y = (v: number) => HEIGHT - BOTTOM - (v / top) * (HEIGHT - BOTTOM - TOP);
  const line = (pick: (p: Point) => number) => points.map((p, i) => `${i === 0 ? "M" : "L"}${x(i).toFixed(1)},${y(pick(p)).toFixed(1)}`).join(" ");
  return (
    <svg class="chart" viewBox={`0 0 ${WIDTH} ${HEIGHT}`} role="img" aria-label={`Queue depth per minute over the last ${points.length} minutes`} data-testid="depth-chart" data-points={points.length}>
      <Axes top={top} minutes={Math.max(1, points.length)} />
      {points.length > 0 && <path d={line((p) => p.queued)} class="series queued" />}
      {points.length > 0 && <path d={line((p) => p.active)} class="series active" />}
    </svg>
  );
}

/** Jobs ended per minute (the throughput, bars) and admitted per minute (line). */
function ThroughputChart({ points }: { points: Point[] }) {
  const top = niceMax(Math.max(0, ...points.map((p) => Math.max(p.ended, p.admitted))));
  const band = (WIDTH - LEFT) / Math.max(1, points.length);
  const y = (v: number) => HEIGHT - BOTTOM - (v / top) * (HEIGHT - BOTTOM - TOP);
  const admitted = points.map((p, i) => `${i === 0 ? "M" : "L"}${(LEFT + (i + 0.5) * band).toFixed(1)},${y(p.admitted).toFixed(1)}`).join(" ");
  return (
    <svg class="chart" viewBox={`0 0 ${WIDTH} ${HEIGHT}`} role="img" aria-label="Jobs ended and admitted per minute" data-testid="throughput-chart">
      <Axes top={top} minutes={Math.max(1, points.length)} />
      {points.map((p, i) => (
        <rect x={LEFT + i * band + 0.5} y={y(p.ended)} width={Math.max(1, band - 1)} height={HEIGHT - BOTTOM - y(p.ended)} class="bar">
          <title>{`${p.at.toLocaleTimeString(undefined, { hour12: false, hour: "2-digit", minute: "2-digit" })}: ${p.ended} ended, ${p.admitted} admitted`}</title>
        </rect>
      ))}
      {points.length > 0 && <path d={admitted} class="series admitted" />}
    </svg>
  );
}

/** The last hour from the server (job timestamps), read again every half minute. */
function useHistory(live: boolean): Point[] {
  const [points, setPoints] = useState<Point[]>([]);
  useEffect(() => {
    if (!live) return;
    let current = true;
    const load = () =>
      operator.getQueueHistory({ windowMinutes: HISTORY_MINUTES }).then(
        (r) =>
          current &&
          setPoints(r.minutes.map((m) => ({ at: date(m.minute)!, queued: Number(m.queued), active: Number(m.active), admitted: Number(m.admitted), ended: Number(m.ended) }))),
        () => {}, // the live mark tells a refused or unreachable service
      );
    load();
    const timer = setInterval(load, HISTORY_REFRESH_MS);
    return () => {
      current = false;
      clearInterval(timer);
    };
  }, [live]);
  return points;
}

/** While any release is paused: who is paused (the fleet, which users), since when, by whom and
 * why, each with a Resume button (ListReleasePauses), not only how many. */
function PausedBanner({ overview, live }: { overview: Overview; live: boolean }) {
  const anyPaused = overview.releasesPaused || overview.pausedUsers > 0n;
  const { pauses, total, reread } = usePauses(`${overview.releasesPaused} ${overview.pausedUsers} ${date(overview.releasesPausedSince)?.getTime()}`, live && anyPaused);
  if (!anyPaused) return null;
  return (
    <div class="warning paused-banner" role="status" data-testid="releases-paused-banner">
      {overview.releasesPaused ? (
        <p data-testid="releases-paused">
          <strong>Releases are paused fleet-wide</strong> since {clock(date(overview.releasesPausedSince))} by <UserText class="mono" text={overview.releasesPausedBy} />
          {overview.releasesPausedNote && (
            <>
              {" "}
              · “<UserText text={overview.releasesPausedNote} />”
            </>
          )}
          . Admits are accepted and wait; nothing is released to the core.
        </p>
      ) : (
        <p data-testid="users-paused">
          <strong>
            {String(overview.pausedUsers)} {overview.pausedUsers === 1n ? "user's releases are" : "users' releases are"} paused
          </strong>
          : their admits are accepted and wait; nothing of theirs is released to the core.
        </p>
      )}
      {pauses !== null && pauses.length > 0 && <PausesTable pauses={pauses} total={total} changed={reread} />}
      <p>
        <a href="#/settings">Settings &amp; audit</a>
      </p>
    </div>
  );
}

export function OverviewPage({ live }: { live: boolean }) {
  const [overview, setOverview] = useState<Overview | null>(null);
  const history = useHistory(live);
  const now = useNow();
  const problem = useLiveStream(
    (signal) => operator.watchOverview({ windowMinutes: 15, intervalMs: 1000 }, { signal }),
    (message) => {
      if (message.overview) setOverview(message.overview);
    },
    [],
    live,
  );

  if (overview === null) {
    return <section class="page">{problem ? <p class="problem">{problem}</p> : <p class="muted">Loading the overview…</p>}</section>;
  }
  const oldest = date(overview.oldestQueuedCreateTime);
  const capacityWait = date(overview.oldestCapacityWaitTime);
  // The current minute follows the live overview: the depth now, not as of the last history read.
  const points = history.length > 0 ? [...history.slice(0, -1), { ...history[history.length - 1], queued: Number(overview.queued), active: Number(overview.pending + overview.running) }] : [];
  // The window's ended jobs: those that ended since the window began (their admit may be older,
  // so the link filters by status only, newest first).
  const jobs = (query: string) => `#/jobs?${query}`;
  return (
    <section class={`page${problem ? " stale" : ""}`} data-testid="overview" data-stale={problem ? "true" : "false"}>
      <h1>Overview</h1>
      {problem && (
        // The figures below are the last ones read: dimmed, with when they were read.
        <p class="problem" data-testid="overview-stale">
          No live answer: {problem}. The figures below are as of {clock(date(overview.readTime))} and may be out of date.
        </p>
      )}
      <PausedBanner overview={overview} live={live} />
      <CoreHealthPanel health={overview.coreHealth} now={now} />
      <div class="figures">
        <Figure label="Queued" href={jobs("status=queued")} value={String(overview.queued)} hint={`${overview.usersWaiting} ${overview.usersWaiting === 1n ? "user" : "users"} waiting`} />
        <Figure label="Pending" href={jobs("status=pending")} value={String(overview.pending)} hint="being released" />
        <Figure label="Running" href={jobs("status=running")} value={String(overview.running)} hint="judged by the core" />
        <Figure label="Oldest wait" href="#/users" value={oldest ? duration(now - oldest.getTime()) : "—"} hint="longest queued job, since its admit" />
        <Figure
          label="Releases retrying"
          href={jobs("status=pending&error=1")}
          value={String(overview.releasesRetrying)}
          tone={overview.releasesRetrying > 0n ? "warn" : ""}
          hint="core refused for now"
        />
        <Figure
          label="Core capacity"
          value={`${overview.capacityInUse} / ${overview.capacityLimit > 0n ? String(overview.capacityLimit) : "∞"}`}
          tone={overview.capacityWaitingJobs > 0n ? "warn" : ""}
          hint={
            overview.capacityWaitingUsers > 0n
              ? `${overview.capacityWaitingUsers} ${overview.capacityWaitingUsers === 1n ? "user" : "users"} waiting for a turn, longest turn wait ${capacityWait ? duration(now - capacityWait.getTime()) : "—"}`
              : overview.coreLimit > 0n
                ? `the core took ${overview.coreLimit}`
                : "runs at the core"
          }
        />
        <Figure
          label="Runs reconciling"
          href={jobs("status=running")}
          value={String(overview.runsReconciling)}
          tone={overview.runsReconciling > 0n ? "warn" : ""}
          hint="completion overdue"
        />
      </div>
      <h2>Last {overview.windowMinutes} minutes</h2>
      <div class="figures small">
        <Figure label="Succeeded" href={jobs("status=succeeded")} value={String(overview.succeededInWindow)} tone="ok" />
        <Figure label="Failed" href={jobs("status=failed")} value={String(overview.failedInWindow)} tone={overview.failedInWindow > 0n ? "bad" : ""} />
        <Figure label="Canceled" href={jobs("status=canceled")} value={String(overview.canceledInWindow)} />
      </div>
      <div class="charts">
        <figure>
          <figcaption>
            Depth, last hour <span class="key queued">queued</span> <span class="key active">pending + running</span>
          </figcaption>
          <DepthChart points={points} />
        </figure>
        <figure>
          <figcaption>
            Throughput, last hour <span class="key ended">ended / min</span> <span class="key admitted">admitted / min</span>
          </figcaption>
          <ThroughputChart points={history} />
        </figure>
      </div>
    </section>
  );
}
