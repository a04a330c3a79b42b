// The pauses of releases in force, in one place (OperatorService.ListReleasePauses): the fleet's
// first, then each paused user's, with since when, by whom, the note, and a Resume button behind
// a confirmation. Shown on the Overview's banner and on Settings & audit.
import { useEffect, useState } from "preact/hooks";

import { date, operator } from "./api.js";
import { Confirmed } from "./dialog.js";
import { dateTime, duration } from "./format.js";
import { useNow } from "./hooks.js";
import { useAction } from "./notice.js";
import { UserText, visibleText } from "./user-text.js";
import type { ReleasePause } from "@acurio/queue-client/gen/acurio/queue/v1/operator_service_pb.js";

// Read again this often while shown (and at once on every change the page knows of).
const PAUSES_POLL_MS = 5000;

/** The pauses in force, read again when `version` changes and every few seconds. */
export function usePauses(version: string, live = true): { pauses: ReleasePause[] | null; total: bigint; reread: () => void } {
  const [pauses, setPauses] = useState<ReleasePause[] | null>(null);
  const [total, setTotal] = useState(0n);
  const [ask, setAsk] = useState(0);
  useEffect(() => {
    if (!live) return;
    let current = true;
    const load = () =>
      operator.listReleasePauses({}).then(
        (r) => {
          if (!current) return;
          setPauses(r.pauses);
          setTotal(r.pausedUsersTotal);
        },
        () => {}, // the live mark tells a refused or unreachable service
      );
    load();
    const timer = setInterval(load, PAUSES_POLL_MS);
    return () => {
      current = false;
      clearInterval(timer);
    };
  }, [version, live, ask]);
  return { pauses, total, reread: () => setAsk((a) => a + 1) };
}

function ResumeButton({ pause, changed }: { pause: ReleasePause; changed: () => void }) {
  const { run, busy } = useAction();
  const whose = pause.userId === "" ? "every user's" : `${visibleText(pause.userId)}'s`;
  return (
    <Confirmed
      label="Resume…"
      title={`Resume ${whose} releases`}
      confirmLabel="Resume"
      testId="pause-row-resume"
      disabled={busy}
      onConfirm={() =>
        run(async () => {
          const r = await operator.setReleasesPaused({ paused: false, userId: pause.userId, note: "" });
          changed();
          return r.change ? `Resumed ${whose} releases` : "Nothing to resume: not paused any more";
        })
      }
    >
      <p>
        Paused since {dateTime(date(pause.pausedSince))} by <UserText class="mono" text={pause.pausedBy} />
        {pause.note && (
          <>
            {" "}
            (“<UserText text={pause.note} />”)
          </>
        )}
        . The held runs are released at once, in their turn and within the capacity.
      </p>
    </Confirmed>
  );
}

/** The pauses in force as a table: whose, since when, by whom, why, and Resume. */
export function PausesTable({ pauses, total, changed }: { pauses: ReleasePause[]; total: bigint; changed: () => void }) {
  const now = useNow();
  const users = pauses.filter((p) => p.userId !== "").length;
  return (
    <>
      <table class="jobs pauses" data-testid="pauses-in-force">
        <thead>
          <tr>
            <th>Whose</th>
            <th>Paused since</th>
            <th>By</th>
            <th>Note</th>
            <th />
          </tr>
        </thead>
        <tbody>
          {pauses.map((pause) => {
            const since = date(pause.pausedSince);
            return (
              <tr data-testid="pause-row" data-user-id={pause.userId}>
                <td>
                  {pause.userId === "" ? (
                    <strong>the whole fleet</strong>
                  ) : (
                    <a href={`#/users/${encodeURIComponent(pause.userId)}`}>
                      <UserText class="mono" text={pause.userId} />
                    </a>
                  )}
                </td>
                <td title={since ? dateTime(since) : undefined}>
                  {dateTime(since)} {since && <span class="muted">({duration(now - since.getTime())} ago)</span>}
                </td>
                <td class="mono" data-testid="pause-row-by">
                  <a href={`#/settings?actor=${encodeURIComponent(pause.pausedBy)}`} title="What this actor did">
                    <UserText text={pause.pausedBy} />
                  </a>
                </td>
                <td data-testid="pause-row-note">{pause.note ? <UserText text={pause.note} /> : <span class="muted">no note</span>}</td>
                <td>
                  <ResumeButton pause={pause} changed={changed} />
                </td>
              </tr>
            );
          })}
        </tbody>
      </table>
      {total > BigInt(users) && (
        <p class="muted">
          {String(total)} users are paused; the {users} paused longest are shown.
        </p>
      )}
    </>
  );
}
