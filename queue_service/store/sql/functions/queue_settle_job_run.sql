-- queue_settle_job_run: the function.
-- requires: analysis_job_views
--
-- Why, migration by migration (its text below is the last one's):
-- * 0009 (locked sections in one statement): The core confirmed an ended job's run settled: the job
--   lets go of its slot, and the user's next jobs are promoted into every free slot. The user is
--   the one whose lock the caller holds. A 'settled' row when the run was unsettled until now, then
--   a 'promoted' row per promoted job.

CREATE OR REPLACE FUNCTION public.queue_settle_job_run(p_job_id uuid, p_user_id text, p_default_max_active integer, p_release_window_seconds double precision, p_lease_seconds double precision)
 RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
 LANGUAGE plpgsql
AS $function$
BEGIN
    UPDATE analysis_jobs a
       SET run_settle_due_at = NULL
     WHERE a.job_id = p_job_id AND a.user_id = p_user_id AND a.run_settle_due_at IS NOT NULL;
    IF FOUND THEN
        RETURN QUERY SELECT 'settled'::text, 0, false, v FROM analysis_job_views v WHERE v.job_id = p_job_id;
    END IF;
    RETURN QUERY SELECT * FROM queue_promote_viewed(p_user_id, p_default_max_active, p_release_window_seconds, p_lease_seconds);
END
$function$;
