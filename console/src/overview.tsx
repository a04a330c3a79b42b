import { useState } from "preact/hooks";

import { date, operator } from "./api.js";
import { duration } from "./format.js";
import { useNow } from "./hooks.js";
import { useLiveStream } from "./stream.js";
import type { Overview } from "./gen/acurio/queue/v1/operator_service_pb.js";

interface Sample {
  at: number;
  queued: number;
  active: number;
}

const HISTORY_MS = 15 * 60 * 1000;

function Figure({ label, value, hint, tone }: { label: string; value: string; hint?: string; tone?: string }) {
  return (
    <div class={`figure ${tone ?? ""}`} data-testid={`figure-${label.toLowerCase().replace(/\s+/g, "-")}`}>
      <div class="value">{value}</div>
      <div class="label">{label}</div>
      {hint && <div class="hint">{hint}</div>}
    </div>
  );
}

/** Depth over time (queued, and pending + running), sampled from the live overview. */
function DepthChart({ samples, now }: { samples: Sample[]; now: number }) {
  const width = 560;
  const height = 120;
  const max = Math.max(1, ...samples.map((s) => Math.max(s.queued, s.active)));
  const x = (at: number) => width - ((now - at) / HISTORY_MS) * width;
  const y = (v: number) => height - 4 - (v / max) * (height - 12);
  const line = (pick: (s: Sample) => number) =>
    samples.map((s, i) => `${i === 0 ? "M" : "L"}${x(s.at).toFixed(1)},${y(pick(s)).toFixed(1)}`).join(" ");
  return (
    <svg class="chart" viewBox={`0 0 ${width} ${height}`} role="img" aria-label="Queue depth over the last 15 minutes">
      <line x1="0" x2={width} y1={height - 4} y2={height - 4} class="axis" />
      <text x="4" y="12" class="tick">
        {max}
      </text>
      {samples.length > 0 && <path d={line((s) => s.queued)} class="series queued" />}
      {samples.length > 0 && <path d={line((s) => s.active)} class="series active" />}
    </svg>
  );
}

function AdmitsChart({ admits }: { admits: bigint[] }) {
  const width = 560;
  const height = 120;
  const values = admits.map(Number);
  const max = Math.max(1, ...values);
  const bar = width / Math.max(1, values.length);
  return (
    <svg class="chart" viewBox={`0 0 ${width} ${height}`} role="img" aria-label="Admits per minute">
      <text x="4" y="12" class="tick">
        {max}/min
      </text>
      {values.map((v, i) => {
        const h = (v / max) * (height - 16);
        return <rect x={i * bar + 1} y={height - h} width={Math.max(1, bar - 2)} height={h} class="bar" />;
      })}
    </svg>
  );
}

export function OverviewPage({ live }: { live: boolean }) {
  const [overview, setOverview] = useState<Overview | null>(null);
  const [samples, setSamples] = useState<Sample[]>([]);
  const now = useNow();
  const problem = useLiveStream(
    (signal) => operator.watchOverview({ windowMinutes: 15, intervalMs: 1000 }, { signal }),
    (message) => {
      const o = message.overview;
      if (!o) return;
      setOverview(o);
      const sample = { at: Date.now(), queued: Number(o.queued), active: Number(o.pending + o.running) };
      setSamples((old) => [...old.filter((s) => Date.now() - s.at < HISTORY_MS), sample]);
    },
    [],
    live,
  );

  if (overview === null) {
    return <section class="page">{problem ? <p class="problem">{problem}</p> : <p class="muted">Loading the overview…</p>}</section>;
  }
  const oldest = date(overview.oldestQueuedCreateTime);
  const capacityWait = date(overview.oldestCapacityWaitTime);
  return (
    <section class="page" data-testid="overview">
      <h1>Overview</h1>
      {problem && <p class="problem">{problem}</p>}
      <div class="figures">
        <Figure label="Queued" value={String(overview.queued)} hint={`${overview.usersWaiting} ${overview.usersWaiting === 1n ? "user" : "users"} waiting`} />
        <Figure label="Pending" value={String(overview.pending)} hint="being released" />
        <Figure label="Running" value={String(overview.running)} hint="judged by the core" />
        <Figure label="Oldest wait" value={oldest ? duration(now - oldest.getTime()) : "—"} hint="since admit" />
        <Figure
          label="Releases retrying"
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
              ? `${overview.capacityWaitingUsers} ${overview.capacityWaitingUsers === 1n ? "user" : "users"} waiting, longest ${capacityWait ? duration(now - capacityWait.getTime()) : "—"}`
              : overview.coreLimit > 0n
                ? `the core took ${overview.coreLimit}`
                : "runs at the core"
          }
        />
        <Figure
          label="Runs reconciling"
          value={String(overview.runsReconciling)}
          tone={overview.runsReconciling > 0n ? "warn" : ""}
          hint="completion overdue"
        />
      </div>
      <h2>Last {overview.windowMinutes} minutes</h2>
      <div class="figures small">
        <Figure label="Succeeded" value={String(overview.succeededInWindow)} tone="ok" />
        <Figure label="Failed" value={String(overview.failedInWindow)} tone={overview.failedInWindow > 0n ? "bad" : ""} />
        <Figure label="Canceled" value={String(overview.canceledInWindow)} />
      </div>
      <div class="charts">
        <figure>
          <figcaption>
            Depth <span class="key queued">queued</span> <span class="key active">pending + running</span>
          </figcaption>
          <DepthChart samples={samples} now={now} />
        </figure>
        <figure>
          <figcaption>Admits per minute</figcaption>
          <AdmitsChart admits={overview.admitsPerMinute} />
        </figure>
      </div>
    </section>
  );
}
