// Which replicas serve, what each is doing (calls in flight, open streams), and the core's health
// as each replica saw it since it started (OperatorService.ListReplicas: a heartbeat row per
// replica, rewritten every 5 seconds). A replica not heard from for three heartbeats stopped
// without saying so (a crash, a killed pod): it is marked, and it leaves the list after an hour.
import { useEffect, useState } from "preact/hooks";

import { date, operator } from "./api.js";
import { ago, spoken } from "./format.js";
import { useNow } from "./hooks.js";
import { useNotice } from "./notice.js";
import { UserText, visibleText } from "./user-text.js";
import type { Replica } from "@acurio/queue-client/gen/acurio/queue/v1/operator_service_pb.js";

const POLL_MS = 5000;
// Three missed heartbeats (each 5 s): the replica is not answering for itself any more.
const SILENT_MS = 15_000;

export function ReplicasPage({ live }: { live: boolean }) {
  const [replicas, setReplicas] = useState<Replica[] | null>(null);
  const [readAt, setReadAt] = useState<Date | undefined>(undefined);
  const notice = useNotice();
  const now = useNow();
  useEffect(() => {
    if (!live) return;
    let current = true;
    const load = () =>
      operator.listReplicas({}).then(
        (r) => {
          if (!current) return;
          setReplicas(r.replicas);
          setReadAt(date(r.readTime));
        },
        (error) => current && notice.error(error),
      );
    load();
    const timer = setInterval(load, POLL_MS);
    return () => {
      current = false;
      clearInterval(timer);
    };
  }, [live]);
  if (replicas === null) return <section class="page"><p class="muted">Loading the replicas…</p></section>;
  // Ages against the database's clock at the read, carried forward by the browser's.
  const skew = readAt ? Date.now() - readAt.getTime() : 0;
  const silent = (r: Replica) => now - skew - (date(r.heartbeatTime)?.getTime() ?? 0) > SILENT_MS;
  const serving = replicas.filter((r) => !silent(r) && !r.draining);
  const sum = (pick: (r: Replica) => bigint) => replicas.filter((r) => !silent(r)).reduce((total, r) => total + pick(r), 0n);
  const unknown = sum((r) => r.coreCalls?.unknown ?? 0n);
  return (
    <section class="page" data-testid="replicas">
      <h1>Replicas and the core</h1>
      <div class="figures small">
        <div class={`figure ${serving.length === 0 ? "bad" : ""}`} data-testid="figure-serving">
          <div class="value">{serving.length}</div>
          <div class="label">Serving</div>
          <div class="hint">
            {replicas.length - serving.length > 0 ? `${replicas.length - serving.length} draining or silent` : "every replica heard from"}
          </div>
        </div>
        <div class="figure ok" data-testid="figure-core-answered">
          <div class="value">{String(sum((r) => r.coreCalls?.answered ?? 0n))}</div>
          <div class="label">Core answered</div>
          <div class="hint">since each replica started</div>
        </div>
        <div class="figure" data-testid="figure-core-refused">
          <div class="value">{String(sum((r) => r.coreCalls?.refused ?? 0n))}</div>
          <div class="label">Core refused</div>
          <div class="hint">admits rejected, budget or capacity</div>
        </div>
        <div class={`figure ${unknown > 0n ? "warn" : ""}`} data-testid="figure-core-unknown">
          <div class="value">{String(unknown)}</div>
          <div class="label">Unknown outcomes</div>
          <div class="hint">no answer: maybe applied</div>
        </div>
      </div>
      <h2>Replicas</h2>
      <table class="jobs" data-testid="replica-table">
        <thead>
          <tr>
            <th>Replica</th>
            <th>State</th>
            <th>Up for</th>
            <th>Last heard</th>
            <th class="num">Calls in flight</th>
            <th class="num">Job streams</th>
            <th class="num">Overview streams</th>
            <th class="num">Core answered</th>
            <th class="num">refused</th>
            <th class="num">unknown</th>
          </tr>
        </thead>
        <tbody>
          {replicas.map((r) => {
            const state = silent(r) ? "silent" : r.draining ? "draining" : "serving";
            const lastUnknown = date(r.coreCalls?.lastUnknownTime);
            return (
              <tr data-testid="replica-row" data-replica-id={r.replicaId} data-state={state}>
                <td class="mono" title={visibleText(r.replicaId)}>
                  <UserText text={r.replicaId} />
                </td>
                <td>
                  <span class={`badge ${state === "serving" ? "running" : state === "draining" ? "pending" : "failed"}`}>{state}</span>
                </td>
                <td>{spoken(now - skew - (date(r.startTime)?.getTime() ?? 0))}</td>
                <td>{ago(date(r.heartbeatTime), now - skew)}</td>
                <td class="num">{r.callsInFlight}</td>
                <td class="num">{r.watchStreams}</td>
                <td class="num">{r.overviewStreams}</td>
                <td class="num">{String(r.coreCalls?.answered ?? 0n)}</td>
                <td class="num">{String(r.coreCalls?.refused ?? 0n)}</td>
                <td class={`num ${(r.coreCalls?.unknown ?? 0n) > 0n ? "warn-text" : ""}`} title={lastUnknown ? `last ${ago(lastUnknown, now - skew)}` : undefined}>
                  {String(r.coreCalls?.unknown ?? 0n)}
                </td>
              </tr>
            );
          })}
        </tbody>
      </table>
      {replicas.length === 0 && <p class="muted">No replica has reported yet.</p>}
      <p class="muted">
        Each replica reports every 5 seconds and leaves the list when it stops cleanly; one silent for 15 seconds stopped without saying so.
        The core's figures count this replica's calls since it started: an unknown outcome is a call that got no answer and may have been applied.
      </p>
    </section>
  );
}
