-- queue_seat_wait_from_latest_turn: the function.
--
-- The capacity seat's turn keys of a user's waiting jobs after a turn given back (README.md, "The
-- capacity seat").
--
-- Why, migration by migration (its text below is the last one's):
-- * 0040 (the seat's release fence and timer): One of the two transitions `queue_seat_turn_keys`
--   (0039) chose between by a flag. After a turn given back (queue_capacity_give_back_turn, 0023)
--   her waiting jobs wait from her latest turn, or from their own wait when it is later
--   (`p_turn` NULL: she has none, so each waits from its own wait).

CREATE OR REPLACE FUNCTION public.queue_seat_wait_from_latest_turn(p_user_id text, p_turn timestamp with time zone)
 RETURNS void
 LANGUAGE sql
AS $function$
    UPDATE analysis_jobs w
       SET capacity_turn_key = GREATEST(p_turn, w.capacity_wait_since)
     WHERE w.user_id = p_user_id AND w.status = 'pending'
       AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL
$function$;
