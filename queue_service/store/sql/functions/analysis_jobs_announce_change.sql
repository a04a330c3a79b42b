-- analysis_jobs_announce_change: the function and its triggers analysis_jobs_announce_insert and
-- analysis_jobs_announce_update.
--
-- Why, migration by migration (its text below is the last one's, as schema.sql shows it):
-- * 0001 (queue and credits): Every status change (and every new last_error) is announced, so
--   watchers and dispatchers on every replica learn of it, whichever replica or code version made
--   it.
-- * 0008 (locked sections in one call): Change notices say whether a PENDING job's release is
--   already claimed (by the replica that promoted or admitted it, which releases it itself): other
--   replicas' dispatchers then need not wake. Notices of replicas that do not claim (earlier
--   versions) carry no such field and wake every dispatcher, as before.
-- * 0013 (every view change announced): Every change a job's view shows is announced to WatchJobs
--   streams.
-- * 0025 (capacity changes announced): A job's own capacity changes are announced to the job-change
--   feed.

CREATE OR REPLACE FUNCTION public.analysis_jobs_announce_change()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM analysis_jobs_announce(NEW, CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END);
    RETURN NULL;
END
$function$;

DROP TRIGGER IF EXISTS analysis_jobs_announce_insert ON public.analysis_jobs;
CREATE TRIGGER analysis_jobs_announce_insert AFTER INSERT ON analysis_jobs FOR EACH ROW EXECUTE FUNCTION analysis_jobs_announce_change();

DROP TRIGGER IF EXISTS analysis_jobs_announce_update ON public.analysis_jobs;
CREATE TRIGGER analysis_jobs_announce_update AFTER UPDATE ON analysis_jobs FOR EACH ROW WHEN (old.status IS DISTINCT FROM new.status OR old.last_error IS DISTINCT FROM new.last_error OR old.release_attempts IS DISTINCT FROM new.release_attempts OR old.capacity_token IS DISTINCT FROM new.capacity_token OR old.capacity_wait_since IS DISTINCT FROM new.capacity_wait_since) EXECUTE FUNCTION analysis_jobs_announce_change();
