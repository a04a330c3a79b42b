-- queue_seat_take_back: the function.
--
-- The capacity seat left by a job taken back to its queue (README.md, "The capacity seat").
--
-- Why, migration by migration (its text below is the last one's):
-- * 0039 (the capacity seat's one owner): Moved here from queue_take_back_unreleased_jobs (0018,
--   0023: its text there). The PENDING job goes back to QUEUED: no slot, no promotion, no release
--   due, no attempt, and no place at the capacity (its wait, token and turn cleared; its caller
--   read them first, to give the turn back).

CREATE OR REPLACE FUNCTION public.queue_seat_take_back(p_job_id uuid)
 RETURNS void
 LANGUAGE sql
AS $function$
    UPDATE analysis_jobs j
       SET status = 'queued',
           slot = NULL,
           promote_time = NULL,
           next_release_at = NULL,
           release_deadline = NULL,
           release_attempts = 0,
           capacity_wait_since = NULL,
           capacity_token = NULL,
           capacity_turn_before = NULL,
           capacity_turn_key = NULL
     WHERE j.job_id = p_job_id
$function$;
