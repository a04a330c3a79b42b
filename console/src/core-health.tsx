// The core's health as the replicas read it (Overview.core_health): the Overview's panel, and
// what the User queue page says of runs and starts while the core is unreachable.
import { useEffect, useState } from "preact/hooks";

import { date, operator } from "./api.js";
import { ago } from "./format.js";
import { type CoreHealth, type CoreMethodHealth, CoreState } from "@acurio/queue-client/gen/acurio/queue/v1/operator_service_pb.js";

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

/** "ReleaseRun: 12 unanswered in 5 min — UNAVAILABLE, 3 s ago": which call fails, how often, why. */
function failingCall(calls: CoreMethodHealth, windowMinutes: number, now: number): string {
  const counts = [
    calls.refused > 0n ? `${String(calls.refused)} refused` : "",
    calls.unknown > 0n ? `${String(calls.unknown)} unanswered` : "",
  ].filter(Boolean);
  const at = date(calls.lastFailureTime);
  const why = calls.lastFailureReason ? ` — ${calls.lastFailureReason}${at ? `, ${ago(at, now)}` : ""}` : "";
  return `${calls.method}: ${counts.join(" · ")} in ${windowMinutes} min${why}`;
}

/** The Overview's panel: the state, the last answer, the failures and latency of the window, and
 * when the core is not healthy, the calls that fail by method. */
export function CoreHealthPanel({ health, now }: { health: CoreHealth | undefined; now: number }) {
  const state = health?.state ?? CoreState.UNSPECIFIED;
  const failures = health ? health.unknown : 0n;
  const lastSuccess = date(health?.lastSuccessTime);
  const lastFailure = date(health?.lastFailureTime);
  const failing =
    health && state !== CoreState.HEALTHY ? health.methods.filter((calls) => calls.refused + calls.unknown > 0n) : [];
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
          {failing.length > 0 && (
            <>
              <dt>Failing calls</dt>
              <dd data-testid="core-failing-calls">
                <ul class="core-failing-calls">
                  {failing.map((calls) => (
                    <li key={calls.method} data-testid="core-failing-call" data-method={calls.method} class="bad-text">
                      {failingCall(calls, health.windowMinutes, now)}
                    </li>
                  ))}
                </ul>
              </dd>
            </>
          )}
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
