-- Ended jobs do not stay forever (docs/security.md, "What one user can store"): the sweeper
-- (engine/pruner.py) empties an ended job's `sources` after QUEUE_JOB_INPUTS_RETENTION_SECONDS
-- (the preview, the counts and the document stay) and deletes the job after
-- QUEUE_JOB_RETENTION_SECONDS.
--
-- The credit ledger outlives its jobs: a pruned job's charge and refund stay, so every balance
-- still equals the sum of its ledger (I3) and the audit trail keeps every movement. The ledger's
-- `job_id` therefore no longer references a row that must exist; `credit_ledger_once_per_job`
-- still charges a job once and refunds it at most once.
--
-- The index finds ended jobs that still hold their sources, oldest ended first, so each pass
-- reads only what it empties (`analysis_jobs_recently_ended` would walk every emptied job kept
-- for the longer retention, every pass). The deletion walks `analysis_jobs_recently_ended`.
--
-- Additive for running replicas: no query of theirs changes, none of them deletes a job.

ALTER TABLE credit_ledger DROP CONSTRAINT credit_ledger_job_id_fkey;

CREATE INDEX analysis_jobs_ended_holding_sources
    ON analysis_jobs (end_time)
    WHERE end_time IS NOT NULL AND sources IS NOT NULL;
