// Settings & audit: the fleet settings an operator changes at run time, each behind a
// confirmation, the pauses in force (OperatorService.ListReleasePauses), and who did what (the
// audit timeline, OperatorService.ListAuditEvents). The core's capacity
// (set a limit, or remove it: capacity 0 is no stop), the pause of releases, fleet-wide or for
// one user (admits go on; nothing is released to the core while paused), listed in force, and
// who did what.
import { useEffect, useState } from "preact/hooks";

import { date, operator } from "./api.js";
import { Confirmed } from "./dialog.js";
import { dateTime } from "./format.js";
import { useAction } from "./notice.js";
import { AuditTimeline } from "./audit.js";
import { PausesTable, usePauses } from "./pauses.js";
import { UserText } from "./user-text.js";
import type { Overview } from "@acurio/queue-client/gen/acurio/queue/v1/operator_service_pb.js";

function Capacity({ overview, changed }: { overview: Overview; changed: () => void }) {
  const [value, setValue] = useState("");
  const { run, busy } = useAction();
  const limit = Number(value);
  const valid = value.trim() !== "" && Number.isInteger(limit) && limit >= 1 && limit <= 1_000_000;
  return (
    <section class="settings-block" data-testid="settings-capacity">
      <h2>Core capacity</h2>
      <p>
        Now: <strong data-testid="capacity-now">{overview.capacityLimit > 0n ? `${overview.capacityLimit} runs at once` : "unlimited"}</strong>, {String(overview.capacityInUse)} in use
        {overview.capacityWaitingJobs > 0n && `, ${overview.capacityWaitingJobs} waiting`}. A limit of 0 would stop nothing: to stop releases, pause them below.
      </p>
      <div class="toolbar">
        <label>
          New limit{" "}
          <input name="capacity" inputMode="numeric" autoComplete="off" value={value} onInput={(e) => setValue(e.currentTarget.value)} placeholder="1 – 1000000" />
        </label>
        <Confirmed
          label="Set limit…"
          title="Set the core's capacity"
          confirmLabel={`Set ${value}`}
          testId="capacity-set"
          disabled={busy || !valid}
          onConfirm={() =>
            run(async () => {
              await operator.setCoreCapacity({ capacity: limit });
              changed();
              return `The core's capacity is now ${limit}`;
            })
          }
        >
          <p>
            At most <strong>{value}</strong> first-pass runs at the core at once, across every replica. Runs already released are not stopped: a lower limit is reached as
            they end.
          </p>
        </Confirmed>
        <Confirmed
          label="Remove limit…"
          title="Remove the core's capacity limit"
          confirmLabel="Remove the limit"
          testId="capacity-unlimited"
          danger
          disabled={busy || overview.capacityLimit === 0n}
          onConfirm={() =>
            run(async () => {
              await operator.setCoreCapacity({ capacity: 0, unlimited: true });
              changed();
              return "The core's capacity is unlimited";
            })
          }
        >
          <p>Every waiting run is released at once: nothing limits how many judge at the core. This does not stop anything.</p>
        </Confirmed>
      </div>
    </section>
  );
}

function PauseButton({ userId, paused, changed }: { userId: string; paused: boolean; changed: () => void }) {
  const [note, setNote] = useState("");
  const { run, busy } = useAction();
  const whose = userId === "" ? "every user's" : `${userId}'s`;
  return (
    <Confirmed
      label={paused ? "Resume releases…" : "Pause releases…"}
      title={paused ? `Resume ${whose} releases` : `Pause ${whose} releases`}
      confirmLabel={paused ? "Resume" : "Pause"}
      testId={`${paused ? "resume" : "pause"}-${userId === "" ? "fleet" : "user"}`}
      danger={!paused}
      disabled={busy}
      onConfirm={() =>
        run(async () => {
          const r = await operator.setReleasesPaused({ paused: !paused, userId, note });
          setNote("");
          changed();
          if (!r.change) return paused ? "Nothing to resume: not paused" : "Already paused";
          return paused ? `Resumed ${whose} releases` : `Paused ${whose} releases`;
        })
      }
    >
      <p>
        {paused
          ? `The held runs are released at once, in their turn and within the capacity.`
          : `No held run of ${userId === "" ? "any user" : "this user"} is released to the core until resumed. Admits are still accepted, charged and queued; runs already at the core go on.`}
      </p>
      <label class="confirm-typed">
        Note (recorded with the change)
        <input name="note" maxLength={512} value={note} onInput={(e) => setNote(e.currentTarget.value)} data-testid="pause-note" />
      </label>
    </Confirmed>
  );
}

function Pauses({ overview, changed }: { overview: Overview; changed: () => void }) {
  const [userId, setUserId] = useState("");
  const [userPaused, setUserPaused] = useState<boolean | null>(null);
  const since = date(overview.releasesPausedSince);
  const [version, setVersion] = useState(0);
  useEffect(() => {
    let current = true;
    setUserPaused(null);
    if (userId.trim() === "") return;
    const timer = setTimeout(
      () =>
        operator.getUserSettings({ userId: userId.trim() }).then(
          (s) => current && setUserPaused(s.releasesPaused),
          () => current && setUserPaused(null),
        ),
      250,
    );
    return () => {
      current = false;
      clearTimeout(timer);
    };
  }, [userId, version]);
  const userChanged = () => {
    setVersion((v) => v + 1);
    changed();
  };
  // Every pause in force, in one place: whose, since when, by whom, why, and Resume.
  const { pauses, total } = usePauses(`${version} ${overview.releasesPaused} ${overview.pausedUsers} ${date(overview.releasesPausedSince)?.getTime()}`);
  return (
    <section class="settings-block" data-testid="settings-pause">
      <h2>Releases</h2>
      <p data-testid="fleet-pause-state">
        {overview.releasesPaused ? (
          <>
            <strong class="warn-text">Paused fleet-wide</strong> since {dateTime(since)} by <UserText class="mono" text={overview.releasesPausedBy} />
            {overview.releasesPausedNote && (
              <>
                {" "}
                · “<UserText text={overview.releasesPausedNote} />”
              </>
            )}
          </>
        ) : (
          "Released as they come (no fleet-wide pause)."
        )}{" "}
        {overview.pausedUsers > 0n && `${overview.pausedUsers} ${overview.pausedUsers === 1n ? "user is" : "users are"} paused on their own.`}
      </p>
      {pauses !== null && pauses.length > 0 && <PausesTable pauses={pauses} total={total} changed={userChanged} />}
      <div class="toolbar">
        <PauseButton userId="" paused={overview.releasesPaused} changed={changed} />
      </div>
      <div class="toolbar">
        <label>
          One user{" "}
          <input name="pause-user" autoComplete="off" placeholder="user id" value={userId} onInput={(e) => setUserId(e.currentTarget.value)} />
        </label>
        {userId.trim() !== "" && userPaused !== null && (
          <>
            <span data-testid="user-pause-state">{userPaused ? "paused" : "not paused"}</span>
            <PauseButton userId={userId.trim()} paused={userPaused} changed={userChanged} />
          </>
        )}
      </div>
    </section>
  );
}

/** `#/settings`: the pauses in force, the capacity, and the audit timeline (`?actor=`, `?user=`). */
export function SettingsPage({ params }: { params: URLSearchParams }) {
  const [overview, setOverview] = useState<Overview | null>(null);
  const [version, setVersion] = useState(0);
  const { run } = useAction();
  useEffect(() => {
    void run(async () => {
      const r = await operator.getOverview({ windowMinutes: 15 });
      if (r.overview) setOverview(r.overview);
    });
  }, [version]);
  const changed = () => setVersion((v) => v + 1);
  return (
    <section class="page" data-testid="settings-page">
      <h1>Settings &amp; audit</h1>
      <p class="muted">
        Fleet settings take effect on every replica at once and each change is recorded with who made it. The credits' trail is on the <a href="#/ledger">Ledger</a>.
      </p>
      {overview === null ? (
        <p class="muted">Loading…</p>
      ) : (
        <>
          <Pauses overview={overview} changed={changed} />
          <Capacity overview={overview} changed={changed} />
        </>
      )}
      <AuditTimeline params={params} version={version} />
    </section>
  );
}
