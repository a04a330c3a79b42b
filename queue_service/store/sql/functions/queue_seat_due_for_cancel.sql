-- queue_seat_due_for_cancel: the function.
--
-- The capacity seat of a PENDING job whose user asked to cancel it (README.md, "The capacity
-- seat").
--
-- Why, migration by migration (its text below is the last one's):
-- * 0040 (the seat's release fence and timer): Moved here from `record_cancel_request` (0028): a
--   PENDING job whose retry a pause holds (no release due, its place in use kept: the core may
--   judge its run) is due again after the recheck (`p_recheck_seconds`), so an unanswered cancel
--   reaches the core anyway; any other job's release stays as it is. The value; the writer takes
--   it in the statement that records the cancel.

CREATE OR REPLACE FUNCTION public.queue_seat_due_for_cancel(p_status text, p_next_release_at timestamp with time zone, p_capacity_wait_since timestamp with time zone, p_capacity_token integer, p_recheck_seconds double precision)
 RETURNS timestamp with time zone
 LANGUAGE sql
AS $function$
    SELECT CASE WHEN p_status = 'pending' AND p_next_release_at IS NULL
                     AND (p_capacity_wait_since IS NULL OR p_capacity_token IS NOT NULL)
                THEN clock_timestamp() + make_interval(secs => p_recheck_seconds)
                ELSE p_next_release_at
           END
$function$;
