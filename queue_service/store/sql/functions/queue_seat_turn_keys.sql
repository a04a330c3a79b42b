-- queue_seat_turn_keys: the function.
--
-- The capacity seat's turn keys of a user's waiting jobs (README.md, "The capacity seat").
--
-- Why, migration by migration (its text below is the last one's):
-- * 0039 (the capacity seat's one owner): The turn key of every job of the user that waits for a
--   grant, moved here from the grant (queue_grant_capacity, 0016 and 0023) and the give-back of a
--   turn (queue_capacity_give_back_turn, 0023). After a grant (`p_turn` her new turn, `p_after`
--   true) her other waiting jobs (several slots, re-checks) wait behind every user waiting now:
--   a key older than her turn moves to it; her first-pass jobs are found through her slots and
--   her re-checks through her active ones, in two statements (one over both would read every
--   waiting job of every user). After a turn given back (`p_after` false) they wait from her
--   latest turn, or from their own wait when it is later (`p_turn` NULL: she has none).

CREATE OR REPLACE FUNCTION public.queue_seat_turn_keys(p_user_id text, p_turn timestamp with time zone, p_after boolean)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF p_after THEN
        UPDATE analysis_jobs o
           SET capacity_turn_key = p_turn
         WHERE o.user_id = p_user_id AND o.status = 'pending' AND o.delta_of_job_id IS NULL
           AND o.capacity_wait_since IS NOT NULL AND o.capacity_token IS NULL AND o.capacity_turn_key < p_turn;
        UPDATE analysis_jobs o
           SET capacity_turn_key = p_turn
         WHERE o.user_id = p_user_id AND o.status = 'pending' AND o.delta_of_job_id IS NOT NULL
           AND o.capacity_wait_since IS NOT NULL AND o.capacity_token IS NULL AND o.capacity_turn_key < p_turn;
    ELSE
        UPDATE analysis_jobs w
           SET capacity_turn_key = GREATEST(p_turn, w.capacity_wait_since)
         WHERE w.user_id = p_user_id AND w.status = 'pending'
           AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL;
    END IF;
END
$function$;
