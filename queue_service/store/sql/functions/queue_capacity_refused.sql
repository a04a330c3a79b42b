-- queue_capacity_refused: the function.
--
-- Why, migration by migration (its text below is the last one's):
-- * 0014 (fleet capacity): The core answered a release RESOURCE_EXHAUSTED ("not now", nothing
--   applied): the job gives its capacity back and waits again with its place kept (its wait
--   unchanged, its user's turn given back), no retry of its own and no release window running. The
--   fleet learns the core's limit (what is in use now) and probes above it at most once per probe
--   interval. Fenced by the attempt that was refused; returns the limit learned, or no row when
--   fenced.
-- * 0016 (capacity turn order): As in 0014, and the keys of the user's waiting jobs go back with
--   her turn.
-- * 0023 (deltas take turns under the capacity): The core answered a granted release "not now": the
--   job waits again with its place (its turn given back), and the fleet learns the core's limit.
-- * 0039 (the capacity seat's one owner): The seat is given back by queue_seat_give_back; the turn
--   and the learned limit stay here.

CREATE OR REPLACE FUNCTION public.queue_capacity_refused(p_job_id uuid, p_attempt integer, p_probe_interval_seconds double precision)
 RETURNS TABLE(row_kind text, core_limit integer)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_in_use integer;
    v_user_id text;
    v_turn_before timestamptz;
    v_turn_granted timestamptz;
BEGIN
    SELECT g.user_id, g.turn_before, g.turn_granted INTO v_user_id, v_turn_before, v_turn_granted
      FROM queue_seat_give_back(p_job_id, p_attempt) AS g;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM queue_capacity_give_back_turn(v_user_id, v_turn_before, v_turn_granted);
    v_in_use := queue_capacity_in_use();
    INSERT INTO queue_capacity AS c (capacity, core_limit, next_probe_at, core_refusals)
    VALUES (0, v_in_use, clock_timestamp() + make_interval(secs => p_probe_interval_seconds), 1)
    ON CONFLICT (singleton) DO UPDATE
       SET core_limit = least(COALESCE(c.core_limit, v_in_use), v_in_use),
           next_probe_at = clock_timestamp() + make_interval(secs => p_probe_interval_seconds),
           core_refusals = c.core_refusals + 1;
    RETURN QUERY SELECT 'refused'::text, c.core_limit FROM queue_capacity c;
END
$function$;
