-- analysis_jobs_capacity_order: the view.
-- requires: queue_capacity_in_use_of_user, queue_releases_paused
--
-- Why, migration by migration (its text below is the last one's):
-- * 0014 (fleet capacity): The fair order of jobs waiting for capacity (max-min, then round-robin):
--   fewest runs of the user in use first; then the user who has waited longest since her latest
--   first-pass run was granted (or, never served, since her job began to wait); then the job that
--   waited longest.
-- * 0016 (capacity turn order): The fair order (positions shown to users): the grant's order,
--   fewest runs in use first, then the user who has waited longest for her next turn, then the job
--   that waited longest.
-- * 0023 (deltas take turns under the capacity): The fair order (positions shown to users), as the
--   grant serves it.
-- * 0034 (release turn attempt): As the grant serves it now: no precedence for deltas; and the jobs
--   of users whose releases are paused (the grant passes them over) numbered after everyone
--   else's, in the same order among themselves.

CREATE OR REPLACE VIEW public.analysis_jobs_capacity_order AS
 SELECT job_id,
    user_id,
    run_id,
    capacity_wait_since,
    row_number() OVER (ORDER BY (queue_releases_paused(user_id)), (queue_capacity_in_use_of_user(user_id)), capacity_turn_key, capacity_wait_since, queue_seq) AS capacity_position
   FROM analysis_jobs w
  WHERE status = 'pending'::text AND capacity_wait_since IS NOT NULL AND capacity_token IS NULL;
