-- queue_promote_queued_jobs: the function.
--
-- Not all of the placement is here: the trigger analysis_jobs_wait_for_capacity then makes a job it
-- promotes from QUEUED to PENDING wait for a capacity grant while the capacity is limited (it sets
-- capacity_wait_since and the turn key, clears capacity_token and next_release_at and, on an
-- INSERT, release_attempts: a release this function claimed is not due until a grant): see
-- functions/analysis_jobs_wait_for_capacity.sql.
--
-- Why, migration by migration (its text below is the last one's):
-- * 0008 (locked sections in one call): Fills every free slot of the user from the queue, oldest
--   first. Each promoted job's first release is claimed for the calling replica at once (attempt 1,
--   leased for `p_lease_seconds`), which releases it right after COMMIT; if it cannot, the lease
--   runs out and any replica's dispatcher claims the release. Returns the promoted jobs in order.

CREATE OR REPLACE FUNCTION public.queue_promote_queued_jobs(p_user_id text, p_default_max_active integer, p_release_window_seconds double precision, p_lease_seconds double precision)
 RETURNS TABLE(promoted_job_id uuid, promoted_run_id uuid)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_slot integer;
BEGIN
    LOOP
        v_slot := analysis_jobs_free_slot(p_user_id, p_default_max_active);
        EXIT WHEN v_slot IS NULL;
        UPDATE analysis_jobs j
           SET status = 'pending',
               slot = v_slot,
               promote_time = clock_timestamp(),
               next_release_at = clock_timestamp() + make_interval(secs => p_lease_seconds),
               release_deadline = clock_timestamp() + make_interval(secs => p_release_window_seconds),
               release_attempts = 1
         WHERE j.job_id = (SELECT q.job_id FROM analysis_jobs q
                            WHERE q.user_id = p_user_id AND q.status = 'queued'
                            ORDER BY q.queue_seq
                            LIMIT 1)
        RETURNING j.job_id, j.run_id INTO promoted_job_id, promoted_run_id;
        EXIT WHEN NOT FOUND;
        RETURN NEXT;
    END LOOP;
END
$function$;
