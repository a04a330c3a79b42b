// The credits' audit trail (OperatorService.ListLedgerEntries): every grant, charge and refund,
// newest first, with who moved the credit (actor), why (reason) and, for a grant, the operator's
// note. Shown per job (job detail), per user (User queue) and as its own page with filters (user,
// job, actor).
import { useEffect, useState } from "preact/hooks";

import { date, describeError, operator } from "./api.js";
import { dateTime, shortId } from "./format.js";
import { go, useDraft, useQueryRead } from "./hooks.js";
import { useNotice } from "./notice.js";
import { UserText, visibleText } from "./user-text.js";
import { type LedgerEntry, LedgerEntryKind } from "@acurio/queue-client/gen/acurio/queue/v1/operator_service_pb.js";

const KIND_LABELS: Record<LedgerEntryKind, string> = {
  [LedgerEntryKind.UNSPECIFIED]: "—",
  [LedgerEntryKind.GRANT]: "grant",
  [LedgerEntryKind.CHARGE]: "charge",
  [LedgerEntryKind.REFUND]: "refund",
};

/** An admit charged with an operator as its actor is a retry (operators never call Admit: their
 * charges come from RetryJob and RetryJobs), so it reads as one. */
function isRetryCharge(entry: LedgerEntry): boolean {
  return entry.kind === LedgerEntryKind.CHARGE && entry.reason === "admit" && entry.actor.startsWith("operator:");
}

function reasonLabel(entry: LedgerEntry): string {
  return isRetryCharge(entry) ? "retry" : entry.reason;
}

function reasonTitle(entry: LedgerEntry): string | undefined {
  return isRetryCharge(entry) ? "an operator's retry: the job admitted again, charged as an admit (reason admit)" : undefined;
}

/** A page of entries for a filter; read again when `version` changes (a grant, a cancel).
 * `inline`: a panel of another page (the job detail, the User queue) shows a refusal in its own
 * place (`refusal`), not as the page's notice: the web role may watch a queue but not read the
 * ledger, and that refusal must not stand for the page's own actions. */
export function useLedger(userId: string, jobId: string, version: unknown, pageSize = 20, pageToken = "", inline = false, actor = "") {
  const notice = useNotice();
  // Kept with the filter it answers (`useQueryRead`): a changed filter shows "Loading…", not the
  // previous filter's rows; a re-read of the same filter (`version`) keeps its rows until it lands.
  const page = useQueryRead(
    JSON.stringify([userId, jobId, actor, pageSize, pageToken]),
    () => operator.listLedgerEntries({ userId, jobId, actor, pageSize, pageToken }),
    version,
    inline ? undefined : (error) => notice.error(error),
  );
  if (!page.answered) return { entries: null, next: "", refusal: "", failed: false };
  if (page.failed) return { entries: null, next: "", refusal: inline ? describeError(page.error) : "", failed: true };
  return { entries: page.value.entries, next: page.value.nextPageToken, refusal: "", failed: false };
}

/** Where a panel's ledger is: loading, refused (said in place), or its table. */
export function LedgerPanel({ entries, refusal, showUser, showJob }: { entries: LedgerEntry[] | null; refusal: string; showUser?: boolean; showJob?: boolean }) {
  if (refusal !== "") return <p class="muted" data-testid="ledger-refused">The ledger is not shown: {refusal}</p>;
  if (entries === null) return <p class="muted">Loading…</p>;
  return <LedgerTable entries={entries} showUser={showUser} showJob={showJob} />;
}

export function LedgerTable({ entries, showUser = true, showJob = true }: { entries: LedgerEntry[]; showUser?: boolean; showJob?: boolean }) {
  if (entries.length === 0) return <p class="muted">No credit moved yet.</p>;
  return (
    <table class="jobs ledger" data-testid="ledger">
      <thead>
        <tr>
          <th>When</th>
          {showUser && <th>User</th>}
          <th>Kind</th>
          <th class="num">Credits</th>
          {showJob && <th>Job</th>}
          <th>Actor</th>
          <th>Reason</th>
        </tr>
      </thead>
      <tbody>
        {entries.map((entry) => (
          <tr data-testid="ledger-row" data-kind={KIND_LABELS[entry.kind]}>
            <td>{dateTime(date(entry.createTime))}</td>
            {showUser && (
              <td>
                <a href={`#/users/${encodeURIComponent(entry.userId)}`}>
                  <UserText text={entry.userId} />
                </a>
              </td>
            )}
            <td>
              <span class={`badge ${KIND_LABELS[entry.kind]}`}>{KIND_LABELS[entry.kind]}</span>
            </td>
            <td class={`num ${entry.amount < 0n ? "minus" : "plus"}`}>{entry.amount > 0n ? `+${entry.amount}` : String(entry.amount)}</td>
            {showJob && (
              <td>
                {entry.jobId ? (
                  <a class="mono" href={`#/jobs/${entry.jobId}`}>
                    {shortId(entry.jobId)}
                  </a>
                ) : (
                  <span class="muted mono grant-key" title={`the grant's idempotency key: ${visibleText(entry.idempotencyKey)}`}>
                    <UserText text={entry.idempotencyKey} />
                  </span>
                )}
              </td>
            )}
            <td class="mono" data-testid="ledger-actor">
              <a href={`#/ledger?actor=${encodeURIComponent(entry.actor)}`} title="This actor's entries">
                <UserText text={entry.actor} />
              </a>
            </td>
            <td data-testid="ledger-reason" title={reasonTitle(entry)}>
              {reasonLabel(entry)}
              {entry.note && (
                <span class="note" data-testid="ledger-note">
                  {" "}
                  · “<UserText text={entry.note} />”
                </span>
              )}
            </td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

/** `#/ledger?user=…&job=…&actor=…`: the trail with filters, page by page. */
export function LedgerPage({ params }: { params: URLSearchParams }) {
  const userId = params.get("user") ?? "";
  const jobId = params.get("job") ?? "";
  const actor = params.get("actor") ?? "";
  const [userIdDraft, setUserIdDraft] = useDraft(userId);
  const [jobIdDraft, setJobIdDraft] = useDraft(jobId);
  const [actorDraft, setActorDraft] = useDraft(actor);
  const [tokens, setTokens] = useState<string[]>([""]);
  const key = params.toString();
  useEffect(() => setTokens([""]), [key]);
  const { entries, next, failed } = useLedger(userId, jobId, 0, 50, tokens[tokens.length - 1], false, actor);
  const update = (name: string, value: string) => {
    const changed = new URLSearchParams(params);
    if (value.trim() === "") changed.delete(name);
    else changed.set(name, value.trim());
    go(`ledger?${changed.toString()}`);
  };
  return (
    <section class="page" data-testid="ledger-page">
      <h1>Credits ledger</h1>
      <p class="muted">Every grant, charge and refund, newest first: who moved the credit and why. Click an actor to see only theirs.</p>
      <form class="filters" onSubmit={(e) => e.preventDefault()}>
        <label>
          User
          <input
            data-search
            name="user"
            placeholder="user id  (press /)"
            value={userIdDraft}
            onInput={(e) => setUserIdDraft(e.currentTarget.value)}
            onChange={(e) => update("user", e.currentTarget.value)}
            onKeyDown={(e) => e.key === "Enter" && update("user", e.currentTarget.value)}
          />
        </label>
        <label>
          Job
          <input
            name="job"
            placeholder="job id"
            value={jobIdDraft}
            onInput={(e) => setJobIdDraft(e.currentTarget.value)}
            onChange={(e) => update("job", e.currentTarget.value)}
            onKeyDown={(e) => e.key === "Enter" && update("job", e.currentTarget.value)}
          />
        </label>
        <label>
          Actor
          <input
            name="actor"
            placeholder="operator:alice, system:…"
            value={actorDraft}
            onInput={(e) => setActorDraft(e.currentTarget.value)}
            onChange={(e) => update("actor", e.currentTarget.value)}
            onKeyDown={(e) => e.key === "Enter" && update("actor", e.currentTarget.value)}
          />
        </label>
      </form>
      {failed ? (
        <p class="muted" data-testid="ledger-refused">No entry is shown: the service refused this filter (the notice above says why).</p>
      ) : entries === null ? (
        <p class="muted">Loading…</p>
      ) : (
        <LedgerTable entries={entries} />
      )}
      <div class="pager">
        <button disabled={tokens.length === 1} onClick={() => setTokens([""])}>
          First page
        </button>
        <button disabled={next === ""} onClick={() => setTokens([...tokens, next])}>
          Next page
        </button>
      </div>
    </section>
  );
}
