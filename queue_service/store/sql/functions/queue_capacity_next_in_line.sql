-- queue_capacity_next_in_line: the function.
--
-- Why, migration by migration (its text below is the last one's):
-- * 0016 (capacity turn order): The next job in the fair order, locked for the grant (NULL: none
--   waits, or every candidate is locked by another transaction, a cancel: it waits for the next
--   grant). Walks the turn-order index one entry at a time and stops at the first candidate whose
--   user has no run in use.
-- * 0022 (grant counts only the runs in use): As in 0016; the candidate's row is locked by its key
--   and checked once locked.
-- * 0023 (deltas take turns under the capacity): The next job in the fair order, locked for the
--   grant (NULL: none waits, or every candidate is locked by another transaction): fewest runs in
--   use first and, among users with equally few, a delta ahead of first-pass work; then the user
--   who has waited longest for her turn.
-- * 0034 (release turn attempt): A delta has no precedence of its own: the next job is the first
--   in turn order among the users with the fewest runs in use (`queue_capacity_first_waiting`),
--   whatever its kind; the turn order is the user's wait since her last start at the core (a
--   delta's grant counting, as any grant). Before, a waiting delta of a user with no run in use
--   went first, so a user re-checking in a loop passed a waiting first-pass job at every turn.

CREATE OR REPLACE FUNCTION public.queue_capacity_next_in_line()
 RETURNS uuid
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_best uuid;
    v_locked record;
    v_skipped uuid[] := '{}';
BEGIN
    LOOP
        SELECT f.job_id INTO v_best FROM queue_capacity_first_waiting(false, v_skipped, NULL) f;
        IF v_best IS NULL THEN
            RETURN NULL;
        END IF;
        SELECT w.status, w.capacity_wait_since, w.capacity_token INTO v_locked
          FROM analysis_jobs w
         WHERE w.job_id = v_best
           FOR UPDATE SKIP LOCKED;
        IF FOUND AND v_locked.status = 'pending' AND v_locked.capacity_wait_since IS NOT NULL
           AND v_locked.capacity_token IS NULL THEN
            RETURN v_best;
        END IF;
        -- Locked by another transaction (or changed meanwhile): the order without it.
        v_skipped := v_skipped || v_best;
    END LOOP;
END
$function$;
