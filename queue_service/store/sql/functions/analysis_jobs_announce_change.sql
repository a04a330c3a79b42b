-- analysis_jobs_announce_change: the function and its triggers analysis_jobs_announce_insert,
-- analysis_jobs_announce_update and analysis_jobs_announce_delete.
--
-- Why, migration by migration (its text below is the last one's):
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
-- * 0031 (streams hear of retries and prunes): A retry's INSERT also announces the ended job it
--   retries, whose view lists its retries (`retried_as_job_ids`) and which never changes on its
--   own again; its row is locked first, as an UPDATE would have locked it (the feed's per-job
--   order). A DELETE (the pruner past QUEUE_JOB_RETENTION_SECONDS) announces the job as it was:
--   the hub finds no view for it and tells its user's streams it vanished, as GetJob answers
--   NOT_FOUND (I11).

CREATE OR REPLACE FUNCTION public.analysis_jobs_announce_change()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    retried analysis_jobs%ROWTYPE;
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM analysis_jobs_announce(OLD, OLD.status);
        RETURN NULL;
    END IF;
    PERFORM analysis_jobs_announce(NEW, CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END);
    IF TG_OP = 'INSERT' AND NEW.retry_of_job_id IS NOT NULL THEN
        SELECT * INTO retried FROM analysis_jobs a WHERE a.job_id = NEW.retry_of_job_id FOR NO KEY UPDATE;
        IF FOUND THEN
            PERFORM analysis_jobs_announce(retried, retried.status);
        END IF;
    END IF;
    RETURN NULL;
END
$function$;

DROP TRIGGER IF EXISTS analysis_jobs_announce_insert ON public.analysis_jobs;
CREATE TRIGGER analysis_jobs_announce_insert AFTER INSERT ON analysis_jobs FOR EACH ROW EXECUTE FUNCTION analysis_jobs_announce_change();

DROP TRIGGER IF EXISTS analysis_jobs_announce_update ON public.analysis_jobs;
CREATE TRIGGER analysis_jobs_announce_update AFTER UPDATE ON analysis_jobs FOR EACH ROW WHEN (old.status IS DISTINCT FROM new.status OR old.last_error IS DISTINCT FROM new.last_error OR old.release_attempts IS DISTINCT FROM new.release_attempts OR old.capacity_token IS DISTINCT FROM new.capacity_token OR old.capacity_wait_since IS DISTINCT FROM new.capacity_wait_since) EXECUTE FUNCTION analysis_jobs_announce_change();

DROP TRIGGER IF EXISTS analysis_jobs_announce_delete ON public.analysis_jobs;
CREATE TRIGGER analysis_jobs_announce_delete AFTER DELETE ON analysis_jobs FOR EACH ROW EXECUTE FUNCTION analysis_jobs_announce_change();
