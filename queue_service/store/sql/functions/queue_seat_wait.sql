-- queue_seat_wait: the function.
--
-- The capacity seat of a job sent back to waiting for a grant (README.md, "The capacity seat").
--
-- Why, migration by migration (its text below is the last one's):
-- * 0039 (the capacity seat's one owner): Moved here from `first_releases_owed` (0031): a paused
--   user's first release, claimed by a locked change whose outcome was unknown and never sent,
--   goes back to waiting for a grant (its wait and turn key from now, no token, no release due),
--   as a claim at the first attempt of its turn does under a pause (queue_seat_hold_for_pause).
--   How many jobs wait again.

CREATE OR REPLACE FUNCTION public.queue_seat_wait(p_job_ids uuid[])
 RETURNS integer
 LANGUAGE sql
AS $function$
    WITH waiting AS (
        UPDATE analysis_jobs h
           SET capacity_wait_since = clock_timestamp(),
               capacity_turn_key = clock_timestamp(),
               capacity_token = NULL,
               next_release_at = NULL
         WHERE h.job_id = ANY (p_job_ids) AND h.status = 'pending'
        RETURNING h.job_id
    )
    SELECT count(*)::integer FROM waiting
$function$;
