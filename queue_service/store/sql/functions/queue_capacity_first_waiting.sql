-- queue_capacity_first_waiting: the function.
--
-- Why, migration by migration (its text below is the last one's):
-- * 0023 (deltas take turns under the capacity): The waiting job that would be served first among
--   those of one kind (`p_deltas_only`) or of both, and its user's runs in use: the first in turn
--   order whose user has the fewest runs in use, considering only users with fewer than
--   `p_rank_to_beat` (NULL: any). Walks the turn-order index one entry at a time and stops at a
--   user with none in use.
-- * 0028 (release pauses and ledger actor): Passes over the jobs of a user whose releases are
--   paused (read in the walk: a paused user's waiting jobs cost a filtered index entry each).
-- * Text only, no migration (after 0036): the paused users are read once per call into an array
--   that each step filters by, not joined in each step. Joined, the planner hashed every waiting
--   job against the pauses whenever it guessed the pauses table big (a table never analyzed, as an
--   empty one stays, is guessed at 610 rows), then sorted them: every grant read every waiting job.
-- * Text only, no migration (after 0040): each step of the walk is queue_capacity_waiting_after's,
--   the four spellings of it there; the walk and the choice stay here.

CREATE OR REPLACE FUNCTION public.queue_capacity_first_waiting(p_deltas_only boolean, p_skipped uuid[], p_rank_to_beat integer)
 RETURNS TABLE(job_id uuid, runs_in_use integer)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_step record;
    v_key timestamptz;
    v_wait timestamptz;
    v_seq bigint;
    v_rank integer;
    v_paused text[];
BEGIN
    SELECT coalesce(array_agg(p.user_id), '{}') INTO v_paused FROM queue_release_pauses p;
    job_id := NULL;
    runs_in_use := p_rank_to_beat;
    LOOP
        SELECT * INTO v_step FROM queue_capacity_waiting_after(p_deltas_only, p_skipped, v_paused, v_key, v_wait, v_seq);
        EXIT WHEN v_step.job_id IS NULL;
        v_key := v_step.turn_key;
        v_wait := v_step.wait_since;
        v_seq := v_step.queue_seq;
        v_rank := queue_capacity_in_use_of_user(v_step.user_id);
        IF runs_in_use IS NULL OR v_rank < runs_in_use THEN
            job_id := v_step.job_id;
            runs_in_use := v_rank;
        END IF;
        EXIT WHEN v_rank = 0;
    END LOOP;
    IF job_id IS NOT NULL THEN
        RETURN NEXT;
    END IF;
END
$function$;
