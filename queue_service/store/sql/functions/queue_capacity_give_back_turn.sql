-- queue_capacity_give_back_turn: the function.
--
-- Why, migration by migration (its text below is the last one's):
-- * 0023 (deltas take turns under the capacity): A grant given back (the core's "not now", or a job
--   taken back to its queue): the user's turn goes back to what it was before that grant
--   (`p_turn_before`) only while the turn the grant gave her (`p_turn_granted`, the granted job's
--   turn key) is still her latest, so one she got meanwhile through another slot is kept; her
--   waiting jobs then wait from her latest turn.
-- * 0039 (the capacity seat's one owner): The waiting jobs' turn keys are queue_seat_turn_keys';
--   the user's turn stays here.
-- * 0040 (the seat's release fence and timer): queue_seat_wait_from_latest_turn's.

CREATE OR REPLACE FUNCTION public.queue_capacity_give_back_turn(p_user_id text, p_turn_before timestamp with time zone, p_turn_granted timestamp with time zone)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_turn_now timestamptz;
BEGIN
    IF p_turn_before IS NULL THEN
        DELETE FROM user_capacity_turns t WHERE t.user_id = p_user_id AND t.last_turn_at = p_turn_granted;
    ELSE
        UPDATE user_capacity_turns t SET last_turn_at = p_turn_before
         WHERE t.user_id = p_user_id AND t.last_turn_at = p_turn_granted;
    END IF;
    SELECT t.last_turn_at INTO v_turn_now FROM user_capacity_turns t WHERE t.user_id = p_user_id;
    PERFORM queue_seat_wait_from_latest_turn(p_user_id, v_turn_now);
END
$function$;
