-- analysis_jobs_retry_lineage: the function and its trigger analysis_jobs_retry_lineage_insert.
--
-- Kept only while replicas of the previous version may insert jobs without naming the lineage
-- (their calls of queue_admit_job and queue_adopt_run, which pass none): dropped, with those
-- signatures, by the migration after the next release. The service's own writers pass it
-- (queue_admit_job_v2, queue_adopt_run_v2), and an explicit value is never overridden (the
-- function fills only a NULL).
--
-- Why, migration by migration (its text below is the last one's):
-- * 0027 (retry lineage and cancel actor): A job admitted by a retry records the job it retries,
--   read from its idempotency key (`retry:<ended job id>` or `retry:<ended job id>:<digest>`,
--   api/servicers/retry.py; Admit refuses the prefix to every other caller). Done at the INSERT,
--   so every admit path records it in the same statement: the admit of every version, and an
--   adoption after a failover, which keeps the run's key.
-- * 0038 (retry lineage from its writer): The writers pass the lineage themselves
--   (queue_admit_job_v2, queue_adopt_run_v2); the trigger stays for the previous version's calls
--   only, unchanged.

CREATE OR REPLACE FUNCTION public.analysis_jobs_retry_lineage()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF NEW.retry_of_job_id IS NULL AND NEW.idempotency_key ~ '^retry:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}' THEN
        NEW.retry_of_job_id := substring(NEW.idempotency_key FROM 7 FOR 36)::uuid;
    END IF;
    RETURN NEW;
END
$function$;

DROP TRIGGER IF EXISTS analysis_jobs_retry_lineage_insert ON public.analysis_jobs;
CREATE TRIGGER analysis_jobs_retry_lineage_insert BEFORE INSERT ON analysis_jobs FOR EACH ROW WHEN (new.idempotency_key LIKE 'retry:%') EXECUTE FUNCTION analysis_jobs_retry_lineage();
