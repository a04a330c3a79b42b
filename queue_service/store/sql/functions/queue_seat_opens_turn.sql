-- queue_seat_opens_turn: the function.
--
-- The capacity seat: whether a release attempt follows no release since the job last waited
-- (README.md, "The capacity seat").
--
-- Why, migration by migration (its text below is the last one's):
-- * 0039 (the capacity seat's one owner): An attempt below the one that opened the job's turn
--   (`release_turn_attempt`: its grant's, or the first of all), or, once claimed (`p_claimed`),
--   the opening attempt itself, sent nothing the core could have applied since the job last
--   waited: held by a pause, the job waits for a grant again, its capacity given back.

CREATE OR REPLACE FUNCTION public.queue_seat_opens_turn(p_release_attempts integer, p_release_turn_attempt integer, p_claimed boolean)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT CASE WHEN p_claimed THEN p_release_attempts = p_release_turn_attempt
                ELSE p_release_attempts < p_release_turn_attempt END
$function$;
