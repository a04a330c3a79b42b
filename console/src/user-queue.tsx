import { useEffect, useRef, useState } from "preact/hooks";

import { credits, date, describeError, operator, queue } from "./api.js";
import { useCoreUnreachable } from "./core-health.js";
import { ACTIVE, clock, dateTime, duration, ordinal, shortId, STATUS_LABELS } from "./format.js";
import { go, useNow, useQueryRead } from "./hooks.js";
import { Modal } from "./dialog.js";
import { useAction } from "./notice.js";
import { useLiveStream } from "./stream.js";
import { CancelJobButton, CheckWithCoreButton, StatusBadge } from "./jobs.js";
import { LedgerPanel, useLedger } from "./ledger.js";
import { UserText, visibleText } from "./user-text.js";
import { type Job, JobStatus } from "@acurio/queue-client/gen/acurio/queue/v1/job_pb.js";
import type { GetUserSettingsResponse, UserWork } from "@acurio/queue-client/gen/acurio/queue/v1/operator_service_pb.js";

/** Why no start can be promised now ("" when one can): the service then sends no estimate. */
type Held = "" | "core" | "paused" | "fleet-paused";

function Countdown({ at, now, held }: { at: Date | undefined; now: number; held: Held }) {
  if (held === "core") return <span class="bad-text" data-testid="no-start-promised">no start expected while the core is unreachable</span>;
  if (held !== "" && at === undefined) {
    const whose = held === "paused" ? "her releases are paused" : "releases are paused fleet-wide";
    return <span class="warn-text" data-testid="no-start-paused">no start expected while {whose}</span>;
  }
  if (at === undefined) return <span class="muted">no estimate yet</span>;
  const left = at.getTime() - now;
  return <span title={`estimated at ${clock(at)}`}>{left > 0 ? `starts in ~${duration(left)}` : "starting any moment"}</span>;
}

function UserPicker({ userId }: { userId: string }) {
  const [value, setValue] = useState(userId);
  // The field follows the route: another user's queue (a link, the back button) shows her id.
  useEffect(() => setValue(userId), [userId]);
  return (
    <form
      class="filters"
      onSubmit={(e) => {
        e.preventDefault();
        if (value.trim()) go(`users/${encodeURIComponent(value.trim())}`);
      }}
    >
      <label>
        User
        <input data-search name="user" placeholder="user id  (press /)" value={value} onInput={(e) => setValue(e.currentTarget.value)} />
      </label>
      <button type="submit">Watch</button>
    </form>
  );
}

/** The user's settings in force (GetUserSettings), read again when `version` changes (every
 * change of her queue): kept with the user they answer, and never thrown away by the next re-read
 * (`useQueryRead`). */
function useUserSettings(userId: string, version: number) {
  const read = useQueryRead(userId, () => (userId === "" ? Promise.resolve(null) : operator.getUserSettings({ userId })), version);
  if (!read.answered) return { settings: null, refusal: "" };
  if (read.failed) return { settings: null, refusal: describeError(read.error) };
  return { settings: read.value, refusal: "" };
}

/** The user's settings in force: her limit (her own or the default) and whether her releases
 * are paused (her own pause, the fleet's). Changed on Settings & audit. */
function UserSettingsLine({ settings, refusal }: { settings: GetUserSettingsResponse | null; refusal: string }) {
  if (refusal !== "") return <p class="muted" data-testid="user-settings">Her settings are not shown: {refusal}</p>;
  if (settings === null) return null;
  return (
    <p data-testid="user-settings">
      <span data-testid="user-limit">
        At most <strong>{settings.maxActive}</strong> active at once ({settings.maxActiveIsDefault ? "the service's default" : "her own limit"})
      </span>
      {" · "}
      {settings.releasesPaused ? (
        <span class="warn-text" data-testid="user-paused">
          releases paused since {dateTime(date(settings.releasesPausedSince))} by <UserText class="mono" text={settings.releasesPausedBy} />
          {settings.releasesPausedNote && (
            <>
              {" "}
              · “<UserText text={settings.releasesPausedNote} />”
            </>
          )}
        </span>
      ) : settings.fleetReleasesPaused ? (
        <span class="warn-text" data-testid="user-paused">releases paused fleet-wide</span>
      ) : (
        <span class="muted">releases not paused</span>
      )}{" "}
      <a href="#/settings">Settings &amp; audit</a>
    </p>
  );
}

// The user's active jobs are read again this often for what changes with time alone (an overdue run).
const MARKS_REREAD_MS = 5000;

// Grants and admits made elsewhere (another console, the web backend, grpcurl) move the balance
// too: it is read again on every change of the user's queue and every few seconds while live.
const BALANCE_POLL_MS = 2000;

function Credits({ userId, version, live, onGranted }: { userId: string; version: number; live: boolean; onGranted: () => void }) {
  const [balance, setBalance] = useState<bigint | null>(null);
  const [amount, setAmount] = useState("5");
  const [note, setNote] = useState("");
  const [confirming, setConfirming] = useState(false);
  const opener = useRef<HTMLButtonElement>(null);
  const { run, busy } = useAction();
  const valid = /^\d+$/.test(amount.trim()) && Number(amount) >= 1 && Number(amount) <= 1_000_000;
  useEffect(() => setBalance(null), [userId]);
  useEffect(() => {
    let current = true;
    const load = () =>
      credits.getBalance({ userId }).then(
        (r) => current && setBalance(r.balance),
        () => current && setBalance(null),
      );
    load();
    const timer = live ? setInterval(load, BALANCE_POLL_MS) : undefined;
    return () => {
      current = false;
      clearInterval(timer);
    };
  }, [userId, version, live]);
  const grant = () =>
    run(async () => {
      const r = await credits.grantCredits({ userId, amount: BigInt(amount), idempotencyKey: `console-${crypto.randomUUID()}`, note: note.trim() });
      setBalance(r.balance);
      setNote("");
      onGranted();
      return `Granted ${amount} credits to ${userId}: balance ${r.balance}`;
    });
  return (
    <form
      class="credits"
      onSubmit={(e) => {
        // Money moves only from the dialog's own button (Enter in a field opens it, never grants).
        e.preventDefault();
        if (valid) setConfirming(true);
      }}
    >
      {confirming && (
        <Modal role="alertdialog" label="Confirm the grant" onClose={() => setConfirming(false)} returnTo={opener}>
          <div>
            <p data-testid="grant-question">
              Grant <strong>{amount}</strong> credit{amount === "1" ? "" : "s"} to <UserText class="mono" text={userId} />
              {note.trim() ? (
                <>
                  {" "}
                  (“<UserText text={note.trim()} />”)
                </>
              ) : (
                " (no reason given)"
              )}
              ?
            </p>
            <div class="actions">
              <button type="button" onClick={() => setConfirming(false)} data-autofocus>
                Keep it <kbd>Esc</kbd>
              </button>
              <button
                type="button"
                class="primary"
                data-testid="grant-confirm"
                onClick={() => {
                  setConfirming(false);
                  void grant();
                }}
              >
                Grant {amount}
              </button>
            </div>
          </div>
        </Modal>
      )}
      <span data-testid="balance">Balance: {balance === null ? "—" : String(balance)}</span>
      <input type="number" min="1" max="1000000" value={amount} onInput={(e) => setAmount(e.currentTarget.value)} aria-label="Credits to grant" />
      <input
        class="note-input"
        maxLength={512}
        value={note}
        onInput={(e) => setNote(e.currentTarget.value)}
        placeholder="why (kept in the ledger)"
        aria-label="Reason for the grant"
        data-testid="grant-note"
      />
      <button type="submit" disabled={busy || !valid} ref={opener}>
        Grant credits…
      </button>
    </form>
  );
}

/** The active job a queued job ultimately waits for (following "waiting for" through the queue). */
function headOf(job: Job, jobs: Map<string, Job>): Job | undefined {
  const seen = new Set<string>();
  let at: Job | undefined = job;
  while (at !== undefined && at.status === JobStatus.QUEUED && !seen.has(at.jobId)) {
    seen.add(at.jobId);
    at = jobs.get(at.waitingForJobId);
  }
  return at === job ? undefined : at;
}

/** When a queued job should start: the estimate, unless it waits behind a release being retried
 * (then it may wait up to the release window, whatever the estimate says). */
function StartsWhen({ job, jobs, now, held }: { job: Job; jobs: Map<string, Job>; now: number; held: Held }) {
  // The core unreachable is the cause behind every other reason below (a run nobody can confirm,
  // a release that cannot land): it is named first, as the running row names it first.
  if (held === "core") return <Countdown at={undefined} now={now} held={held} />;
  const head = headOf(job, jobs);
  if (job.behindOverdueRun || (head !== undefined && head.runOverdue)) {
    // A run far longer than usual ahead: no countdown, since nothing confirms it will end.
    return (
      <span class="warn-text" data-testid="behind-overdue-run">
        no start expected: {head !== undefined ? <span class="mono">{shortId(head.jobId)}</span> : "the job ahead"} judges far longer than usual and the
        core has not confirmed it still runs
      </span>
    );
  }
  if (head !== undefined && head.status === JobStatus.PENDING && head.lastError) {
    return (
      <span class="warn-text" title={visibleText(head.lastError)}>
        behind a release being retried ({shortId(head.jobId)}, attempt {head.releaseAttempts}); starts when the core takes it,
        at worst when the release window ends
      </span>
    );
  }
  return <Countdown at={date(job.estimatedStartTime)} now={now} held={held} />;
}

export function UserQueuePage({ userId, live }: { userId: string; live: boolean }) {
  const [jobs, setJobs] = useState<Map<string, Job>>(new Map());
  const [finished, setFinished] = useState<Job[]>([]);
  const [balanceVersion, setBalanceVersion] = useState(0);
  const now = useNow();
  const coreUnreachable = useCoreUnreachable(live);
  const { settings, refusal } = useUserSettings(userId, balanceVersion);
  const held: Held = coreUnreachable ? "core" : settings?.releasesPaused ? "paused" : settings?.fleetReleasesPaused ? "fleet-paused" : "";
  const { run, busy } = useAction();

  useEffect(() => {
    setJobs(new Map());
    setFinished([]);
  }, [userId]);

  const problem = useLiveStream(
    (signal) => queue.watchJobs({ userId }, { signal }),
    (message, first) => {
      const job = message.job;
      setJobs((old) => {
        // A (re)opened stream starts with a fresh snapshot: forget what it replaces.
        const next = new Map(first ? [] : old);
        if (job) {
          if (ACTIVE.has(job.status)) next.set(job.jobId, job);
          else next.delete(job.jobId);
        }
        return next;
      });
      if (job && !ACTIVE.has(job.status)) {
        setFinished((old) => [job, ...old.filter((j) => j.jobId !== job.jobId)].slice(0, 5));
      }
      setBalanceVersion((v) => v + 1); // an admit charges, an end may refund
    },
    [userId],
    live && userId !== "",
  );

  // Whether a run is overdue (and so whether the jobs behind it are promised a start) changes with
  // time alone, which the stream does not send: the active jobs are read again every few seconds
  // and their marks and estimates taken from that read.
  useEffect(() => {
    if (!live || userId === "") return;
    let current = true;
    const reread = () =>
      queue.listJobs({ userId, statuses: [JobStatus.QUEUED, JobStatus.PENDING, JobStatus.RUNNING], pageSize: 100 }).then(
        (r) => {
          if (!current) return;
          setJobs((old) => {
            const next = new Map(old);
            for (const fresh of r.jobs) {
              const known = next.get(fresh.jobId);
              if (known !== undefined && known.status === fresh.status) next.set(fresh.jobId, fresh);
            }
            return next;
          });
        },
        () => {}, // the stream's problem line and the live mark say it
      );
    const timer = setInterval(reread, MARKS_REREAD_MS);
    return () => {
      current = false;
      clearInterval(timer);
    };
  }, [userId, live]);

  if (userId === "") {
    return (
      <section class="page">
        <h1>A user's queue</h1>
        <p class="muted">What a lecturer sees: the running analysis, the queued ones with their position, what each waits for and when it should start.</p>
        <UserPicker userId="" />
        <UsersWithWork live={live} now={now} />
      </section>
    );
  }

  const active = [...jobs.values()];
  const running = active.filter((j) => j.status !== JobStatus.QUEUED).sort((a, b) => Number(a.createTime!.seconds - b.createTime!.seconds));
  const waiting = active.filter((j) => j.status === JobStatus.QUEUED).sort((a, b) => a.queuePosition - b.queuePosition);

  return (
    <section class="page" data-testid="user-queue">
      <UserPicker userId={userId} />
      <h1>
        Queue of <UserText class="mono" text={userId} />
      </h1>
      {problem && <p class="problem">{problem}</p>}
      <UserSettingsLine settings={settings} refusal={refusal} />
      <div class="toolbar">
        <Credits userId={userId} version={balanceVersion} live={live} onGranted={() => setBalanceVersion((v) => v + 1)} />
        <button
          disabled={busy}
          data-testid="promote"
          onClick={() =>
            run(async () => {
              const r = await queue.promote({ userId });
              return r.job ? `Promoted job ${shortId(r.job.jobId)}` : "Nothing to promote: no free slot, or nothing queued";
            })
          }
        >
          Promote next
        </button>
        <a href={`#/jobs?user=${encodeURIComponent(userId)}`}>All of this user's jobs →</a>
        <a href="#/users">Users with work</a>
      </div>
      <ol class="queue">
        {running.map((job) => (
          <li class="queue-row running" data-testid="queue-row" data-position={job.queuePosition} data-job-id={job.jobId}>
            <span class="position">▶</span>
            <a class="mono" href={`#/jobs/${job.jobId}`}>
              {shortId(job.jobId)}
            </a>
            <StatusBadge status={job.status} />
            <span>
              {job.status === JobStatus.RUNNING && job.startTime
                ? coreUnreachable
                  ? <span class="bad-text" data-testid="running-core-unreachable">started {duration(now - date(job.startTime)!.getTime())} ago; the core is unreachable, so whether it still runs is unknown</span>
                  : job.runOverdue
                    ? <span class="warn-text" data-testid="running-overdue">running for {duration(now - date(job.startTime)!.getTime())}, far longer than usual: the core has not confirmed it still runs <CheckWithCoreButton job={job} small onChecked={() => setBalanceVersion((v) => v + 1)} /></span>
                    : `running for ${duration(now - date(job.startTime)!.getTime())}`
                : job.capacityPosition > 0
                  ? coreUnreachable
                    ? <span class="bad-text" data-testid="capacity-position-outage">no start expected while the core is unreachable (held for the fleet's capacity, {ordinal(job.capacityPosition)} in line)</span>
                    : <span data-testid="capacity-position">waiting for its turn at the fleet's capacity (the core answers; others' runs go first): {ordinal(job.capacityPosition)} in line · <Countdown at={date(job.estimatedStartTime)} now={now} held={held} /></span>
                  : job.lastError
                  ? <>release retrying: <UserText text={job.lastError} /></>
                  : "starting"}
            </span>
            <CancelJobButton job={job} small testId="cancel" onCanceled={() => setBalanceVersion((v) => v + 1)} />
          </li>
        ))}
        {waiting.map((job) => (
          <li class="queue-row" data-testid="queue-row" data-position={job.queuePosition} data-job-id={job.jobId}>
            <span class="position" data-testid="position">
              {job.queuePosition}
            </span>
            <a class="mono" href={`#/jobs/${job.jobId}`}>
              {shortId(job.jobId)}
            </a>
            <StatusBadge status={job.status} />
            <span class="muted">
              waiting for <span class="mono">{shortId(job.waitingForJobId)}</span> · <StartsWhen job={job} jobs={jobs} now={now} held={held} />
            </span>
            <CancelJobButton job={job} small testId="cancel" onCanceled={() => setBalanceVersion((v) => v + 1)} />
          </li>
        ))}
      </ol>
      {active.length === 0 && <p class="muted">Nothing queued or running for this user.</p>}
      {finished.length > 0 && (
        <>
          <h2>Just finished</h2>
          <ul class="finished">
            {finished.map((job) => (
              <li>
                <a class="mono" href={`#/jobs/${job.jobId}`}>
                  {shortId(job.jobId)}
                </a>{" "}
                {STATUS_LABELS[job.status]} {job.refunded ? "(refunded)" : ""} at {clock(date(job.endTime))}
              </li>
            ))}
          </ul>
        </>
      )}
      <UserLedger userId={userId} version={balanceVersion} />
    </section>
  );
}

/** The user's latest credit movements, with who moved each and why. */
function UserLedger({ userId, version }: { userId: string; version: number }) {
  const { entries, next, refusal } = useLedger(userId, "", version, 10, "", true);
  return (
    <>
      <h2>Credits ledger</h2>
      <LedgerPanel entries={entries} refusal={refusal} showUser={false} />
      {next !== "" && (
        <p>
          <a href={`#/ledger?user=${encodeURIComponent(userId)}`}>Older entries →</a>
        </p>
      )}
    </>
  );
}

// Who has work is read again this often while the page is open.
const USERS_POLL_MS = 3000;

/** The users with work now, the one waiting longest first: pick one to watch. */
function UsersWithWork({ live, now }: { live: boolean; now: number }) {
  const [users, setUsers] = useState<UserWork[] | null>(null);
  const [total, setTotal] = useState(0n);
  useEffect(() => {
    if (!live) return;
    let current = true;
    const load = () =>
      operator.listUsersWithWork({ pageSize: 50 }).then(
        (r) => {
          if (!current) return;
          setUsers(r.users);
          setTotal(r.usersTotal);
        },
        () => {}, // the live mark tells a refused or unreachable service
      );
    load();
    const timer = setInterval(load, USERS_POLL_MS);
    return () => {
      current = false;
      clearInterval(timer);
    };
  }, [live]);
  if (users === null) return <p class="muted">Loading the users with work…</p>;
  if (users.length === 0) return <p class="muted">No user has work in the queue now.</p>;
  return (
    <>
      <h2>
        Users with work <span class="count">({String(total)}{total > BigInt(users.length) ? `, the ${users.length} waiting longest shown` : ""})</span>
      </h2>
      <table class="jobs users-with-work" data-testid="users-with-work">
        <thead>
          <tr>
            <th>User</th>
            <th class="num">Queued</th>
            <th class="num">Pending</th>
            <th class="num">Running</th>
            <th>Waiting longest</th>
          </tr>
        </thead>
        <tbody>
          {users.map((user) => {
            const oldest = date(user.oldestQueuedCreateTime);
            return (
              <tr data-testid="user-with-work" data-user-id={user.userId} tabIndex={0} onKeyDown={(e) => e.key === "Enter" && go(`users/${encodeURIComponent(user.userId)}`)}>
                <td>
                  <a href={`#/users/${encodeURIComponent(user.userId)}`}>
                    <UserText text={user.userId} />
                  </a>
                </td>
                <td class="num">{String(user.queued)}</td>
                <td class="num">{String(user.pending)}</td>
                <td class="num">{String(user.running)}</td>
                <td>{oldest ? `queued for ${duration(now - oldest.getTime())}` : <span class="muted">nothing queued</span>}</td>
              </tr>
            );
          })}
        </tbody>
      </table>
    </>
  );
}
