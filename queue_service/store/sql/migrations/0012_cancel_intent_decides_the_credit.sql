-- A cancel the user asked for is recorded before the core is asked, and decides the credit.
--
-- `cancel_requested_at`: set (fenced to a PENDING or RUNNING job) before CancelJob asks the core
-- to cancel the run. Whichever answer or callback ends the job afterwards sees it: an ending in
-- FAILED of a job whose user asked to cancel is refunded even when the report itself does not
-- refund (the core's `CompleteRun(FAILED, refund_credit=false)` for the run it canceled), so a
-- lost CancelRun answer can no longer leave a job the user canceled charged. The refund's reason
-- is `cancel`. A run that succeeded keeps its charge.
--
-- Additive: replicas of the previous version neither set nor read the column (a job they end
-- FAILED after the intent was recorded is refunded by the next CancelJob); `queue_end_job` keeps
-- its signature.

ALTER TABLE analysis_jobs ADD COLUMN cancel_requested_at timestamptz;

-- As in 0009, and a FAILED ending of a job whose user asked to cancel is refunded (reason `cancel`).
CREATE OR REPLACE FUNCTION queue_end_job(
    p_job_id uuid,
    p_status text,
    p_from_statuses text[],
    p_last_error text,
    p_expected_attempts integer,
    p_run_unsettled boolean,
    p_refund boolean,
    p_actor text,
    p_reason text,
    p_default_max_active integer,
    p_release_window_seconds double precision,
    p_lease_seconds double precision
) RETURNS TABLE(row_kind text, out_job_id uuid, out_user_id text, out_run_id uuid, out_status text,
                out_delta_of_job_id uuid, out_run_unsettled boolean, out_refunded integer)
LANGUAGE plpgsql AS $$
DECLARE
    ended analysis_jobs%ROWTYPE;
BEGIN
    UPDATE analysis_jobs a
       SET status = p_status,
           end_time = clock_timestamp(),
           last_error = CASE WHEN p_last_error <> '' THEN p_last_error ELSE a.last_error END,
           next_release_at = NULL,
           next_reconcile_at = NULL,
           run_settle_due_at = CASE WHEN p_run_unsettled THEN clock_timestamp() END
     WHERE a.job_id = p_job_id
       AND a.status = ANY(p_from_statuses)
       AND (p_expected_attempts IS NULL OR a.release_attempts = p_expected_attempts)
    RETURNING a.* INTO ended;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT 'ended', ended.job_id, ended.user_id, ended.run_id, ended.status, ended.delta_of_job_id,
                        ended.run_settle_due_at IS NOT NULL,
                        CASE
                            WHEN p_refund THEN queue_refund_job_charge(ended.job_id, p_actor, p_reason)
                            WHEN ended.status = 'failed' AND ended.cancel_requested_at IS NOT NULL
                                THEN queue_refund_job_charge(ended.job_id, p_actor, 'cancel')
                            ELSE 0
                        END;
    IF NOT p_run_unsettled THEN
        RETURN QUERY SELECT 'promoted', p.promoted_job_id, ended.user_id, p.promoted_run_id, 'pending'::text,
                            NULL::uuid, false, 0
                       FROM queue_promote_queued_jobs(ended.user_id, p_default_max_active, p_release_window_seconds, p_lease_seconds) AS p;
    END IF;
END
$$;
