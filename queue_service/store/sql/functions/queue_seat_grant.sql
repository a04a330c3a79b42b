-- queue_seat_grant: the function.
--
-- The capacity seat's grant (README.md, "The capacity seat").
--
-- Why, migration by migration (its text below is the last one's):
-- * 0039 (the capacity seat's one owner): The grant's hand-over of a seat, moved here from
--   queue_grant_capacity (0014, 0016, 0023: its text there). The job takes the capacity token
--   `p_token` and its user's turn (`capacity_turn_key` now, the turn it had before kept in
--   `capacity_turn_before`, so a refusal gives it back); its release is claimed for the granting
--   replica (the attempt counted, leased, a fresh release window), and that attempt opens its turn
--   (`release_turn_attempt`: an attempt from it on follows a release the core may have applied).
--   The job's row as the grant reports it.

CREATE OR REPLACE FUNCTION public.queue_seat_grant(p_job_id uuid, p_token integer, p_now timestamp with time zone, p_lease_seconds double precision, p_release_window_seconds double precision)
 RETURNS TABLE(job_id uuid, user_id text, run_id uuid, release_attempts integer, capacity_wait_since timestamp with time zone, cancel_requested_at timestamp with time zone)
 LANGUAGE sql
AS $function$
    UPDATE analysis_jobs a
       SET capacity_token = p_token,
           capacity_turn_before = (SELECT t.last_turn_at FROM user_capacity_turns t WHERE t.user_id = a.user_id),
           capacity_turn_key = p_now,
           release_attempts = a.release_attempts + 1,
           release_turn_attempt = a.release_attempts + 1,
           next_release_at = p_now + make_interval(secs => p_lease_seconds),
           release_deadline = p_now + make_interval(secs => p_release_window_seconds)
     WHERE a.job_id = p_job_id
    RETURNING a.job_id, a.user_id, a.run_id, a.release_attempts, a.capacity_wait_since, a.cancel_requested_at
$function$;
