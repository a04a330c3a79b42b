-- Every change a job's view shows is announced to WatchJobs streams.
--
-- The update trigger fired only on `status` and `last_error`, so a release attempt
-- (`release_attempts`, counted when a replica claims it) and a refund without a status change
-- (`queue_refund_failed_job`: a cancel applied to a job that had already ended FAILED) never
-- reached the streams, whose last message then differed from GetJob for good. The trigger now
-- also fires on `release_attempts`, and that refund announces the job itself, with the payload
-- the trigger builds (`analysis_jobs_announce`). The other view fields that change without this
-- row changing (`queue_position`, `waiting_for_job_id`) follow other jobs' status changes, and
-- the watch hub re-reads them then.
--
-- Additive: the payload is the one of 0001; functions keep their signatures.

-- One place builds the job-change notice, for the trigger and for changes that touch no job row.
CREATE FUNCTION analysis_jobs_announce(p_job analysis_jobs, p_old_status text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(
        'analysis_job_changes',
        json_build_object(
            'user_id', p_job.user_id,
            'job_id', p_job.job_id,
            'status', p_job.status,
            'old_status', p_old_status,
            'release_claimed', p_job.status = 'pending' AND p_job.release_attempts > 0
        )::text);
END
$$;

CREATE OR REPLACE FUNCTION analysis_jobs_announce_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM analysis_jobs_announce(NEW, CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END);
    RETURN NULL;
END
$$;

DROP TRIGGER analysis_jobs_announce_update ON analysis_jobs;
CREATE TRIGGER analysis_jobs_announce_update
    AFTER UPDATE ON analysis_jobs
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          OR OLD.last_error IS DISTINCT FROM NEW.last_error
          OR OLD.release_attempts IS DISTINCT FROM NEW.release_attempts)
    EXECUTE FUNCTION analysis_jobs_announce_change();

-- As in 0009, and the refund, which changes no column of the job, is announced.
CREATE OR REPLACE FUNCTION queue_refund_failed_job(p_job_id uuid, p_actor text, p_reason text)
RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
LANGUAGE plpgsql AS $$
DECLARE
    v_job analysis_jobs%ROWTYPE;
    v_amount integer;
BEGIN
    SELECT * INTO v_job FROM analysis_jobs a WHERE a.job_id = p_job_id AND a.status = 'failed';
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
