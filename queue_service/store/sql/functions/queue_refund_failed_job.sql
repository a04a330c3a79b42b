-- queue_refund_failed_job: the function.
-- requires: analysis_job_views
--
-- Why, migration by migration (its text below is the last one's):
-- * 0009 (locked sections in one statement): A job the user canceled is never charged: refunds it
--   if it ended FAILED (a completion that won the race with the cancel). A 'refunded' row with the
--   amount (0: no charge, or already refunded); none when the job did not fail.
-- * 0013 (every view change announced): As in 0009, and the refund, which changes no column of the
--   job, is announced.
-- * 0015 (job change feed): As in 0013, and the job's row is locked before the refund records the
--   change, as an UPDATE would have locked it: the feed row's id is drawn after every earlier
--   change of the job has committed.

CREATE OR REPLACE FUNCTION public.queue_refund_failed_job(p_job_id uuid, p_actor text, p_reason text)
 RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
 LANGUAGE plpgsql
AS $function$
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
$function$;
