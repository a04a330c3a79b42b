-- queue_current_timeline: the function.
--
-- Why, migration by migration (its text below is the last one's):
-- * 0019 (adopt judging runs with stale reservations): A first-pass run judges only after its job
--   committed (the admit's commit consumes the run's reservation and claims the first release). So
--   after a failover, a first-pass run the core judges with a reservation but no job on the new
--   primary is an admit that committed, was acknowledged and was released on the old primary, and
--   whose commit the new primary lost: only the reservation, written before CreateRun, had reached
--   the standby. It is adopted like any lost job (the reservation consumed), never taken for an
--   admit still in flight: before, the release gate did not count it (a user's next run was
--   released while it judged, I9) and the sweeper canceled it when the reservation's grace ran out
--   (an acknowledged click lost, its judging thrown away).

CREATE OR REPLACE FUNCTION public.queue_current_timeline()
 RETURNS integer
 LANGUAGE sql
AS $function$
    SELECT CASE WHEN pg_is_in_recovery() THEN (SELECT timeline_id FROM pg_control_checkpoint())
                ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int
           END
$function$;
