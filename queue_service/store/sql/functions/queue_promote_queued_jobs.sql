-- queue_promote_queued_jobs: the function.
--
-- The whole placement is here: a job it promotes from QUEUED to PENDING takes its place at the
-- capacity from queue_seat_on_entry in the same UPDATE (it waits for a grant while the capacity
-- is limited or its releases are paused: its first release, claimed here, is then not due).
--
-- Why, migration by migration (its text below is the last one's):
-- * 0008 (locked sections in one call): Fills every free slot of the user from the queue, oldest
--   first. Each promoted job's first release is claimed for the calling replica at once (attempt 1,
--   leased for `p_lease_seconds`), which releases it right after COMMIT; if it cannot, the lease
--   runs out and any replica's dispatcher claims the release. Returns the promoted jobs in order.
-- * 0039 (the capacity seat's one owner): The promoted job's place at the capacity is taken from
--   queue_seat_on_entry in the UPDATE, where the trigger analysis_jobs_wait_for_capacity set it.

CREATE OR REPLACE FUNCTION public.queue_promote_queued_jobs(p_user_id text, p_default_max_active integer, p_release_window_seconds double precision, p_lease_seconds double precision)
 RETURNS TABLE(promoted_job_id uuid, promoted_run_id uuid)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_slot integer;
BEGIN
    LOOP
        v_slot := analysis_jobs_free_slot(p_user_id, p_default_max_active);
        EXIT WHEN v_slot IS NULL;
        UPDATE analysis_jobs j
           SET status = 'pending',
               slot = v_slot,
               promote_time = clock_timestamp(),
               next_release_at = seat.next_release_at,
               release_deadline = clock_timestamp() + make_interval(secs => p_release_window_seconds),
               release_attempts = seat.release_attempts,
               capacity_wait_since = seat.capacity_wait_since,
               capacity_turn_key = seat.capacity_turn_key
          FROM queue_seat_on_entry(p_user_id, true, clock_timestamp(),
                                   clock_timestamp() + make_interval(secs => p_lease_seconds), 1) AS seat
         WHERE j.job_id = (SELECT q.job_id FROM analysis_jobs q
                            WHERE q.user_id = p_user_id AND q.status = 'queued'
                            ORDER BY q.queue_seq
                            LIMIT 1)
        RETURNING j.job_id, j.run_id INTO promoted_job_id, promoted_run_id;
        EXIT WHEN NOT FOUND;
        RETURN NEXT;
    END LOOP;
END
$function$;
