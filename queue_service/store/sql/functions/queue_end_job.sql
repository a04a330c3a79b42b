-- queue_end_job: the function.
--
-- Why, migration by migration (its text below is the last one's):
-- * 0008 (locked sections in one call): Ends a job if it is still in one of the expected statuses
--   (and, when given, still at the release attempt the caller saw), refunds it when asked, and,
--   when its run is settled, promotes the user's next jobs into the freed slots. With
--   `p_run_unsettled` the job keeps its slot (if it has one) until the core confirms its run
--   settled, and a CancelRun is due at once. Returns nothing when the job was not in an expected
--   status (fenced); else one row of kind 'ended' (the job, and the refunded amount) followed by
--   one row of kind 'promoted' per promoted job.
-- * 0012 (cancel intent decides the credit): As in 0009, and a FAILED ending of a job whose user
--   asked to cancel is refunded (reason `cancel`).
-- * 0027 (retry lineage and cancel actor): A job ended CANCELED by a cancel (reason `cancel`)
--   records who asked (`canceled_by`, the ending's actor) unless the recorded intent named them
--   already: the sweeper that ends a waiting job for its user is not the one who canceled it.
-- * 0040 (the seat's release fence and timer): the ended job's release timer is cleared with the
--   value queue_seat_on_exit gives.

CREATE OR REPLACE FUNCTION public.queue_end_job(p_job_id uuid, p_status text, p_from_statuses text[], p_last_error text, p_expected_attempts integer, p_run_unsettled boolean, p_refund boolean, p_actor text, p_reason text, p_default_max_active integer, p_release_window_seconds double precision, p_lease_seconds double precision)
 RETURNS TABLE(row_kind text, out_job_id uuid, out_user_id text, out_run_id uuid, out_status text, out_delta_of_job_id uuid, out_run_unsettled boolean, out_refunded integer)
 LANGUAGE plpgsql
AS $function$
DECLARE
    ended analysis_jobs%ROWTYPE;
BEGIN
    UPDATE analysis_jobs a
       SET status = p_status,
           end_time = clock_timestamp(),
           last_error = CASE WHEN p_last_error <> '' THEN p_last_error ELSE a.last_error END,
           next_release_at = queue_seat_on_exit(),
           next_reconcile_at = NULL,
           run_settle_due_at = CASE WHEN p_run_unsettled THEN clock_timestamp() END,
           canceled_by = CASE WHEN p_status = 'canceled' AND p_reason = 'cancel' THEN COALESCE(a.canceled_by, p_actor)
                              ELSE a.canceled_by END
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
$function$;
