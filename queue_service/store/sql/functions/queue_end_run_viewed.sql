-- queue_end_run_viewed: the function.
-- requires: analysis_job_views
--
-- Why, migration by migration (its text below is the last one's):
-- * 0011 (completion finds its job under the lock): Ends the job of run `p_run_id` as the core
--   reported (from PENDING or RUNNING; refund when asked; promotion into the freed slots), if the
--   caller holds the lock of that job's user (`p_locked_user_id`, the user the statement locked).
--   Rows, each with the job's view: 'ended' then a 'promoted' row per promoted job: the job was
--   active and is ended now; 'owner': the job was not active (QUEUED, or ended already:
--   run_unsettled says whether its run still waits for the core's word); 'reserved' (no view): no
--   job yet, but an admit has reserved the run and not committed; also when the admit committed
--   after the statement began (its user's lock is not held); 'unknown' (no view): no job owns the
--   run and none is being admitted.
-- * 0037 (completion of a run never released): A PENDING job waiting for the fleet's capacity
--   (`capacity_wait_since` set, no `capacity_token`) has not had its run released since it began
--   to wait, so the core holds that run and cannot have judged it: like a QUEUED job's, its
--   completion ends nothing ('owner'; the caller answers RUN_NOT_RELEASED). Ending it would leave
--   the held run at the core with no live job (I10) and charge work never done.

CREATE OR REPLACE FUNCTION public.queue_end_run_viewed(p_run_id uuid, p_locked_user_id text, p_status text, p_last_error text, p_refund boolean, p_actor text, p_reason text, p_default_max_active integer, p_release_window_seconds double precision, p_lease_seconds double precision)
 RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_job_id uuid;
    v_user_id text;
    v_status text;
    v_waiting_for_capacity boolean;
    v_run_unsettled boolean;
    v_reserved boolean;
BEGIN
    -- The job and the reservation in one snapshot: the admit that commits the job deletes the
    -- reservation, so one of the two is seen unless neither exists.
    SELECT j.job_id, j.user_id, j.status, j.capacity_wait_since IS NOT NULL AND j.capacity_token IS NULL,
           j.run_settle_due_at IS NOT NULL,
           EXISTS (SELECT 1 FROM run_reservations r WHERE r.run_id = p_run_id)
      INTO v_job_id, v_user_id, v_status, v_waiting_for_capacity, v_run_unsettled, v_reserved
      FROM (SELECT 1) AS one
      LEFT JOIN analysis_jobs j ON j.run_id = p_run_id;
    IF v_job_id IS NULL OR v_user_id IS DISTINCT FROM p_locked_user_id THEN
        RETURN QUERY SELECT CASE WHEN v_job_id IS NOT NULL OR v_reserved THEN 'reserved' ELSE 'unknown' END,
                            0, false, NULL::analysis_job_views;
        RETURN;
    END IF;
    IF v_status = 'running' OR (v_status = 'pending' AND NOT v_waiting_for_capacity) THEN
        -- Read under the lock, so the ending cannot be fenced out.
        RETURN QUERY SELECT * FROM queue_end_job_viewed(
            v_job_id, p_status, ARRAY['pending', 'running'], p_last_error, NULL, false, p_refund, p_actor,
            p_reason, p_default_max_active, p_release_window_seconds, p_lease_seconds);
        RETURN;
    END IF;
    RETURN QUERY SELECT 'owner'::text, 0, v_run_unsettled, v
                   FROM analysis_job_views v WHERE v.job_id = v_job_id;
END
$function$;
