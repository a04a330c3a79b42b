-- queue_promote_viewed: the function.
-- requires: analysis_job_views
--
-- Why, migration by migration (its text below is the last one's):
-- * 0009 (locked sections in one statement): Fills every free slot of the user from the queue,
--   oldest first, each promoted job's first release claimed for the calling replica
--   (`queue_promote_queued_jobs`). A 'promoted' row per promoted job, in order.

CREATE OR REPLACE FUNCTION public.queue_promote_viewed(p_user_id text, p_default_max_active integer, p_release_window_seconds double precision, p_lease_seconds double precision)
 RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_promoted uuid[];
BEGIN
    SELECT coalesce(array_agg(p.promoted_job_id), '{}') INTO v_promoted
      FROM queue_promote_queued_jobs(p_user_id, p_default_max_active, p_release_window_seconds, p_lease_seconds) AS p;
    RETURN QUERY SELECT * FROM queue_promoted_views(v_promoted);
END
$function$;
