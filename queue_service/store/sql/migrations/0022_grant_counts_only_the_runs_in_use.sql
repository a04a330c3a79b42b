-- The grant counts only the runs in use, and locks its candidate's row by its key.
--
-- With a capacity of 20 and 200 users waiting, the count of first-pass runs in use read every
-- job holding a slot through the slot index (the 180 waiting for capacity included) and checked
-- each at the heap: about 50 buffers per grant on an analyzed table, 200 on one without
-- statistics. The candidate's row lock, under a generic plan, could go through the index of
-- waiting jobs and read every waiting entry to find one id (141 buffers per grant without
-- statistics).
--
-- * `analysis_jobs_first_pass_taking_capacity` holds exactly the first-pass runs that take
--   capacity, under the predicate `queue_capacity_in_use_of_user` and `queue_capacity_in_use`
--   (migration 0016) spell word for word, so the planner proves it and their counts read as many
--   entries as runs are in use (25 buffers per grant in the same run); the functions themselves
--   are unchanged.
-- * The candidate's row is locked by its primary key, and whether it still waits is checked on
--   the locked row.
--
-- Additive: the functions keep their signatures and their answers (replicas of the previous
-- version call the same functions).

CREATE INDEX analysis_jobs_first_pass_taking_capacity ON analysis_jobs (user_id)
 WHERE (status IN ('pending', 'running') OR run_settle_due_at IS NOT NULL) AND delta_of_job_id IS NULL
   AND slot IS NOT NULL
   AND (capacity_wait_since IS NULL OR capacity_token IS NOT NULL);

-- As in 0016; the candidate's row is locked by its key and checked once locked.
CREATE OR REPLACE FUNCTION queue_capacity_next_in_line() RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    v_row record;
    v_rank integer;
    v_best uuid;
    v_best_rank integer;
    v_locked record;
    v_skipped uuid[] := '{}';
BEGIN
    LOOP
        v_best := NULL;
        v_row := NULL;
        LOOP
            IF v_row IS NULL THEN
                SELECT w.job_id, w.user_id, w.capacity_turn_key, w.capacity_wait_since, w.queue_seq INTO v_row
                  FROM analysis_jobs w
                 WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL
                   AND w.job_id <> ALL (v_skipped)
                 ORDER BY w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
                 LIMIT 1;
            ELSE
                SELECT w.job_id, w.user_id, w.capacity_turn_key, w.capacity_wait_since, w.queue_seq INTO v_row
                  FROM analysis_jobs w
                 WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL
                   AND w.job_id <> ALL (v_skipped)
                   AND (w.capacity_turn_key, w.capacity_wait_since, w.queue_seq)
                       > (v_row.capacity_turn_key, v_row.capacity_wait_since, v_row.queue_seq)
                 ORDER BY w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
                 LIMIT 1;
            END IF;
            EXIT WHEN NOT FOUND;
            v_rank := queue_capacity_in_use_of_user(v_row.user_id);
            IF v_best IS NULL OR v_rank < v_best_rank THEN
                v_best := v_row.job_id;
                v_best_rank := v_rank;
            END IF;
            EXIT WHEN v_rank = 0;
        END LOOP;
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
$$;
