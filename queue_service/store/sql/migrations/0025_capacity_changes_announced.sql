-- A job's own capacity changes are announced to the job-change feed.
--
-- The core's "not now" (`queue_capacity_refused`) puts a granted job back in line by changing only
-- its capacity columns (`capacity_token`, `capacity_wait_since`, `next_release_at`), none of
-- which the update trigger watched: a WatchJobs stream kept the granted attempt's message (no
-- place in line) while GetJob showed the job waiting with its `capacity_position`. The trigger
-- now also fires when the job takes or gives back a capacity token or begins or stops waiting
-- for capacity. A grant already changed `release_attempts` and a promotion `status`, so what
-- this adds to the feed is one row per refusal.
--
-- A job's place in line also moves with other jobs' changes (grants, jobs leaving the line, runs
-- ending); those are announced as the other jobs' own changes, and the watch hub re-reads the
-- places of the waiting jobs its streams show when it sees one (engine/watch.py).
--
-- Additive: the trigger's function and the feed's rows are those of 0015.

DROP TRIGGER analysis_jobs_announce_update ON analysis_jobs;
CREATE TRIGGER analysis_jobs_announce_update
    AFTER UPDATE ON analysis_jobs
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          OR OLD.last_error IS DISTINCT FROM NEW.last_error
          OR OLD.release_attempts IS DISTINCT FROM NEW.release_attempts
          OR OLD.capacity_token IS DISTINCT FROM NEW.capacity_token
          OR OLD.capacity_wait_since IS DISTINCT FROM NEW.capacity_wait_since)
    EXECUTE FUNCTION analysis_jobs_announce_change();
