-- queue_seat_resume: the function.
-- requires: queue_releases_paused
--
-- The capacity seat of the retries a pause held, when it ends (README.md, "The capacity seat").
--
-- Why, migration by migration (its text below is the last one's):
-- * 0040 (the seat's release fence and timer): Moved here from queue_set_releases_paused (0028):
--   at a resume (hers, `p_user_id`, or the fleet's, '') the retries the pause held are due now,
--   their release window stretched to a full one from now. A held retry keeps its place in use
--   (its run may judge at the core), so only a job with no release due that does not wait for a
--   grant is one; a job still paused by the other pause stays held. How many are due.

CREATE OR REPLACE FUNCTION public.queue_seat_resume(p_user_id text, p_release_window_seconds double precision)
 RETURNS integer
 LANGUAGE sql
AS $function$
    WITH due AS (
        UPDATE analysis_jobs j
           SET next_release_at = clock_timestamp(),
               release_deadline = GREATEST(j.release_deadline,
                                           clock_timestamp() + make_interval(secs => p_release_window_seconds))
         WHERE j.status = 'pending' AND j.next_release_at IS NULL
           AND (j.capacity_wait_since IS NULL OR j.capacity_token IS NOT NULL)
           AND (p_user_id = '' OR j.user_id = p_user_id)
           AND NOT queue_releases_paused(j.user_id)
        RETURNING j.job_id
    )
    SELECT count(*)::integer FROM due
$function$;
