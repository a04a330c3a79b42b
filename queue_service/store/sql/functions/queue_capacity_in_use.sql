-- queue_capacity_in_use: the function.
--
-- Why, migration by migration (its text below is the last one's):
-- * 0014 (fleet capacity): Everything the core may be judging for us: first-pass runs not waiting,
--   and delta re-checks running or ended unsettled (deltas never wait, but they take the core's
--   capacity).
-- * 0016 (capacity turn order): Everything the core may be judging for us: first-pass runs in use
--   (above), and delta re-checks running or ended unsettled (deltas never wait, but they take the
--   core's capacity).
-- * 0023 (deltas take turns under the capacity): Everything the core may be judging for us, by the
--   same rule for every user.

CREATE OR REPLACE FUNCTION public.queue_capacity_in_use()
 RETURNS integer
 LANGUAGE sql
 STABLE
AS $function$
    SELECT (SELECT count(*) FROM analysis_jobs a
             WHERE (a.status IN ('pending', 'running') OR a.run_settle_due_at IS NOT NULL) AND a.delta_of_job_id IS NULL
               AND a.slot IS NOT NULL
               AND (a.capacity_wait_since IS NULL OR a.capacity_token IS NOT NULL))::integer
         + (SELECT count(*) FROM analysis_jobs d
             WHERE (d.status IN ('pending', 'running') OR d.run_settle_due_at IS NOT NULL) AND d.delta_of_job_id IS NOT NULL
               AND (d.capacity_wait_since IS NULL OR d.capacity_token IS NOT NULL))::integer
$function$;
