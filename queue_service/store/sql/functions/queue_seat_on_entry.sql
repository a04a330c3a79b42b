-- queue_seat_on_entry: the function.
-- requires: queue_releases_paused
--
-- The capacity seat: a job's place at the core's capacity (`capacity_wait_since`,
-- `capacity_token`, `capacity_turn_key`, `capacity_turn_before`, `release_turn_attempt`) is
-- written by the `queue_seat_*` functions alone (README.md, "The capacity seat";
-- tests/repository/test_capacity_seat.py scans for any other writer).
--
-- Why, migration by migration (its text below is the last one's):
-- * 0039 (the capacity seat's one owner): Where a job entering PENDING sits (`p_pending`: the
--   admit's, the adoption's or the promotion's row is PENDING): while the fleet's capacity is
--   limited (a capacity, or a limit the core taught us) or its user's releases are paused (the
--   fleet's or hers), it waits for a grant: its wait and its turn key from `p_now`, no release
--   due and no attempt counted, as the trigger analysis_jobs_wait_for_capacity made it since 0014
--   (0016: the turn key; 0023: deltas too; 0028: a pause). Otherwise its release is as its writer
--   claimed it (`p_next_release_at`, `p_release_attempts`). The writer takes these values in the
--   same statement that creates the PENDING row, so the job is announced once, as it stands.

CREATE OR REPLACE FUNCTION public.queue_seat_on_entry(p_user_id text, p_pending boolean, p_now timestamp with time zone, p_next_release_at timestamp with time zone, p_release_attempts integer)
 RETURNS TABLE(next_release_at timestamp with time zone, release_attempts integer, capacity_wait_since timestamp with time zone, capacity_turn_key timestamp with time zone)
 LANGUAGE sql
 STABLE
AS $function$
    SELECT CASE WHEN w.waits THEN NULL ELSE p_next_release_at END,
           CASE WHEN w.waits THEN 0 ELSE p_release_attempts END,
           CASE WHEN w.waits THEN p_now END,
           CASE WHEN w.waits THEN p_now END
      FROM (SELECT p_pending
                   AND (EXISTS (SELECT 1 FROM queue_capacity c WHERE c.capacity > 0 OR c.core_limit IS NOT NULL)
                        OR queue_releases_paused(p_user_id)) AS waits) AS w
$function$;
