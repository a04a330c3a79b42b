-- queue_seat_release_failed: the function.
--
-- The capacity seat after a release attempt that failed for now (README.md, "The capacity seat").
--
-- Why, migration by migration (its text below is the last one's):
-- * 0039 (the capacity seat's one owner): Moved here from `schedule_release_retry` (0008, 0034).
--   A transient release failure: the error is remembered and the next attempt scheduled after the
--   backoff, never past the release window. An attempt that sent nothing (`p_sent` false: held
--   back before the core was asked) at the attempt that opened the job's turn passes the turn on
--   to the next attempt: it follows no release either. Fenced by the attempt; the next attempt's
--   time and whether the window is over (the release then gives up); no row when fenced.

CREATE OR REPLACE FUNCTION public.queue_seat_release_failed(p_job_id uuid, p_attempt integer, p_backoff_seconds double precision, p_last_error text, p_sent boolean)
 RETURNS TABLE(next_release_at timestamp with time zone, window_over boolean)
 LANGUAGE sql
AS $function$
    UPDATE analysis_jobs
       SET next_release_at = LEAST(clock_timestamp() + make_interval(secs => p_backoff_seconds), release_deadline),
           last_error = p_last_error,
           release_turn_attempt = CASE WHEN NOT p_sent AND release_turn_attempt = p_attempt
                                       THEN p_attempt + 1 ELSE release_turn_attempt END
     WHERE job_id = p_job_id AND status = 'pending' AND release_attempts = p_attempt
    RETURNING next_release_at, release_deadline <= clock_timestamp()
$function$;
