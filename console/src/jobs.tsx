import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ComponentChildren } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";

import { date, operator, Problem, queue } from "./api.js";
import { Modal } from "./dialog.js";
import { ACTIVE, ago, canceledText, canceler, dateTime, duration, RETRYABLE, shortId, spoken, STATUS_LABELS } from "./format.js";
import { go, useDraft, useNow, useQueryRead } from "./hooks.js";
import { LedgerPanel, useLedger } from "./ledger.js";
import { useAction, useNotice } from "./notice.js";
import { useLiveStream } from "./stream.js";
import { UserText, visibleText } from "./user-text.js";
import { type Job, JobStatus } from "@acurio/queue-client/gen/acurio/queue/v1/job_pb.js";
import { JobFilterSchema, type JobFilter, type RetryJobsResponse } from "@acurio/queue-client/gen/acurio/queue/v1/operator_service_pb.js";

const STATUS_BY_NAME = new Map(Object.entries(STATUS_LABELS).map(([value, name]) => [name, Number(value) as JobStatus]));

type SearchField = "sourceDoi" | "documentUriPrefix" | "titleWords";
const SEARCH_AS: Record<SearchField, string> = { sourceDoi: "a source's DOI", documentUriPrefix: "the start of a document uri", titleWords: "words of the title" };

/** What the search box holds, read as the filter field it names: a DOI as it is pasted (`10.…`,
 * `doi:…`, a doi.org link), a document uri (`scheme://…`, matched as a prefix), else title words. */
export function searchField(text: string): SearchField | null {
  const trimmed = text.trim();
  if (!trimmed) return null;
  if (/^(doi:|https?:\/\/(dx\.)?doi\.org\/|10\.\d{4,9}\/)/i.test(trimmed)) return "sourceDoi";
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(trimmed)) return "documentUriPrefix";
  return "titleWords";
}

function filterFrom(params: URLSearchParams): JobFilter {
  const search = params.get("q") ?? "";
  const field = searchField(search);
  const filter = create(JobFilterSchema, {
    ...(field ? { [field]: search.trim() } : {}),
    userId: params.get("user") ?? "",
    hasError: params.get("error") === "1",
    statuses: (params.get("status") ?? "")
      .split(",")
      .map((s) => STATUS_BY_NAME.get(s))
      .filter((s): s is JobStatus => s !== undefined),
  });
  const after = params.get("after");
  const before = params.get("before");
  if (after) filter.createdAfter = timestampFromDate(new Date(after));
  if (before) filter.createdBefore = timestampFromDate(new Date(before));
  return filter;
}

export function StatusBadge({ status }: { status: JobStatus }) {
  return <span class={`badge ${STATUS_LABELS[status]}`}>{STATUS_LABELS[status]}</span>;
}

interface BulkCount {
  matched: number;
  more: boolean;
  /** Jobs the action leaves out on purpose (a bulk retry's jobs retried already). */
  skipped: number;
}

/** A bulk action by filter (cancel, retry): a dry run counts first; the dialog names the filter's
 * reach, and with no user in the filter (every user's jobs) the count must be typed before the
 * confirm button works. The real call acts on at most the number confirmed. */
function BulkByFilter({
  filter,
  onDone,
  name,
  verb,
  none,
  consequence,
  count,
  act,
}: {
  filter: JobFilter;
  onDone: () => void;
  name: "cancel" | "retry";
  verb: string;
  none: string;
  consequence: string;
  count: () => Promise<BulkCount>;
  act: (maxJobs: number) => Promise<string>;
}) {
  const [counted, setCounted] = useState<BulkCount | null>(null);
  const [typed, setTyped] = useState("");
  const opener = useRef<HTMLButtonElement>(null);
  const { run, busy } = useAction();
  const allUsers = filter.userId === "";
  const ask = () =>
    run(async () => {
      const found = await count();
      setTyped("");
      setCounted(found);
    });
  const armed = counted !== null && counted.matched > 0 && (!allUsers || typed.trim() === String(counted.matched));
  const confirm = () =>
    run(async () => {
      if (!armed) return;
      const text = await act(counted!.matched);
      setCounted(null);
      onDone();
      return text;
    });
  const jobs = (n: number) => `${n} ${n === 1 ? "job" : "jobs"}`;
  return (
    <>
      <button type="button" onClick={ask} disabled={busy} data-testid={`bulk-${name}`} ref={opener}>
        {verb} all matching this filter…
      </button>
      {counted !== null && (
        <Modal role="alertdialog" label={`Confirm bulk ${name}`} onClose={() => setCounted(null)} returnTo={opener}>
          <form
            onSubmit={(e) => {
              e.preventDefault();
              confirm();
            }}
          >
            {counted.matched === 0 ? (
              <p>{none}</p>
            ) : (
              <p data-testid={`bulk-${name}-count`} data-count={counted.matched}>
                {verb} all <strong>{jobs(counted.matched)}</strong> matching this filter
                {allUsers ? (
                  <>
                    {" "}
                    across <strong>all users</strong> (the filter names no user)
                  </>
                ) : (
                  <>
                    {" "}
                    of <UserText class="mono" text={filter.userId} />
                  </>
                )}
                {counted.more ? " (the first 1000 of more)" : ""}? {consequence}
              </p>
            )}
            {counted.skipped > 0 && (
              <p class="muted" data-testid={`bulk-${name}-skipped`} data-count={counted.skipped}>
                {jobs(counted.skipped)} matching it {counted.skipped === 1 ? "was" : "were"} retried already and {counted.skipped === 1 ? "is" : "are"} skipped
                (open a job to retry it again).
              </p>
            )}
            {counted.matched > 0 && allUsers && (
              <label class="confirm-typed">
                Type {counted.matched} to {name} jobs of every user
                <input
                  data-autofocus
                  inputMode="numeric"
                  autoComplete="off"
                  value={typed}
                  onInput={(e) => setTyped(e.currentTarget.value)}
                  aria-label={`Number of jobs to ${name}`}
                />
              </label>
            )}
            <div class="actions">
              <button type="button" onClick={() => setCounted(null)} data-autofocus={allUsers ? undefined : true}>
                Keep them <kbd>Esc</kbd>
              </button>
              {counted.matched > 0 && (
                <button type="submit" class={name === "cancel" ? "danger" : "primary"} disabled={busy || !armed} data-testid={`bulk-${name}-confirm`}>
                  {verb} {jobs(counted.matched)}
                  {allUsers ? " of all users" : ""}
                </button>
              )}
            </div>
          </form>
        </Modal>
      )}
    </>
  );
}

function BulkCancel({ filter, onDone }: { filter: JobFilter; onDone: () => void }) {
  return (
    <BulkByFilter
      filter={filter}
      onDone={onDone}
      name="cancel"
      verb="Cancel"
      none="No queued, pending or running job matches this filter."
      consequence="Each is canceled at the core and refunded; ended jobs are not touched."
      count={async () => {
        const response = await operator.cancelJobs({ filter, dryRun: true });
        return { matched: response.matched, more: response.moreThanCounted, skipped: 0 };
      }}
      act={async (maxJobs) => {
        const response = await operator.cancelJobs({ filter, maxJobs });
        const failed = response.failures.length;
        return `Canceled ${response.canceled} jobs (refunded)${failed ? `; ${failed} could not be canceled: ${response.failures[0].reason}` : ""}`;
      }}
    />
  );
}

/** What a bulk retry did, in one line; a failure makes it the notice's error. */
function retriedText(response: RetryJobsResponse): string {
  const skipped = response.alreadyRetriedJobIds.length;
  const failed = response.failures.length;
  const text =
    `Retried ${response.retried} ${response.retried === 1 ? "job" : "jobs"} (each charged to its user)` +
    (skipped ? `; ${skipped} retried already, skipped` : "") +
    (failed ? `; ${failed} could not be retried: ${response.failures[0].reason} (${response.failures[0].message})` : "");
  if (failed) throw new Problem(text);
  return text;
}

/** Bulk retry by filter: only the filter's FAILED and CANCELED jobs (all of those when it names no
 * status), each retried once; jobs retried already are counted and skipped. */
function BulkRetry({ filter, onDone }: { filter: JobFilter; onDone: () => void }) {
  const statuses = filter.statuses.filter((s) => RETRYABLE.has(s));
  if (filter.statuses.length > 0 && statuses.length === 0) return null; // the filter shows only active or succeeded jobs
  const retryFilter = create(JobFilterSchema, { ...filter, statuses });
  return (
    <BulkByFilter
      filter={retryFilter}
      onDone={onDone}
      name="retry"
      verb="Retry"
      none="No failed or canceled job matching this filter is left to retry."
      consequence="Each is admitted again as a new job of its user and charged to that user, once."
      count={async () => {
        const response = await operator.retryJobs({ filter: retryFilter, dryRun: true });
        return { matched: response.matched, more: response.moreThanCounted, skipped: response.alreadyRetriedJobIds.length };
      }}
      act={async (maxJobs) => retriedText(await operator.retryJobs({ filter: retryFilter, maxJobs }))}
    />
  );
}

/** The jobs a selection dialog names: the first 8 with their users. */
function SelectedList({ jobs }: { jobs: Job[] }) {
  return (
    <ul class="selected-list">
      {jobs.slice(0, 8).map((job) => (
        <li class="mono">
          {shortId(job.jobId)} <UserText class="muted" text={job.userId} />
        </li>
      ))}
      {jobs.length > 8 && <li class="muted">and {jobs.length - 8} more</li>}
    </ul>
  );
}

/** Where a job is, as a phrase with how long: "queued for 4 min", "judging for 2 min". */
export function stateFor(job: Job, now: number): string {
  const since = (ts: Date | undefined) => (ts ? spoken(now - ts.getTime()) : "—");
  const created = date(job.createTime);
  const promoted = date(job.promoteTime);
  const started = date(job.startTime);
  const ended = date(job.endTime);
  switch (job.status) {
    case JobStatus.QUEUED:
      return job.behindOverdueRun ? `queued for ${since(created)}, behind a run far longer than usual` : `queued for ${since(created)}`;
    case JobStatus.PENDING:
      // A turn at the fleet's capacity is not an outage: the core answers, others' runs go first.
      return job.capacityPosition > 0 ? `waiting for its turn at the fleet's capacity for ${since(promoted)}` : `releasing for ${since(promoted)}`;
    case JobStatus.RUNNING:
      return job.runOverdue ? `judging for ${since(started)}, far longer than usual` : `judging for ${since(started)}`;
    default:
      if (ended && started) return `judged in ${spoken(ended.getTime() - started.getTime())}, ended ${ago(ended, now)}`;
      return `ended ${ago(ended, now)}${created && ended ? ` after ${spoken(ended.getTime() - created.getTime())}` : ""}`;
  }
}

type SortKey = "job" | "user" | "status" | "position" | "admitted" | "releases" | "state";
const SORTS: Record<SortKey, (a: Job, b: Job) => number> = {
  job: (a, b) => a.jobId.localeCompare(b.jobId),
  user: (a, b) => a.userId.localeCompare(b.userId),
  status: (a, b) => a.status - b.status,
  position: (a, b) => a.queuePosition - b.queuePosition,
  admitted: (a, b) => Number((a.createTime?.seconds ?? 0n) - (b.createTime?.seconds ?? 0n)) || (a.createTime?.nanos ?? 0) - (b.createTime?.nanos ?? 0),
  releases: (a, b) => a.releaseAttempts - b.releaseAttempts,
  state: (a, b) => a.status - b.status || SORTS.admitted(a, b),
};

/** A column header that sorts the page shown (the server's order is newest admitted first). */
function SortHeader({ label, name, sort, setSort, num }: { label: string; name: SortKey; sort: [SortKey, number] | null; setSort: (s: [SortKey, number] | null) => void; num?: boolean }) {
  const current = sort !== null && sort[0] === name ? sort[1] : 0;
  const next = () => setSort(current === 0 ? [name, 1] : current === 1 ? [name, -1] : null);
  return (
    <th class={num ? "num" : ""} aria-sort={current === 1 ? "ascending" : current === -1 ? "descending" : "none"}>
      <button type="button" class="sort" onClick={next} data-testid={`sort-${name}`} title="Sort this page (again: reverse; a third time: the server's order)">
        {label} <span class="arrow">{current === 1 ? "▲" : current === -1 ? "▼" : "↕"}</span>
      </button>
    </th>
  );
}

/** What a job judges, in one cell: the document's title (or uri) and how many sources. */
function DocumentCell({ job }: { job: Job }) {
  if (!job.document && job.sourceCount === 0) return <span class="muted">not stored</span>;
  const title = job.document?.title || job.document?.uri || "(delta re-check)";
  return (
    <span class="document-cell" title={visibleText(job.document?.uri ?? "")}>
      <UserText text={title} /> <span class="muted">· {job.sourceCount} {job.sourceCount === 1 ? "source" : "sources"}</span>
    </span>
  );
}

// Which optional columns the Jobs table shows, kept for the browser (not the URL: a link shared
// with a colleague shows the jobs, not one's taste in columns).
const COLUMNS_KEY = "acurio-queue-console-columns";
function useColumns(): [Set<string>, (name: string, on: boolean) => void] {
  const [columns, setColumns] = useState<Set<string>>(() => new Set((localStorage.getItem(COLUMNS_KEY) ?? "").split(",").filter((c) => c)));
  const set = (name: string, on: boolean) => {
    const next = new Set(columns);
    if (on) next.add(name);
    else next.delete(name);
    localStorage.setItem(COLUMNS_KEY, [...next].join(","));
    setColumns(next);
  };
  return [columns, set];
}

/** Cancel exactly the jobs ticked in the table (each as CancelJob does: at the core, refunded). */
function CancelSelected({ selected, onDone }: { selected: Map<string, Job>; onDone: () => void }) {
  const [open, setOpen] = useState(false);
  const opener = useRef<HTMLButtonElement>(null);
  const { run, busy } = useAction();
  const jobs = [...selected.values()];
  const users = new Set(jobs.map((j) => j.userId));
  const confirm = () =>
    run(async () => {
      const outcomes = await Promise.allSettled(jobs.map((job) => queue.cancelJob({ jobId: job.jobId, userId: job.userId })));
      setOpen(false);
      onDone();
      const failed = outcomes.filter((o) => o.status === "rejected").length;
      if (failed > 0) throw new Problem(`Canceled ${jobs.length - failed} of ${jobs.length} selected jobs; ${failed} could not be canceled (ended meanwhile, or the core did not answer)`);
      return `Canceled ${jobs.length} selected ${jobs.length === 1 ? "job" : "jobs"} (refunded)`;
    });
  return (
    <>
      <button type="button" class="danger" disabled={busy || jobs.length === 0} onClick={() => setOpen(true)} data-testid="cancel-selected" ref={opener}>
        Cancel selected ({jobs.length})
      </button>
      {open && (
        <Modal role="alertdialog" label="Confirm cancel of the selected jobs" onClose={() => setOpen(false)} returnTo={opener}>
          <form
            onSubmit={(e) => {
              e.preventDefault();
              confirm();
            }}
          >
            <p data-testid="cancel-selected-count" data-count={jobs.length}>
              Cancel the <strong>{jobs.length}</strong> selected {jobs.length === 1 ? "job" : "jobs"} of{" "}
              {users.size === 1 ? <span class="mono">{[...users][0]}</span> : <strong>{users.size} users</strong>}? Each is canceled at the core and
              refunded.
            </p>
            <SelectedList jobs={jobs} />
            <div class="actions">
              <button type="button" onClick={() => setOpen(false)} data-autofocus>
                Keep them <kbd>Esc</kbd>
              </button>
              <button type="submit" class="danger" disabled={busy} data-testid="cancel-selected-confirm">
                Cancel {jobs.length} selected
              </button>
            </div>
          </form>
        </Modal>
      )}
    </>
  );
}

/** Retry exactly the failed and canceled jobs ticked in the table, each once: a dry run counts
 * them and the ones retried already (skipped), then the confirmed number is retried. */
function RetrySelected({ selected, onDone }: { selected: Map<string, Job>; onDone: () => void }) {
  const [counted, setCounted] = useState<{ matched: number; skipped: number } | null>(null);
  const opener = useRef<HTMLButtonElement>(null);
  const { run, busy } = useAction();
  const jobs = [...selected.values()];
  const jobIds = jobs.map((job) => job.jobId);
  const ask = () =>
    run(async () => {
      const response = await operator.retryJobs({ jobIds, dryRun: true });
      setCounted({ matched: response.matched, skipped: response.alreadyRetriedJobIds.length });
    });
  const confirm = () =>
    run(async () => {
      if (counted === null || counted.matched === 0) return;
      const response = await operator.retryJobs({ jobIds, maxJobs: counted.matched });
      setCounted(null);
      onDone();
      return retriedText(response);
    });
  const many = (n: number) => `${n} ${n === 1 ? "job" : "jobs"}`;
  return (
    <>
      <button type="button" class="primary" disabled={busy || jobs.length === 0} onClick={ask} data-testid="retry-selected" ref={opener}>
        Retry selected ({jobs.length})
      </button>
      {counted !== null && (
        <Modal role="alertdialog" label="Confirm retry of the selected jobs" onClose={() => setCounted(null)} returnTo={opener}>
          <form
            onSubmit={(e) => {
              e.preventDefault();
              confirm();
            }}
          >
            <p data-testid="retry-selected-count" data-count={counted.matched} data-skipped={counted.skipped}>
              {counted.matched > 0 ? (
                <>
                  Retry <strong>{many(counted.matched)}</strong> of the {jobs.length} selected? Each is admitted again as a new job of its user and
                  charged to that user, once.
                </>
              ) : (
                <>Nothing to retry: every selected job was retried already.</>
              )}
              {counted.skipped > 0 && ` ${many(counted.skipped)} retried already ${counted.skipped === 1 ? "is" : "are"} skipped (open a job to retry it again).`}
            </p>
            <SelectedList jobs={jobs} />
            <div class="actions">
              <button type="button" onClick={() => setCounted(null)} data-autofocus>
                Keep them <kbd>Esc</kbd>
              </button>
              {counted.matched > 0 && (
                <button type="submit" class="primary" disabled={busy} data-testid="retry-selected-confirm">
                  Retry {many(counted.matched)}
                </button>
              )}
            </div>
          </form>
        </Modal>
      )}
    </>
  );
}

/** A job that can be retried: it ended FAILED or CANCELED and its inputs are stored. */
const canRetry = (job: Job) => RETRYABLE.has(job.status) && job.sourceCount > 0;
/** Whether the job is one a cancel (active) or a retry (ended) can take: a ticked job whose kind
 * changed meanwhile leaves the selection. */
const kindOf = (job: Job) => (ACTIVE.has(job.status) ? "cancel" : canRetry(job) ? "retry" : "none");

const NO_JOBS: Job[] = [];

export function JobsPage({ params, live }: { params: URLSearchParams; live: boolean }) {
  const [tokens, setTokens] = useState<string[]>([""]); // page tokens: the first page's, then each next one
  const [refresh, setRefresh] = useState(0);
  const [selected, setSelected] = useState<Map<string, Job>>(new Map());
  const [columns, setColumn] = useColumns();
  // A search by what jobs judge shows what each judges, whatever the column choice.
  const showDocument = columns.has("document") || (params.get("q") ?? "") !== "";
  const [sort, setSort] = useState<[SortKey, number] | null>(null);
  const now = useNow();
  const notice = useNotice();
  const [searchDraft, setSearchDraft] = useDraft(params.get("q") ?? "");
  const [userDraft, setUserDraft] = useDraft(params.get("user") ?? "");
  const filter = filterFrom(params);
  const key = params.toString();
  const pageToken = tokens[tokens.length - 1];
  // The page of the filter and page token shown (`useQueryRead`): "Loading…" while another
  // query's is the last that came; a live re-read keeps the rows until its answer lands.
  const page = useQueryRead(JSON.stringify([key, pageToken]), () => operator.searchJobs({ filter, pageSize: 25, pageToken }), refresh, (error) =>
    notice.error(error),
  );
  const loaded = page.answered;
  const refused = page.answered && page.failed;
  const jobs = page.answered && !page.failed ? page.value.jobs : NO_JOBS;
  const next = page.answered && !page.failed ? page.value.nextPageToken : "";

  useEffect(() => setTokens([""]), [key]);
  useEffect(() => setSelected(new Map()), [key]);
  // A selected job that ended meanwhile cannot be canceled (nor one retried since be retried as
  // ticked): it leaves the selection.
  useEffect(() => {
    setSelected((old) => {
      const next = new Map(old);
      for (const job of jobs) {
        const ticked = next.get(job.jobId);
        if (ticked && (kindOf(ticked) !== kindOf(job) || job.retriedAsJobIds.length > ticked.retriedAsJobIds.length)) next.delete(job.jobId);
      }
      return next.size === old.size ? old : next;
    });
  }, [jobs]);
  const selectable = jobs.filter((job) => kindOf(job) !== "none");
  const ticked = (kind: string) => new Map([...selected].filter(([, job]) => kindOf(job) === kind));
  const allSelected = selectable.length > 0 && selectable.every((job) => selected.has(job.jobId));
  const toggle = (job: Job, on: boolean) =>
    setSelected((old) => {
      const next = new Map(old);
      if (on) next.set(job.jobId, job);
      else next.delete(job.jobId);
      return next;
    });

  // Live: the first page follows every change of the overview (a job admitted, moved or ended).
  useLiveStream(
    (signal) => operator.watchOverview({ intervalMs: 1000 }, { signal }),
    (_, first) => {
      if (!first && tokens.length === 1) setRefresh((n) => n + 1);
    },
    [tokens.length],
    live,
  );

  const update = (changes: Record<string, string>) => {
    const next = new URLSearchParams(params);
    for (const [name, value] of Object.entries(changes)) {
      if (value === "") next.delete(name);
      else next.set(name, value);
    }
    go(`jobs?${next.toString()}`);
  };

  return (
    <section class="page" data-testid="jobs">
      <h1>Jobs</h1>
      <form
        class="filters"
        onSubmit={(e) => {
          // Enter in a field applies what it holds (the form has no submit button: nothing else runs).
          e.preventDefault();
          const form = new FormData(e.currentTarget);
          update({ user: String(form.get("user") ?? "").trim(), q: String(form.get("q") ?? "").trim() });
        }}
      >
        <label class="job-search">
          Search
          <input
            data-search
            name="q"
            type="search"
            data-testid="job-search"
            placeholder="title words, document uri or DOI  (press /)"
            value={searchDraft}
            onInput={(e) => setSearchDraft(e.currentTarget.value)}
            onChange={(e) => update({ q: e.currentTarget.value.trim() })}
            onKeyDown={(e) => {
              if (e.key === "Enter") {
                e.preventDefault();
                update({ q: e.currentTarget.value.trim() });
              }
            }}
            aria-describedby="job-search-as"
          />
          <span id="job-search-as" class="muted" data-testid="job-search-as">
            {searchField(params.get("q") ?? "") ? `as ${SEARCH_AS[searchField(params.get("q") ?? "")!]}` : ""}
          </span>
        </label>
        <label>
          Status
          <select value={params.get("status") ?? ""} onChange={(e) => update({ status: e.currentTarget.value })}>
            <option value="">any</option>
            <option value="queued,pending,running">active</option>
            {Object.values(STATUS_LABELS)
              .slice(1)
              .map((name) => (
                <option value={name}>{name}</option>
              ))}
          </select>
        </label>
        <label>
          User
          <input
            name="user"
            placeholder="user id"
            value={userDraft}
            onInput={(e) => setUserDraft(e.currentTarget.value)}
            onChange={(e) => update({ user: e.currentTarget.value.trim() })}
            onKeyDown={(e) => {
              if (e.key === "Enter") {
                e.preventDefault();
                update({ user: e.currentTarget.value.trim() });
              }
            }}
          />
        </label>
        <label>
          Admitted after
          <input type="datetime-local" value={params.get("after") ?? ""} onChange={(e) => update({ after: e.currentTarget.value })} />
        </label>
        <label>
          before
          <input type="datetime-local" value={params.get("before") ?? ""} onChange={(e) => update({ before: e.currentTarget.value })} />
        </label>
        <label class="check">
          <input type="checkbox" checked={params.get("error") === "1"} onChange={(e) => update({ error: e.currentTarget.checked ? "1" : "" })} />
          has error
        </label>
      </form>
      <div class="toolbar">
        <CancelSelected selected={ticked("cancel")} onDone={() => { setSelected(new Map()); setRefresh((n) => n + 1); }} />
        <BulkCancel filter={filter} onDone={() => setRefresh((n) => n + 1)} />
        <RetrySelected selected={ticked("retry")} onDone={() => { setSelected(new Map()); setRefresh((n) => n + 1); }} />
        <BulkRetry filter={filter} onDone={() => setRefresh((n) => n + 1)} />
        <label class="check column-choice">
          <input type="checkbox" data-testid="column-document" checked={columns.has("document")} onChange={(e) => setColumn("document", e.currentTarget.checked)} />
          Document column
        </label>
      </div>
      <table class="jobs">
        <thead>
          <tr>
            <th class="select">
              <input
                type="checkbox"
                aria-label="Select every job on this page that can be canceled or retried"
                data-testid="select-all"
                disabled={selectable.length === 0}
                checked={allSelected}
                onChange={(e) => {
                  const on = e.currentTarget.checked;
                  setSelected((old) => {
                    const next = new Map(old);
                    for (const job of selectable) on ? next.set(job.jobId, job) : next.delete(job.jobId);
                    return next;
                  });
                }}
              />
            </th>
            <SortHeader label="Job" name="job" sort={sort} setSort={setSort} />
            <SortHeader label="User" name="user" sort={sort} setSort={setSort} />
            {showDocument && <th data-testid="document-header">Document</th>}
            <SortHeader label="Status" name="status" sort={sort} setSort={setSort} />
            <SortHeader label="For" name="state" sort={sort} setSort={setSort} />
            <SortHeader label="Position" name="position" sort={sort} setSort={setSort} num />
            <SortHeader label="Admitted" name="admitted" sort={sort} setSort={setSort} />
            <SortHeader label="Releases" name="releases" sort={sort} setSort={setSort} num />
            <th>Last error or cancel</th>
          </tr>
        </thead>
        <tbody>
          {(sort === null ? jobs : [...jobs].sort((a, b) => sort[1] * SORTS[sort[0]](a, b))).map((job) => (
            <tr
              data-testid="job-row"
              data-job-id={job.jobId}
              class={selected.has(job.jobId) ? "selected" : ""}
              tabIndex={0}
              onKeyDown={(e) => e.target === e.currentTarget && e.key === "Enter" && go(`jobs/${job.jobId}`)}
            >
              <td class="select">
                {kindOf(job) !== "none" && (
                  <input
                    type="checkbox"
                    data-testid="select-job"
                    aria-label={`Select job ${shortId(job.jobId)}`}
                    checked={selected.has(job.jobId)}
                    onChange={(e) => toggle(job, e.currentTarget.checked)}
                  />
                )}
              </td>
              <td>
                <a href={`#/jobs/${job.jobId}`} class="mono">
                  {shortId(job.jobId)}
                </a>
              </td>
              <td>
                <a href={`#/users/${encodeURIComponent(job.userId)}`}>
                  <UserText text={job.userId} />
                </a>
              </td>
              {showDocument && (
                <td data-testid="document-cell">
                  <DocumentCell job={job} />
                </td>
              )}
              <td>
                <StatusBadge status={job.status} />
              </td>
              <td class="state" data-testid="job-state">
                {stateFor(job, now)}
              </td>
              <td class="num">{job.queuePosition || ""}</td>
              <td title={dateTime(date(job.createTime))}>{ago(date(job.createTime), now)}</td>
              <td class="num">{job.releaseAttempts}</td>
              {job.status === JobStatus.CANCELED ? (
                <td class="ended-text" data-testid="canceled-text">
                  <UserText text={canceledText(job)} />
                </td>
              ) : (
                <td class="error-text">
                  <UserText text={job.lastError} />
                </td>
              )}
            </tr>
          ))}
        </tbody>
      </table>
      {!loaded && <p class="muted" data-testid="jobs-loading">Loading…</p>}
      {refused && <p class="muted" data-testid="jobs-refused">No job is shown: the service refused these filters (the notice above says why).</p>}
      {loaded && !refused && jobs.length === 0 && <p class="muted">No job matches these filters.</p>}
      <div class="pager">
        <button disabled={tokens.length === 1} onClick={() => setTokens([""])}>
          First page
        </button>
        <button disabled={next === ""} onClick={() => setTokens([...tokens, next])}>
          Next page
        </button>
        <span class="muted">{tokens.length === 1 ? "live" : `page ${tokens.length} (not live)`}</span>
      </div>
    </section>
  );
}

/** Cancel of one job, after a confirmation naming the job, its user and who it is canceled as. */
export function CancelJobButton({
  job,
  onCanceled,
  small,
  testId = "cancel-job",
}: {
  job: Job;
  onCanceled: () => void;
  small?: boolean;
  testId?: string;
}) {
  const [open, setOpen] = useState(false);
  const opener = useRef<HTMLButtonElement>(null);
  const { run, busy } = useAction();
  const confirm = () =>
    run(async () => {
      await queue.cancelJob({ jobId: job.jobId, userId: job.userId });
      setOpen(false);
      onCanceled();
      return `Canceled job ${shortId(job.jobId)}; its credit is refunded`;
    });
  return (
    <>
      <button class={small ? "small danger" : "danger"} disabled={busy} data-testid={testId} onClick={() => setOpen(true)} ref={opener}>
        Cancel
      </button>
      {open && (
        <Modal role="alertdialog" label="Confirm cancel of the job" onClose={() => setOpen(false)} returnTo={opener}>
          <form
            onSubmit={(e) => {
              e.preventDefault();
              confirm();
            }}
          >
            <p data-testid="cancel-job-question">
              Cancel job <span class="mono">{shortId(job.jobId)}</span> of <UserText class="mono" text={job.userId} /> ({STATUS_LABELS[job.status]})? It
              is canceled at the core and its credit refunded; the job records you as who canceled it.
            </p>
            <div class="actions">
              <button type="button" onClick={() => setOpen(false)} data-autofocus>
                Keep it <kbd>Esc</kbd>
              </button>
              <button type="submit" class="danger" disabled={busy} data-testid="cancel-job-confirm">
                Cancel the job
              </button>
            </div>
          </form>
        </Modal>
      )}
    </>
  );
}

/** Links to jobs by their short ids. */
function JobLinks({ jobIds }: { jobIds: string[] }) {
  return (
    <>
      {jobIds.map((id, index) => (
        <>
          {index > 0 ? ", " : ""}
          <a href={`#/jobs/${id}`} class="mono">
            {shortId(id)}
          </a>
        </>
      ))}
    </>
  );
}

/** Retry of an ended job, once: Retry while it has no retry (kept disabled from the click until
 * the job shows its retry, and the service answers every plain retry of one job with the same
 * retry anyway); once retried, "Retry again…" asks first and sends one retry key per dialog, so a
 * double click of its confirm is still one retry. */
function RetryButtons({ job, onRetried }: { job: Job; onRetried: () => void }) {
  const { run, busy } = useAction();
  const [again, setAgain] = useState<string | null>(null); // the open dialog's retry key
  const [confirming, setConfirming] = useState(false); // the first retry's dialog is open
  // Sent and not yet shown on the job: the button stays disabled until the job lists its retry
  // (the ref also stops a second click that comes before the page re-rendered).
  const [sent, setSent] = useState(false);
  const clicked = useRef(false);
  const opener = useRef<HTMLButtonElement>(null);
  const retried = job.retriedAsJobIds.length > 0;
  useEffect(() => {
    clicked.current = false;
    setSent(false);
  }, [job.jobId, job.retriedAsJobIds.length]);
  const retry = (anotherRetry: boolean, retryKey = "") =>
    run(async () => {
      try {
        const r = await operator.retryJob({ jobId: job.jobId, anotherRetry, retryKey });
        const next = r.job!;
        setAgain(null);
        onRetried();
        if (!r.admittedNow) return `Already retried as job ${shortId(next.jobId)} (${STATUS_LABELS[next.status]}); nothing charged again`;
        return `Retried as job ${shortId(next.jobId)} (${STATUS_LABELS[next.status]}), charged ${next.price} to ${next.userId}`;
      } catch (error) {
        clicked.current = false;
        setSent(false);
        throw error;
      }
    });
  if (!retried) {
    // The first retry charges the user too: it asks first, as cancel and the bulk actions do.
    return (
      <>
        <button
          class="primary"
          disabled={busy || sent || job.sourceCount === 0}
          title={job.sourceCount === 0 ? "admitted before the queue kept its document and sources" : "admit the same document and sources again, charged to the user"}
          data-testid="retry-job"
          ref={opener}
          onClick={() => setConfirming(true)}
        >
          Retry…
        </button>
        {confirming && (
          <Modal role="alertdialog" label="Confirm the retry" onClose={() => setConfirming(false)} returnTo={opener}>
            <form
              onSubmit={(e) => {
                e.preventDefault();
                setConfirming(false);
                if (clicked.current) return;
                clicked.current = true;
                setSent(true);
                retry(false);
              }}
            >
              <p data-testid="retry-question">
                Retry job <span class="mono">{shortId(job.jobId)}</span>? A new job is admitted with the same document and sources, and{" "}
                <UserText class="mono" text={job.userId} /> is charged its price ({String(job.price)} credit{job.price === 1n ? "" : "s"}) again.
              </p>
              <div class="actions">
                <button type="button" onClick={() => setConfirming(false)} data-autofocus>
                  Keep it <kbd>Esc</kbd>
                </button>
                <button type="submit" class="primary" disabled={busy} data-testid="retry-job-confirm">
                  Retry and charge
                </button>
              </div>
            </form>
          </Modal>
        )}
      </>
    );
  }
  return (
    <>
      <button disabled={busy} data-testid="retry-again" ref={opener} onClick={() => setAgain(`console-${crypto.randomUUID()}`)}>
        Retry again…
      </button>
      {again !== null && (
        <Modal role="alertdialog" label="Confirm another retry" onClose={() => setAgain(null)} returnTo={opener}>
          <form
            onSubmit={(e) => {
              e.preventDefault();
              retry(true, again);
            }}
          >
            <p data-testid="retry-again-question">
              This job was retried already, as <JobLinks jobIds={job.retriedAsJobIds} />. Retry it once more? A new job is admitted and{" "}
              <UserText class="mono" text={job.userId} /> is charged again.
            </p>
            <div class="actions">
              <button type="button" onClick={() => setAgain(null)} data-autofocus>
                Keep it <kbd>Esc</kbd>
              </button>
              <button type="submit" class="primary" disabled={busy} data-testid="retry-again-confirm">
                Retry again
              </button>
            </div>
          </form>
        </Modal>
      )}
    </>
  );
}

function Step({ label, at, detail, state }: { label: string; at?: Date; detail?: ComponentChildren; state: "done" | "now" | "later" | "bad" | "ended" }) {
  return (
    <li class={`step ${state}`}>
      <span class="dot" />
      <span class="step-label">{label}</span>
      <span class="step-time">{at ? dateTime(at) : ""}</span>
      {detail && <span class="step-detail">{detail}</span>}
    </li>
  );
}

// An active job's page reads it again this often (its run's overdue mark moves with time alone).
const ACTIVE_REREAD_MS = 5000;

export function JobDetail({ jobId, live }: { jobId: string; live: boolean }) {
  const [job, setJob] = useState<Job | null>(null);
  const [version, setVersion] = useState(0);
  const notice = useNotice();
  const { run, busy } = useAction();
  const now = useNow();
  useEffect(() => {
    let current = true;
    queue.getJob({ jobId }).then((r) => current && setJob(r.job ?? null), (error) => current && notice.error(error));
    return () => {
      current = false;
    };
  }, [jobId, version]);
  useEffect(() => setJob(null), [jobId]);
  // Live while the job is active: its user's stream carries every change of it (position, release
  // attempts, running, ended). A (re)opened stream starts with a snapshot, so read the job again
  // then: it may have ended while no stream was open.
  const userId = job?.userId ?? "";
  const active = job !== null && ACTIVE.has(job.status);
  const problem = useLiveStream(
    (signal) => queue.watchJobs({ userId }, { signal }),
    (message, first) => {
      if (message.job?.jobId === jobId) setJob(message.job);
      else if (first) setVersion((v) => v + 1);
    },
    [jobId, userId],
    live && active,
  );
  // Whether its run is overdue changes with time alone, not with a message on the stream: read
  // the job again every few seconds while it is active.
  useEffect(() => {
    if (!live || !active) return;
    const timer = setInterval(() => setVersion((v) => v + 1), ACTIVE_REREAD_MS);
    return () => clearInterval(timer);
  }, [live, active]);
  if (job === null) return <section class="page"><p class="muted">Loading job {shortId(jobId)}…</p></section>;

  const created = date(job.createTime);
  const promoted = date(job.promoteTime);
  const started = date(job.startTime);
  const ended = date(job.endTime);
  const ok = job.status === JobStatus.SUCCEEDED;
  const reload = () => setVersion((v) => v + 1);
  return (
    <section class="page" data-testid="job-detail">
      <p>
        <a href="#/jobs">← Jobs</a>
      </p>
      <h1>
        Job <span class="mono">{job.jobId}</span> <StatusBadge status={job.status} />
      </h1>
      <p class="state-line" data-testid="job-state-line">
        {stateFor(job, now)}
      </p>
      {problem && <p class="problem">{problem}</p>}
      {job.status === JobStatus.RUNNING && job.runOverdue && (
        <p class="warning" data-testid="run-overdue">
          Judging far longer than usual: the core has not confirmed that this run still goes on. No start is promised to the jobs behind it until it
          ends or the core answers for it. <CheckWithCoreButton job={job} onChecked={reload} small />
        </p>
      )}
      {job.status === JobStatus.QUEUED && job.behindOverdueRun && (
        <p class="warning" data-testid="behind-overdue-run">
          No start expected: the job it waits behind judges far longer than usual and the core has not confirmed it still runs.
        </p>
      )}
      {job.status === JobStatus.PENDING && job.lastError && (
        <p class="warning" data-testid="release-retrying">
          The release to the core is being retried (attempt {job.releaseAttempts}: <UserText text={job.lastError} />). The queue keeps trying
          until the release window is over, then fails the job and refunds it.
        </p>
      )}
      <dl class="facts">
        <dt>User</dt>
        <dd>
          <a href={`#/users/${encodeURIComponent(job.userId)}`}>
                  <UserText text={job.userId} />
                </a>
        </dd>
        <dt>Run id</dt>
        <dd class="mono">{job.runId}</dd>
        <dt>Credits</dt>
        <dd>
          {String(job.price)} charged{job.refunded ? ", refunded" : ""}
        </dd>
        {job.retryOfJobId && (
          <>
            <dt>Retry of</dt>
            <dd data-testid="retry-of">
              <JobLinks jobIds={[job.retryOfJobId]} />
            </dd>
          </>
        )}
        {job.retriedAsJobIds.length > 0 && (
          <>
            <dt>Retried as</dt>
            <dd data-testid="retried-as">
              <JobLinks jobIds={job.retriedAsJobIds} />
            </dd>
          </>
        )}
        {job.status === JobStatus.CANCELED && (
          <>
            <dt>Canceled by</dt>
            <dd data-testid="canceled-by" data-actor={job.canceledBy}>
              {job.canceledBy ? <UserText text={canceler(job.canceledBy)} /> : <span class="muted">not recorded (the core's own cancel, or canceled before the queue kept it)</span>}
            </dd>
          </>
        )}
        {job.deltaOfJobId && (
          <>
            <dt>Re-checks</dt>
            <dd>
              <a href={`#/jobs/${job.deltaOfJobId}`} class="mono">
                {shortId(job.deltaOfJobId)}
              </a>
            </dd>
          </>
        )}
        <dt>Document</dt>
        <dd data-testid="job-document">
          {job.document ? (
            <>
              {job.document.title && (
                <strong>
                  <UserText text={job.document.title} />
                </strong>
              )}{" "}
              <UserText class="mono break" text={job.document.uri} />
            </>
          ) : (
            <span class="muted">{job.deltaOfJobId ? "the re-checked job's" : "not stored (admitted before the queue kept it)"}</span>
          )}
        </dd>
        {job.status === JobStatus.QUEUED && (
          <>
            <dt>Position</dt>
            <dd>
              {job.queuePosition}, waiting for <a href={`#/jobs/${job.waitingForJobId}`} class="mono">{shortId(job.waitingForJobId)}</a>
            </dd>
          </>
        )}
      </dl>
      {job.sourceCount > 0 && (
        <>
          <h2>
            Sources <span class="count">({job.sourceCount})</span>
          </h2>
          <ol class="sources" data-testid="job-sources">
            {job.sources.map((source) => (
              <li>
                {source.doi && (
                  <a class="mono" href={`https://doi.org/${source.doi}`} rel="noreferrer noopener" target="_blank">
                    <UserText text={source.doi} />
                  </a>
                )}
                {source.doi && source.citation ? " · " : ""}
                <UserText class="citation" text={source.citation} />
              </li>
            ))}
          </ol>
          {job.sourceCount > job.sources.length && (
            <p class="muted" data-testid="more-sources">
              and {job.sourceCount - job.sources.length} more (the console shows the first {job.sources.length})
            </p>
          )}
        </>
      )}
      <h2>Timeline</h2>
      <ol class="timeline">
        <Step label="Admitted" at={created} state="done" />
        <Step label="Promoted (took a slot)" at={promoted} state={promoted ? "done" : active ? "now" : "later"} />
        <Step
          label={`Release attempts: ${job.releaseAttempts}`}
          detail={job.status === JobStatus.PENDING && job.lastError ? <>last error: <UserText text={job.lastError} /></> : undefined}
          state={started ? "done" : job.status === JobStatus.PENDING ? "now" : "later"}
        />
        <Step
          label="Running"
          at={started}
          detail={started && !ended ? `for ${duration(now - started.getTime())}` : undefined}
          state={started ? (ended ? "done" : "now") : "later"}
        />
        <Step
          label={ended ? `Ended ${STATUS_LABELS[job.status]}` : "Ended"}
          at={ended}
          detail={
            ended && job.status === JobStatus.CANCELED
              ? <UserText text={canceledText(job)} />
              : ended && job.lastError
                ? <UserText text={job.lastError} />
                : started && ended
                  ? `judged in ${duration(ended.getTime() - started.getTime())}`
                  : undefined
          }
          state={ended ? (ok ? "done" : job.status === JobStatus.CANCELED ? "ended" : "bad") : "later"}
        />
      </ol>
      <div class="actions left">
        <button onClick={reload}>Refresh</button>
        {active && <CancelJobButton job={job} onCanceled={reload} />}
        {active && <CheckWithCoreButton job={job} onChecked={reload} />}
        {job.status === JobStatus.PENDING && (
          <button
            disabled={busy}
            onClick={() =>
              run(async () => {
                const r = await queue.release({ jobId: job.jobId });
                reload();
                const after = r.job!;
                // The call answers with the job either way: a job still PENDING was not released.
                if (after.status === JobStatus.PENDING) {
                  throw new Problem(
                    `Release failed: the job is still pending after attempt ${after.releaseAttempts}${after.lastError ? `: ${after.lastError}` : ""}; the queue keeps retrying it`,
                  );
                }
                return `Released: the job is ${STATUS_LABELS[after.status]}`;
              })
            }
          >
            Release now
          </button>
        )}
        {RETRYABLE.has(job.status) && <RetryButtons job={job} onRetried={reload} />}
      </div>
      <JobLedger jobId={job.jobId} version={`${version}-${job.status}-${job.refunded}`} />
    </section>
  );
}

/** "Check with the core now" (OperatorService.CheckJobWithCore): asks the core about the job's run
 * at once, as the sweeper would after QUEUE_RECONCILE_AFTER_SECONDS; a run the core forgot fails
 * the job (refunded), a run that ended there ends the job. */
export function CheckWithCoreButton({ job, onChecked, small }: { job: Job; onChecked: () => void; small?: boolean }) {
  const { run, busy } = useAction();
  return (
    <button
      class={small ? "small" : ""}
      disabled={busy}
      data-testid="check-with-core"
      title="Ask the core about this job's run now, instead of waiting for the reconciliation"
      onClick={() =>
        run(async () => {
          const r = await operator.checkJobWithCore({ jobId: job.jobId });
          onChecked();
          return `Checked with the core (job ${shortId(job.jobId)}): ${r.outcome}`;
        })
      }
    >
      Check with the core now
    </button>
  );
}

/** The job's credit movements: its charge and, once, its refund. */
function JobLedger({ jobId, version }: { jobId: string; version: string }) {
  const { entries, refusal } = useLedger("", jobId, version, 20, "", true);
  return (
    <>
      <h2>Credits</h2>
      <LedgerPanel entries={entries} refusal={refusal} showUser={false} showJob={false} />
    </>
  );
}
