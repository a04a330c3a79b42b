-- queue_seat_wait_behind_turn: the function.
--
-- The capacity seat's turn keys of a user's waiting jobs after her grant (README.md, "The
-- capacity seat").
--
-- Why, migration by migration (its text below is the last one's):
-- * 0040 (the seat's release fence and timer): One of the two transitions `queue_seat_turn_keys`
--   (0039) chose between by a flag. After a grant (`p_turn` her new turn) her other waiting jobs
--   (several slots, re-checks) wait behind every user waiting now: a key older than her turn
--   moves to it (0016, 0023). Her first-pass jobs are found through her slots and her re-checks
--   through her active ones, in two statements (one over both would read every waiting job of
--   every user).

CREATE OR REPLACE FUNCTION public.queue_seat_wait_behind_turn(p_user_id text, p_turn timestamp with time zone)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    UPDATE analysis_jobs o
       SET capacity_turn_key = p_turn
     WHERE o.user_id = p_user_id AND o.status = 'pending' AND o.delta_of_job_id IS NULL
       AND o.capacity_wait_since IS NOT NULL AND o.capacity_token IS NULL AND o.capacity_turn_key < p_turn;
    UPDATE analysis_jobs o
       SET capacity_turn_key = p_turn
     WHERE o.user_id = p_user_id AND o.status = 'pending' AND o.delta_of_job_id IS NOT NULL
       AND o.capacity_wait_since IS NOT NULL AND o.capacity_token IS NULL AND o.capacity_turn_key < p_turn;
END
$function$;
