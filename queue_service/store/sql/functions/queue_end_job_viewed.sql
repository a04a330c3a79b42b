-- queue_end_job_viewed: the function.
-- requires: analysis_job_views
--
-- Why, migration by migration (its text below is the last one's):
-- * 0009 (locked sections in one statement): Ends a job as `queue_end_job` does (fenced by its
--   expected statuses and attempt; refund when asked; promotion into the freed slots when its run
--   is settled). Returns nothing when fenced; else an 'ended' row (the refunded amount, whether the
--   run is unsettled, the job's view after the change) followed by a 'promoted' row per promoted
--   job.

CREATE OR REPLACE FUNCTION public.queue_end_job_viewed(p_job_id uuid, p_status text, p_from_statuses text[], p_last_error text, p_expected_attempts integer, p_run_unsettled boolean, p_refund boolean, p_actor text, p_reason text, p_default_max_active integer, p_release_window_seconds double precision, p_lease_seconds double precision)
 RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_ending record;
    v_ended_refund integer;
    v_ended_unsettled boolean;
    v_promoted uuid[] := '{}';
BEGIN
    FOR v_ending IN
        SELECT * FROM queue_end_job(p_job_id, p_status, p_from_statuses, p_last_error, p_expected_attempts,
                                    p_run_unsettled, p_refund, p_actor, p_reason, p_default_max_active,
                                    p_release_window_seconds, p_lease_seconds)
    LOOP
        IF v_ending.row_kind = 'ended' THEN
            v_ended_refund := v_ending.out_refunded;
            v_ended_unsettled := v_ending.out_run_unsettled;
        ELSE
            v_promoted := v_promoted || v_ending.out_job_id;
        END IF;
    END LOOP;
    IF v_ended_refund IS NULL THEN
        RETURN;
    END IF;
    -- Each RETURN QUERY is a statement of its own: it sees the ending and the promotions.
    RETURN QUERY SELECT 'ended'::text, v_ended_refund, v_ended_unsettled, v
                   FROM analysis_job_views v WHERE v.job_id = p_job_id;
    RETURN QUERY SELECT * FROM queue_promoted_views(v_promoted);
END
$function$;
