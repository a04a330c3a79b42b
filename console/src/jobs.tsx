import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { useEffect, useState } from "preact/hooks";

import { date, operator, queue } from "./api.js";
import { ACTIVE, dateTime, duration, shortId, STATUS_LABELS } from "./format.js";
import { go, useNow } from "./hooks.js";
import { useAction, useNotice } from "./notice.js";
import { useLiveStream } from "./stream.js";
import { type Job, JobStatus } from "./gen/acurio/queue/v1/job_pb.js";
import { JobFilterSchema, type JobFilter } from "./gen/acurio/queue/v1/operator_service_pb.js";

const STATUS_BY_NAME = new Map(Object.entries(STATUS_LABELS).map(([value, name]) => [name, Number(value) as JobStatus]));

function filterFrom(params: URLSearchParams): JobFilter {
  const filter = create(JobFilterSchema, {
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

function BulkCancel({ filter, onDone }: { filter: JobFilter; onDone: () => void }) {
  const [count, setCount] = useState<{ matched: number; more: boolean } | null>(null);
  const { run, busy } = useAction();
  const ask = () =>
    run(async () => {
      const response = await operator.cancelJobs({ filter, dryRun: true });
      setCount({ matched: response.matched, more: response.moreThanCounted });
    });
  const confirm = () =>
    run(async () => {
      const response = await operator.cancelJobs({ filter, maxJobs: count!.matched });
      setCount(null);
      onDone();
      const failed = response.failures.length;
      return `Canceled ${response.canceled} jobs (refunded)${failed ? `; ${failed} could not be canceled: ${response.failures[0].reason}` : ""}`;
    });
  return (
    <>
      <button onClick={ask} disabled={busy} data-testid="bulk-cancel">
        Cancel matching…
      </button>
      {count !== null && (
        <div class="dialog-backdrop" onClick={() => setCount(null)}>
          <div class="dialog" role="alertdialog" aria-label="Confirm bulk cancel" onClick={(e) => e.stopPropagation()}>
            {count.matched === 0 ? (
              <p>No queued, pending or running job matches this filter.</p>
            ) : (
              <p data-testid="bulk-cancel-count">
                Cancel <strong>{count.matched}</strong> {count.matched === 1 ? "job" : "jobs"}
                {count.more ? " (the first 1000 of more)" : ""}? Each is canceled at the core and refunded; ended jobs are
                not touched.
              </p>
            )}
            <div class="actions">
              <button onClick={() => setCount(null)} autoFocus>
                Keep them
              </button>
              {count.matched > 0 && (
                <button class="danger" onClick={confirm} disabled={busy} data-testid="bulk-cancel-confirm">
                  Cancel {count.matched} {count.matched === 1 ? "job" : "jobs"}
                </button>
              )}
            </div>
          </div>
        </div>
      )}
    </>
  );
}

export function JobsPage({ params, live }: { params: URLSearchParams; live: boolean }) {
  const [jobs, setJobs] = useState<Job[]>([]);
  const [tokens, setTokens] = useState<string[]>([""]); // page tokens: the first page's, then each next one
  const [next, setNext] = useState("");
  const [loaded, setLoaded] = useState(false);
  const [refresh, setRefresh] = useState(0);
  const notice = useNotice();
  const filter = filterFrom(params);
  const key = params.toString();
  const pageToken = tokens[tokens.length - 1];

  useEffect(() => setTokens([""]), [key]);
  useEffect(() => {
    let current = true;
    operator
      .searchJobs({ filter, pageSize: 25, pageToken })
      .then((page) => {
        if (!current) return;
        setJobs(page.jobs);
        setNext(page.nextPageToken);
        setLoaded(true);
      })
      .catch((error) => current && notice.error(error));
    return () => {
      current = false;
    };
  }, [key, pageToken, refresh]);

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
      <form class="filters" onSubmit={(e) => e.preventDefault()}>
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
            data-search
            placeholder="user id  (press /)"
            value={params.get("user") ?? ""}
            onChange={(e) => update({ user: e.currentTarget.value.trim() })}
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
        <BulkCancel filter={filter} onDone={() => setRefresh((n) => n + 1)} />
      </form>
      <table class="jobs">
        <thead>
          <tr>
            <th>Job</th>
            <th>User</th>
            <th>Status</th>
            <th class="num">Position</th>
            <th>Admitted</th>
            <th class="num">Releases</th>
            <th>Last error</th>
          </tr>
        </thead>
        <tbody>
          {jobs.map((job) => (
            <tr data-testid="job-row" tabIndex={0} onKeyDown={(e) => e.key === "Enter" && go(`jobs/${job.jobId}`)}>
              <td>
                <a href={`#/jobs/${job.jobId}`} class="mono">
                  {shortId(job.jobId)}
                </a>
              </td>
              <td>
                <a href={`#/users/${encodeURIComponent(job.userId)}`}>{job.userId}</a>
              </td>
              <td>
                <StatusBadge status={job.status} />
              </td>
              <td class="num">{job.queuePosition || ""}</td>
              <td>{dateTime(date(job.createTime))}</td>
              <td class="num">{job.releaseAttempts}</td>
              <td class="error-text">{job.lastError}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {loaded && jobs.length === 0 && <p class="muted">No job matches these filters.</p>}
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

function Step({ label, at, detail, state }: { label: string; at?: Date; detail?: string; state: "done" | "now" | "later" | "bad" }) {
  return (
    <li class={`step ${state}`}>
      <span class="dot" />
      <span class="step-label">{label}</span>
      <span class="step-time">{at ? dateTime(at) : ""}</span>
      {detail && <span class="step-detail">{detail}</span>}
    </li>
  );
}

export function JobDetail({ jobId }: { jobId: string }) {
  const [job, setJob] = useState<Job | null>(null);
  const [version, setVersion] = useState(0);
  const notice = useNotice();
  const { run, busy } = useAction();
  const now = useNow();
  useEffect(() => {
    queue.getJob({ jobId }).then((r) => setJob(r.job ?? null), notice.error);
  }, [jobId, version]);
  if (job === null) return <section class="page"><p class="muted">Loading job {shortId(jobId)}…</p></section>;

  const created = date(job.createTime);
  const promoted = date(job.promoteTime);
  const started = date(job.startTime);
  const ended = date(job.endTime);
  const ok = job.status === JobStatus.SUCCEEDED;
  const active = ACTIVE.has(job.status);
  const reload = () => setVersion((v) => v + 1);
  return (
    <section class="page" data-testid="job-detail">
      <p>
        <a href="#/jobs">← Jobs</a>
      </p>
      <h1>
        Job <span class="mono">{job.jobId}</span> <StatusBadge status={job.status} />
      </h1>
      <dl class="facts">
        <dt>User</dt>
        <dd>
          <a href={`#/users/${encodeURIComponent(job.userId)}`}>{job.userId}</a>
        </dd>
        <dt>Run id</dt>
        <dd class="mono">{job.runId}</dd>
        <dt>Credits</dt>
        <dd>
          {String(job.price)} charged{job.refunded ? ", refunded" : ""}
        </dd>
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
        {job.status === JobStatus.QUEUED && (
          <>
            <dt>Position</dt>
            <dd>
              {job.queuePosition}, waiting for <a href={`#/jobs/${job.waitingForJobId}`} class="mono">{shortId(job.waitingForJobId)}</a>
            </dd>
          </>
        )}
      </dl>
      <h2>Timeline</h2>
      <ol class="timeline">
        <Step label="Admitted" at={created} state="done" />
        <Step label="Promoted (took a slot)" at={promoted} state={promoted ? "done" : active ? "now" : "later"} />
        <Step
          label={`Release attempts: ${job.releaseAttempts}`}
          detail={job.status === JobStatus.PENDING && job.lastError ? `last error: ${job.lastError}` : undefined}
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
          detail={ended && job.lastError ? job.lastError : started && ended ? `judged in ${duration(ended.getTime() - started.getTime())}` : undefined}
          state={ended ? (ok ? "done" : "bad") : "later"}
        />
      </ol>
      <div class="actions left">
        <button onClick={reload}>Refresh</button>
        {active && (
          <button
            class="danger"
            disabled={busy}
            data-testid="cancel-job"
            onClick={() =>
              run(async () => {
                await queue.cancelJob({ jobId: job.jobId, userId: job.userId });
                reload();
                return `Canceled job ${shortId(job.jobId)}; its credit is refunded`;
              })
            }
          >
            Cancel
          </button>
        )}
        {job.status === JobStatus.PENDING && (
          <button
            disabled={busy}
            onClick={() =>
              run(async () => {
                const r = await queue.release({ jobId: job.jobId });
                reload();
                return `Release attempted: the job is ${STATUS_LABELS[r.job!.status]}`;
              })
            }
          >
            Release now
          </button>
        )}
      </div>
    </section>
  );
}
