-- Settled runs (docs/design.md, "Settled runs"): a user's slot is free for the next job only when
-- the core has confirmed that the previous job's run is not judging. A job that ends while its
-- run may still judge (a release given up after answers were lost, a run the core no longer
-- finds) keeps its slot, with `run_settle_due_at` set, until a CancelRun answer, a CompleteRun or
-- a GetRun confirms the run settled. A canceled QUEUED job keeps only the duty to cancel its held
-- run (it has no slot).

ALTER TABLE analysis_jobs
    ADD COLUMN run_settle_due_at timestamptz,
    ADD COLUMN run_settle_attempts integer NOT NULL DEFAULT 0,
    ADD CONSTRAINT analysis_jobs_only_ended_jobs_settle
        CHECK (run_settle_due_at IS NULL OR status IN ('succeeded', 'failed', 'canceled'));

CREATE INDEX analysis_jobs_run_settle_due
    ON analysis_jobs (run_settle_due_at)
    WHERE run_settle_due_at IS NOT NULL;

-- The database backstop for I1 and I9: an ended job whose run is not settled still holds its slot.
DROP INDEX analysis_jobs_one_holder_per_slot;
CREATE UNIQUE INDEX analysis_jobs_one_holder_per_slot
    ON analysis_jobs (user_id, slot)
    WHERE (status IN ('pending', 'running') OR run_settle_due_at IS NOT NULL) AND delta_of_job_id IS NULL;

-- Replaces 0002's definition: slot holders now include ended jobs whose run is not settled.
CREATE OR REPLACE FUNCTION analysis_jobs_free_slot(p_user_id text, p_default_max_active integer) RETURNS integer
LANGUAGE sql STABLE AS $$
    WITH lim AS (
        SELECT COALESCE((SELECT l.max_active FROM user_queue_limits l WHERE l.user_id = p_user_id),
                        p_default_max_active) AS max_active
    ),
    holders AS (
        SELECT a.slot FROM analysis_jobs a
         WHERE a.user_id = p_user_id AND a.delta_of_job_id IS NULL AND a.slot IS NOT NULL
           AND (a.status IN ('pending', 'running') OR a.run_settle_due_at IS NOT NULL)
    )
    SELECT s
      FROM lim, generate_series(1, lim.max_active) AS s
     WHERE (SELECT count(*) FROM holders) < lim.max_active
       AND s NOT IN (SELECT slot FROM holders)
     ORDER BY s
     LIMIT 1
$$;

-- A run id handed to the core's CreateRun before the admit that reserved it has committed. The
-- admit's INSERT consumes the row; a row left behind (the admit failed, its process died, or the
-- CreateRun's outcome was never learned) means the run may exist at the core with no job: it is
-- canceled, first by the failed admit itself, else by the sweeper once `cancel_after` passes.
-- `canceling` fences the two: an admit can no longer commit a run that is being canceled.
CREATE TABLE run_reservations (
    run_id          uuid PRIMARY KEY,
    user_id         text NOT NULL,
    create_time     timestamptz NOT NULL DEFAULT clock_timestamp(),
    cancel_after    timestamptz NOT NULL,
    canceling       boolean NOT NULL DEFAULT false,
    cancel_attempts integer NOT NULL DEFAULT 0
);

CREATE INDEX run_reservations_cancel_due ON run_reservations (cancel_after);
