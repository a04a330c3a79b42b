-- queue_seat_claim: the function.
--
-- The capacity seat of a release sent: an attempt counted and its lease held (README.md, "The
-- capacity seat").
--
-- Why, migration by migration (its text below is the last one's):
-- * 0040 (the seat's release fence and timer): Moved here from the claims `claim_due_releases`
--   and `claim_release_of_job` (0001, 0008): the release's fence (`release_attempts`, which every
--   later write of this attempt names) and timer (`next_release_at`, pushed past the lease so no
--   other replica claims the job while this one asks the core). The caller chooses the jobs and
--   locks them in the same statement (FOR UPDATE SKIP LOCKED); a job no longer PENDING is left
--   alone. Each claimed job as the release needs it.

CREATE OR REPLACE FUNCTION public.queue_seat_claim(p_job_ids uuid[], p_lease_seconds double precision)
 RETURNS TABLE(job_id uuid, user_id text, run_id uuid, release_attempts integer, cancel_requested boolean, delta boolean)
 LANGUAGE sql
AS $function$
    UPDATE analysis_jobs j
       SET release_attempts = j.release_attempts + 1,
           next_release_at = clock_timestamp() + make_interval(secs => p_lease_seconds)
     WHERE j.job_id = ANY (p_job_ids) AND j.status = 'pending'
    RETURNING j.job_id, j.user_id, j.run_id, j.release_attempts, j.cancel_requested_at IS NOT NULL,
              j.delta_of_job_id IS NOT NULL
$function$;
