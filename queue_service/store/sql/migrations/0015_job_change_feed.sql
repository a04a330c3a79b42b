-- Job changes go to a feed table instead of NOTIFY (every change 0013 announces).
--
-- A transaction that has called NOTIFY takes one cluster-wide lock at commit and holds it through
-- its WAL flush, so every notifying commit in the cluster ran one at a time (docs/scaling.md §5).
-- The trigger now appends a row to `analysis_job_feed`: an ordinary insert, which commits like
-- any other write and shares WAL flushes with the rest. Each replica reads the rows that became
-- visible since its previous read (`job_feed_since` in queries.sql: by the transaction id of
-- each row, against the snapshot of that read), so no row is passed over while the transaction
-- that wrote it is still in flight, whatever the order of the commits.
--
-- `xid`: the writing transaction (`pg_current_xact_id()`, 64 bits, never wraps). `change_id`:
-- drawn from a sequence inside the trigger, while the job's row is locked, so a job's changes
-- carry increasing ids in the order they committed; a reader hands on what it read in that
-- order. The sweeper deletes rows of transactions that ended more than a retention ago
-- (`trim_job_feed`).
--
-- Replicas of the previous version LISTEN for notices that no longer come: their WatchJobs
-- streams go quiet until those replicas are replaced (their clients resync on reconnecting),
-- and their dispatchers fall back to their own timers and the sweeper.

CREATE TABLE analysis_job_feed (
    xid             xid8 NOT NULL DEFAULT pg_current_xact_id(),
    change_id       bigint GENERATED ALWAYS AS IDENTITY (CACHE 1),
    change_time     timestamptz NOT NULL DEFAULT clock_timestamp(),
    job_id          uuid NOT NULL,
    user_id         text NOT NULL,
    status          text NOT NULL,
    old_status      text,
    release_claimed boolean NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 20000, autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 20000);

-- The reads (rows of transactions not yet visible at the previous read) and the trim (rows of
-- transactions older than a mark) are both ranges of xid.
CREATE INDEX analysis_job_feed_by_xid ON analysis_job_feed (xid);

-- The one place that records a job's change (migration 0013): for the trigger, which holds the
-- job's row lock from its UPDATE, and for a refund without a status change.
CREATE OR REPLACE FUNCTION analysis_jobs_announce(p_job analysis_jobs, p_old_status text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO analysis_job_feed (job_id, user_id, status, old_status, release_claimed)
    VALUES (p_job.job_id, p_job.user_id, p_job.status, p_old_status,
            p_job.status = 'pending' AND p_job.release_attempts > 0);
END
$$;

-- As in 0013, and the job's row is locked before the refund records the change, as an UPDATE
-- would have locked it: the feed row's id is drawn after every earlier change of the job has
-- committed.
CREATE OR REPLACE FUNCTION queue_refund_failed_job(p_job_id uuid, p_actor text, p_reason text)
RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
LANGUAGE plpgsql AS $$
DECLARE
    v_job analysis_jobs%ROWTYPE;
    v_amount integer;
BEGIN
    SELECT * INTO v_job FROM analysis_jobs a WHERE a.job_id = p_job_id AND a.status = 'failed' FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    v_amount := queue_refund_job_charge(p_job_id, p_actor, p_reason);
    IF v_amount > 0 THEN
        PERFORM analysis_jobs_announce(v_job, v_job.status);
    END IF;
    RETURN QUERY SELECT 'refunded'::text, v_amount, false, v FROM analysis_job_views v WHERE v.job_id = p_job_id;
END
$$;
