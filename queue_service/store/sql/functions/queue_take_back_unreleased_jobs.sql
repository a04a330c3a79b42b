-- queue_take_back_unreleased_jobs: the function.
--
-- Why, migration by migration (its text below is the last one's):
-- * 0024 (adopted judging run takes back unreleased jobs): An adopted judging run keeps the user's
--   other first-pass work from the core, in the database.
-- * 0034 (release turn attempt): Only jobs whose release was never sent since they last waited:
--   waiting for capacity, or not claimed past the attempt that opened their turn
--   (`release_turn_attempt`). A job retrying a release the core may have applied (an answer lost)
--   may be judging: taken back it would wait again uncounted under a capacity (and a cancel would
--   end it without the core), so it keeps its slot and its capacity, and the adopted run takes a
--   slot past the limit if none other gives way.
-- * 0039 (the capacity seat's one owner): The job leaves its seat and goes back to its queue in
--   queue_seat_take_back; which jobs give way stays here.

CREATE OR REPLACE FUNCTION public.queue_take_back_unreleased_jobs(p_user_id text, p_default_max_active integer)
 RETURNS SETOF uuid
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_job record;
BEGIN
    WHILE analysis_jobs_free_slot(p_user_id, p_default_max_active) IS NULL LOOP
        SELECT p.job_id, p.capacity_token, p.capacity_turn_before, p.capacity_turn_key INTO v_job
          FROM analysis_jobs p
         WHERE p.user_id = p_user_id AND p.status = 'pending' AND p.delta_of_job_id IS NULL
           AND p.cancel_requested_at IS NULL
           AND ((p.capacity_wait_since IS NOT NULL AND p.capacity_token IS NULL)
                OR p.release_attempts <= p.release_turn_attempt)
         ORDER BY p.queue_seq DESC
         LIMIT 1
           FOR UPDATE;
        EXIT WHEN NOT FOUND;
        PERFORM queue_seat_take_back(v_job.job_id);
        IF v_job.capacity_token IS NOT NULL THEN
            -- Its grant is given back, and the turn with it (as `queue_capacity_refused` does).
            PERFORM queue_capacity_give_back_turn(p_user_id, v_job.capacity_turn_before, v_job.capacity_turn_key);
        END IF;
        RETURN NEXT v_job.job_id;
    END LOOP;
END
$function$;
