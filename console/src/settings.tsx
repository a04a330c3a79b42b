// Settings & audit: the fleet settings an operator changes at run time, each behind a
// confirmation, and who changed what (OperatorService.ListSettingChanges). The core's capacity
// (set a limit, or remove it: capacity 0 is no stop), the pause of releases, fleet-wide or for
// one user (admits go on; nothing is released to the core while paused), and the change log with
// its actors, each linked to the ledger entries of the same actor.
import type { ComponentChildren } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";

import { date, operator } from "./api.js";
import { Modal } from "./dialog.js";
import { dateTime } from "./format.js";
import { useAction } from "./notice.js";
import { UserText } from "./user-text.js";
import type { Overview, SettingChange } from "@acurio/queue-client/gen/acurio/queue/v1/operator_service_pb.js";

/** A button that opens a confirmation; `onConfirm` runs only from the dialog's own button. */
function Confirmed({
  label,
  title,
  confirmLabel,
  testId,
  danger,
  disabled,
  onConfirm,
  children,
}: {
  label: string;
  title: string;
  confirmLabel: string;
  testId: string;
  danger?: boolean;
  disabled?: boolean;
  onConfirm: () => Promise<void>;
  children: ComponentChildren;
}) {
  const [open, setOpen] = useState(false);
  const opener = useRef<HTMLButtonElement>(null);
  return (
    <>
      <button type="button" class={danger ? "danger" : ""} disabled={disabled} onClick={() => setOpen(true)} data-testid={testId} ref={opener}>
        {label}
      </button>
      {open && (
        <Modal role="alertdialog" label={title} onClose={() => setOpen(false)} returnTo={opener}>
          <form
            onSubmit={(e) => {
              e.preventDefault();
              setOpen(false);
              void onConfirm();
            }}
          >
            <h2>{title}</h2>
            {children}
            <div class="actions">
              <button type="button" onClick={() => setOpen(false)} data-autofocus>
                Keep it <kbd>Esc</kbd>
              </button>
              <button type="submit" class={danger ? "danger" : "primary"} data-testid={`${testId}-confirm`}>
                {confirmLabel}
              </button>
            </div>
          </form>
        </Modal>
      )}
    </>
  );
}

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

const SETTING_LABELS: Record<string, string> = {
  core_capacity: "core capacity",
  user_max_active: "user's limit",
  releases_paused: "releases paused",
};

function value(change: SettingChange, v: number): string {
  if (change.setting === "releases_paused") return v === 1 ? "paused" : "released";
  if (v === 0) return change.setting === "core_capacity" ? "unlimited" : "default";
  return String(v);
}

function Changes({ version }: { version: number }) {
  const [changes, setChanges] = useState<SettingChange[] | null>(null);
  const [tokens, setTokens] = useState<string[]>([""]);
  const [next, setNext] = useState("");
  const { run } = useAction();
  useEffect(() => setTokens([""]), [version]);
  useEffect(() => {
    void run(async () => {
      const page = await operator.listSettingChanges({ pageSize: 20, pageToken: tokens[tokens.length - 1] });
      setChanges(page.changes);
      setNext(page.nextPageToken);
    });
  }, [tokens, version]);
  return (
    <section class="settings-block">
      <h2>Changes</h2>
      {changes === null ? (
        <p class="muted">Loading…</p>
      ) : changes.length === 0 ? (
        <p class="muted">No setting changed yet.</p>
      ) : (
        <table class="jobs" data-testid="setting-changes">
          <thead>
            <tr>
              <th>When</th>
              <th>Setting</th>
              <th>User</th>
              <th>Change</th>
              <th>Actor</th>
              <th>Note</th>
            </tr>
          </thead>
          <tbody>
            {changes.map((change) => (
              <tr data-testid="setting-change" data-setting={change.setting}>
                <td>{dateTime(date(change.createTime))}</td>
                <td>{SETTING_LABELS[change.setting] ?? change.setting}</td>
                <td>{change.userId ? <UserText class="mono" text={change.userId} /> : <span class="muted">fleet</span>}</td>
                <td>
                  {value(change, change.oldValue)} → {value(change, change.newValue)}
                </td>
                <td class="mono" data-testid="setting-change-actor">
                  <a href={`#/ledger?actor=${encodeURIComponent(change.actor)}`} title="This actor's ledger entries">
                    <UserText text={change.actor} />
                  </a>
                </td>
                <td>{change.note && <UserText text={change.note} />}</td>
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

/** `#/settings`: the capacity, the pauses and the change log. */
export function SettingsPage() {
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
      <Changes version={version} />
    </section>
  );
}
