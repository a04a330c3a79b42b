-- queue_capacity_in_use_of_user: the function.
--
-- Why, migration by migration (its text below is the last one's):
-- * 0014 (fleet capacity): First-pass runs of one user (or of every user) that take capacity: the
--   holders of the user's slots (the slot index's own predicate, so that index serves it) that are
--   not waiting.
-- * 0016 (capacity turn order): First-pass runs of one user (or of every user) that take capacity:
--   jobs promoted into one of the user's slots and still holding it (PENDING, RUNNING, or ended
--   with the run unsettled), except those waiting for capacity. A job ended while queued never held
--   a slot nor released its run. The slot index (its own predicate) serves both.
-- * 0023 (deltas take turns under the capacity): A user's runs that take capacity: first-pass runs
--   promoted into a slot and deltas, PENDING, RUNNING or ended with the run unsettled, except those
--   waiting for a grant. Each half is read through the partial index whose predicate it spells word
--   for word.

CREATE OR REPLACE FUNCTION public.queue_capacity_in_use_of_user(p_user_id text)
 RETURNS integer
 LANGUAGE sql
 STABLE
AS $function$
    SELECT (SELECT count(*) FROM analysis_jobs a
             WHERE a.user_id = p_user_id
               AND (a.status IN ('pending', 'running') OR a.run_settle_due_at IS NOT NULL) AND a.delta_of_job_id IS NULL
               AND a.slot IS NOT NULL
               AND (a.capacity_wait_since IS NULL OR a.capacity_token IS NOT NULL))::integer
         + (SELECT count(*) FROM analysis_jobs d
             WHERE d.user_id = p_user_id
               AND (d.status IN ('pending', 'running') OR d.run_settle_due_at IS NOT NULL) AND d.delta_of_job_id IS NOT NULL
               AND (d.capacity_wait_since IS NULL OR d.capacity_token IS NOT NULL))::integer
$function$;
