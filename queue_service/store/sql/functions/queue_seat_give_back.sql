-- queue_seat_give_back: the function.
--
-- The capacity seat given back after the core's "not now" (README.md, "The capacity seat").
--
-- Why, migration by migration (its text below is the last one's):
-- * 0039 (the capacity seat's one owner): Moved here from queue_capacity_refused (0014, 0016,
--   0023: its text there). The core answered the granted release RESOURCE_EXHAUSTED: the job
--   gives its token back and waits again with its place kept (its wait unchanged, or from now if
--   it had none), no release due. Fenced by the attempt that was refused; its user, and the turns
--   before and after its grant (for queue_capacity_give_back_turn); no row when fenced.

CREATE OR REPLACE FUNCTION public.queue_seat_give_back(p_job_id uuid, p_attempt integer)
 RETURNS TABLE(user_id text, turn_before timestamp with time zone, turn_granted timestamp with time zone)
 LANGUAGE sql
AS $function$
    UPDATE analysis_jobs a
       SET capacity_token = NULL,
           next_release_at = NULL,
           capacity_wait_since = COALESCE(a.capacity_wait_since, clock_timestamp())
     WHERE a.job_id = p_job_id AND a.status = 'pending' AND a.release_attempts = p_attempt
    RETURNING a.user_id, a.capacity_turn_before, a.capacity_turn_key
$function$;
