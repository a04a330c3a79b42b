// The core's health as the replicas read it (Overview.core_health): the Overview's panel, and
// what the User queue page says of runs and starts while the core is unreachable.
import { useEffect, useState } from "preact/hooks";

import { date, operator } from "./api.js";
import { ago } from "./format.js";
import { type CoreHealth, CoreState } from "@acurio/queue-client/gen/acurio/queue/v1/operator_service_pb.js";

const LABELS: Record<CoreState, string> = {
  [CoreState.UNSPECIFIED]: "not reported",
  [CoreState.UNKNOWN]: "unknown",
  [CoreState.HEALTHY]: "healthy",
  [CoreState.DEGRADED]: "degraded",
  [CoreState.UNREACHABLE]: "unreachable",
  [CoreState.REFUSING]: "refusing",
};

/** Green, amber or red, as the figures' tones. */
function tone(state: CoreState): string {
  if (state === CoreState.HEALTHY) return "ok";
  if (state === CoreState.DEGRADED) return "warn";
  if (state === CoreState.UNREACHABLE || state === CoreState.REFUSING) return "bad";
  return "";
}

const ms = (value: number) => (value >= 1000 ? `${(value / 1000).toFixed(1)} s` : `${Math.round(value)} ms`);

/** The Overview's panel: the state, the last answer, the failures and latency of the window. */
export function CoreHealthPanel({ health, now }: { health: CoreHealth | undefined; now: number }) {
  const state = health?.state ?? CoreState.UNSPECIFIED;
  const failures = health ? health.unknown : 0n;
  const lastSuccess = date(health?.lastSuccessTime);
  const lastFailure = date(health?.lastFailureTime);
  return (
    <div class={`core-health ${tone(state)}`} data-testid="core-health" data-state={LABELS[state]}>
      <div class={`figure ${tone(state)}`}>
        <div class="value">{LABELS[state]}</div>
        <div class="label">Core</div>
        <div class="hint">
          {health ? `${health.replicasReaching} of ${health.replicasReporting} replicas reach it` : "no replica reports it"}
        </div>
      </div>
      {health && (
        <dl class="core-facts">
          <dt>Last answer</dt>
          <dd data-testid="core-last-success">{ago(lastSuccess, now)}</dd>
          <dt>Last failure</dt>
          <dd data-testid="core-last-failure">{lastFailure ? `${ago(lastFailure, now)} (${health.lastFailureReason})` : "—"}</dd>
          <dt>Last {health.windowMinutes} min</dt>
          <dd data-testid="core-window">
            {String(health.answered)} answered · {String(health.refused)} refused ·{" "}
            <span class={failures > 0n ? "bad-text" : ""}>{String(failures)} unanswered</span> ·{" "}
            <span class={health.admitsUnavailable > 0n ? "bad-text" : ""} data-testid="core-admits-unavailable">
              {String(health.admitsUnavailable)} {health.admitsUnavailable === 1n ? "admit" : "admits"} turned away
            </span>
          </dd>
          <dt>Latency</dt>
          <dd data-testid="core-latency">
            {health.answered + health.refused > 0n ? `p50 ≤ ${ms(health.latencyP50Ms)} · p99 ≤ ${ms(health.latencyP99Ms)}` : "—"}
          </dd>
        </dl>
      )}
    </div>
  );
}

// The User queue page reads the core's state this often while live.
const CORE_POLL_MS = 5000;

/** Whether the core is unreachable fleet-wide (read from GetOverview every few seconds while `live`). */
export function useCoreUnreachable(live: boolean): boolean {
  const [unreachable, setUnreachable] = useState(false);
  useEffect(() => {
    if (!live) return;
    let current = true;
    const load = () =>
      operator.getOverview({ windowMinutes: 1 }).then(
        (r) => current && setUnreachable(r.overview?.coreHealth?.state === CoreState.UNREACHABLE),
        () => {}, // the live mark tells a refused or unreachable service
      );
    load();
    const timer = setInterval(load, CORE_POLL_MS);
    return () => {
      current = false;
      clearInterval(timer);
    };
  }, [live]);
  return unreachable;
}
