// The audit timeline (OperatorService.ListAuditEvents): what people did, newest first, in one
// list: setting changes (capacity, users' limits, pauses and resumes), grants, cancels, retries,
// promotions, releases and checks with the core, filterable by actor and by user
// (`#/settings?actor=operator:alice&user=u-1`; a click on an actor or a user filters by it).
import { useEffect, useState } from "preact/hooks";

import { date, operator } from "./api.js";
import { dateTime, shortId } from "./format.js";
import { go, useQueryRead } from "./hooks.js";
import { useNotice } from "./notice.js";
import { UserText } from "./user-text.js";
import type { AuditEvent } from "@acurio/queue-client/gen/acurio/queue/v1/operator_service_pb.js";

const KIND_LABELS: Record<string, string> = {
  capacity: "core capacity",
  user_limit: "user's limit",
  pause: "releases paused",
  resume: "releases resumed",
  grant: "credits granted",
  cancel: "job canceled",
  retry: "job retried",
  promote: "promote",
  release: "release now",
  check_with_core: "checked with the core",
};

function JobLink({ jobId }: { jobId: string }) {
  return (
    <a class="mono" href={`#/jobs/${jobId}`}>
      {shortId(jobId)}
    </a>
  );
}

/** What the event did, in words. */
function What({ event }: { event: AuditEvent }) {
  const value = (v: bigint) => (v === 0n ? (event.kind === "capacity" ? "unlimited" : "default") : String(v));
  switch (event.kind) {
    case "capacity":
    case "user_limit":
      return (
        <>
          {value(event.oldValue)} → {value(event.newValue)}
        </>
      );
    case "pause":
      return <>released → paused</>;
    case "resume":
      return <>paused → released</>;
    case "grant":
      return <>+{String(event.amount)} credits</>;
    case "retry":
      return (
        <>
          <JobLink jobId={event.retryOfJobId} /> admitted again as <JobLink jobId={event.jobId} />
        </>
      );
    default:
      return (
        <>
          {event.jobId && (
            <>
              job <JobLink jobId={event.jobId} />
              {event.outcome && " · "}
            </>
          )}
          {event.outcome && <UserText text={event.outcome} />}
        </>
      );
  }
}

export function AuditTimeline({ params, version, base = "settings" }: { params: URLSearchParams; version: unknown; base?: string }) {
  const actor = params.get("actor") ?? "";
  const user = params.get("user") ?? "";
  const [actorField, setActorField] = useState(actor);
  const [userField, setUserField] = useState(user);
  const [tokens, setTokens] = useState<string[]>([""]);
  const notice = useNotice();
  // The fields follow the route (a click on an actor, the back button).
  useEffect(() => {
    setActorField(actor);
    setUserField(user);
    setTokens([""]);
  }, [actor, user]);
  const pageToken = tokens[tokens.length - 1];
  const page = useQueryRead(
    JSON.stringify([actor, user, pageToken]),
    () => operator.listAuditEvents({ actor, userId: user, pageSize: 25, pageToken }),
    version,
    (error) => notice.error(error),
  );
  const filterBy = (nextActor: string, nextUser: string) => {
    const query = new URLSearchParams();
    if (nextActor) query.set("actor", nextActor);
    if (nextUser) query.set("user", nextUser);
    const text = query.toString();
    go(text ? `${base}?${text}` : base);
  };
  const events = page.answered && !page.failed ? page.value.events : null;
  const next = page.answered && !page.failed ? page.value.nextPageToken : "";
  return (
    <section class="settings-block" data-testid="audit-timeline">
      <h2>Audit timeline</h2>
      <p class="muted">
        Settings, pauses, capacity, grants, cancels, retries, promotions, releases and checks with the core, newest first. A click on an actor or a user shows
        only theirs.
      </p>
      <form
        class="filters"
        onSubmit={(e) => {
          e.preventDefault();
          filterBy(actorField.trim(), userField.trim());
        }}
      >
        <label>
          Actor{" "}
          <input name="audit-actor" autoComplete="off" placeholder="operator:alice" value={actorField} onInput={(e) => setActorField(e.currentTarget.value)} />
        </label>
        <label>
          User{" "}
          <input name="audit-user" autoComplete="off" placeholder="user id" value={userField} onInput={(e) => setUserField(e.currentTarget.value)} />
        </label>
        <button type="submit">Filter</button>
        {(actor || user) && (
          <button type="button" onClick={() => filterBy("", "")}>
            Everyone
          </button>
        )}
      </form>
      {events === null ? (
        <p class="muted">{page.answered ? "The timeline is not shown (see the notice above)." : "Loading…"}</p>
      ) : events.length === 0 ? (
        <p class="muted">Nothing recorded{actor || user ? " for this filter" : " yet"}.</p>
      ) : (
        <table class="jobs audit" data-testid="audit-events">
          <thead>
            <tr>
              <th>When</th>
              <th>What</th>
              <th>Whose</th>
              <th>Detail</th>
              <th>Actor</th>
              <th>Note</th>
            </tr>
          </thead>
          <tbody>
            {events.map((event) => (
              <tr data-testid="audit-event" data-kind={event.kind}>
                <td>{dateTime(date(event.createTime))}</td>
                <td>{KIND_LABELS[event.kind] ?? event.kind}</td>
                <td>
                  {event.userId ? (
                    <a href="#" onClick={(e) => (e.preventDefault(), filterBy(actor, event.userId))} title="Only what concerns this user" data-testid="audit-event-user">
                      <UserText class="mono" text={event.userId} />
                    </a>
                  ) : (
                    <span class="muted">fleet</span>
                  )}
                </td>
                <td>
                  <What event={event} />
                </td>
                <td class="mono" data-testid="audit-event-actor">
                  <a href="#" onClick={(e) => (e.preventDefault(), filterBy(event.actor, user))} title="Only what this actor did">
                    <UserText text={event.actor} />
                  </a>{" "}
                  <a href={`#/ledger?actor=${encodeURIComponent(event.actor)}`} class="muted" title="This actor's ledger entries">
                    ledger
                  </a>
                </td>
                <td>{event.note && <UserText text={event.note} />}</td>
              </tr>
            ))}
          </tbody>
        </table>
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
