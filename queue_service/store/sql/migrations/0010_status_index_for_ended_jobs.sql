-- The operator search's status index (migration 0005) covers ended jobs only.
--
-- Over a long history almost every row has ended, so PostgreSQL's statistics put 'pending' and
-- 'running' near zero rows, and the whole-table (status, ...) index looked as cheap as the
-- partial index of the user's active jobs for the job view's per-user subqueries ("the user's
-- active job", "active since"). When the planner picked it, each subquery walked every active job
-- of every user: ListJobs and the searches went from 0.4 to 17-27 ms of PostgreSQL CPU per call,
-- and the admit (whose section returns the view) from 1.2 to 3.7-4.6 ms, in 2 of 3 benchmark runs
-- on a million ended jobs (docs/scaling.md §8). Limited to ended statuses, the index cannot serve
-- those subqueries; a search within an active status uses that status's partial index
-- (queued_in_order, release_due, reconcile_due), whose size follows the jobs in flight. Status
-- changes of active jobs no longer write entries into it either.
--
-- Additive for running replicas: the queries are unchanged, only their plans.

DROP INDEX analysis_jobs_status_newest_admitted;

CREATE INDEX analysis_jobs_ended_status_newest_admitted
    ON analysis_jobs (status, create_time DESC, job_id DESC)
    WHERE status IN ('succeeded', 'failed', 'canceled');
