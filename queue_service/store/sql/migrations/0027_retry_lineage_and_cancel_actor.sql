-- A retried job names the job it retries, and a canceled job names who canceled it.
--
-- `retry_of_job_id`: the ended job this one admits again (OperatorService.RetryJob, RetryJobs).
-- It is read from the job's idempotency key, which a retry builds as `retry:<ended job id>...`
-- and Admit refuses to any other caller (api/servicers/retry.py), so the trigger of
-- functions/analysis_jobs_retry_lineage.sql fills it at every INSERT: replicas of the previous
-- version, which do not know the column, and an adoption after a failover (which keeps the
-- key) record the lineage too. The UPDATE below gives the retries admitted before this migration
-- theirs. The index finds a job's retries ("retried as"), which the job view lists and which
-- guard a plain retry from admitting a second one; it holds only retries.
--
-- `canceled_by`: who asked for the cancel, as the ledger names actors (`web:web-backend` for a
-- user's CancelJob through the web app, `operator:alice` for the console, `system:<reason>` for
-- the service itself). Recorded with the cancel intent (queries.sql `record_cancel_request`) or
-- by the ending of a QUEUED or waiting job (functions/queue_end_job.sql); the first asker is
-- kept. NULL for a job nobody asked to cancel (a run the core canceled on its own) and for jobs
-- canceled before this migration.
--
-- Additive for running replicas: they neither read nor write `canceled_by`, and the view gains
-- columns at its end only.

ALTER TABLE analysis_jobs ADD COLUMN retry_of_job_id uuid;
ALTER TABLE analysis_jobs ADD COLUMN canceled_by text;

UPDATE analysis_jobs
   SET retry_of_job_id = substring(idempotency_key FROM 7 FOR 36)::uuid
 WHERE idempotency_key ~ '^retry:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}';

CREATE INDEX analysis_jobs_retries
    ON analysis_jobs (retry_of_job_id, create_time)
    WHERE retry_of_job_id IS NOT NULL;
