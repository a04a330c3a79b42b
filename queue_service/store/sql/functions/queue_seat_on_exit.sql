-- queue_seat_on_exit: the function.
--
-- The capacity seat of a job leaving PENDING (README.md, "The capacity seat").
--
-- Why, migration by migration (its text below is the last one's):
-- * 0040 (the seat's release fence and timer): A job the core took (RUNNING, `mark_released`) or
--   that ended (queue_end_job) has no release due: its timer is cleared. The writer takes the
--   value in the statement that moves the job out of PENDING, as a job entering PENDING takes
--   its seat from queue_seat_on_entry, so the job is announced once, as it stands. Its place in
--   use (`capacity_token`) stays until its run is settled: the grant counts it while it runs.

CREATE OR REPLACE FUNCTION public.queue_seat_on_exit()
 RETURNS timestamp with time zone
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT NULL::timestamp with time zone
$function$;
