-- queue_seat_hold_for_pause: the function.
-- requires: queue_seat_opens_turn
--
-- The capacity seat of a release a pause holds (README.md, "The capacity seat").
--
-- Why, migration by migration (its text below is the last one's):
-- * 0039 (the capacity seat's one owner): Moved here from the claim of due releases
--   (`claim_due_releases`, 0028, 0031, 0034) and the dispatcher's hold (`hold_release_if_paused`,
--   0031, 0034). A pause holds releases, never the count: a PENDING job whose release the pause
--   holds has no release due. One whose held attempt would follow no release since it last waited
--   (it opened the job's turn: `release_turn_attempt`; `p_claimed` false, the due attempt not
--   counted yet: below it; `p_claimed` true, the claimed attempt: equal to it) goes back to
--   waiting for a grant, its capacity given back and its wait and turn key from now. Any other
--   may have had a release the core applied (a lost answer, a lease run out mid-call), so it
--   keeps its place in what is in use (its token, or no wait at all) and only its retry is held,
--   until the resume makes it due (queue_set_releases_paused) or a cancel asks for it. Each job
--   held, and whether it waits again.

CREATE OR REPLACE FUNCTION public.queue_seat_hold_for_pause(p_job_ids uuid[], p_claimed boolean)
 RETURNS TABLE(job_id uuid, waits_again boolean)
 LANGUAGE sql
AS $function$
    UPDATE analysis_jobs h
       SET capacity_wait_since = CASE WHEN queue_seat_opens_turn(h.release_attempts, h.release_turn_attempt, p_claimed)
                                      THEN clock_timestamp() ELSE h.capacity_wait_since END,
           capacity_turn_key = CASE WHEN queue_seat_opens_turn(h.release_attempts, h.release_turn_attempt, p_claimed)
                                    THEN clock_timestamp() ELSE h.capacity_turn_key END,
           capacity_token = CASE WHEN queue_seat_opens_turn(h.release_attempts, h.release_turn_attempt, p_claimed)
                                 THEN NULL ELSE h.capacity_token END,
           next_release_at = NULL
     WHERE h.job_id = ANY (p_job_ids) AND h.status = 'pending'
    RETURNING h.job_id, queue_seat_opens_turn(h.release_attempts, h.release_turn_attempt, p_claimed)
$function$;
