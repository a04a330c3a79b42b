-- The audit timeline (OperatorService.ListAuditEvents): the operator's calls that left no record,
-- and the indexes that read the timeline's other sources newest first.
--
-- `queue_operator_actions` holds one row per Promote, Release and CheckJobWithCore call (the
-- tooling an operator uses on one user or one job): who, on whom, when, and what came of it. The
-- other events of the timeline are already recorded where they happen: setting changes in
-- `queue_setting_changes`, grants in the ledger, cancels in `analysis_jobs.canceled_by` (with
-- `cancel_requested_at`), retries in `analysis_jobs.retry_of_job_id` (the charge's actor is the
-- retrying operator). Operator-only calls write it, a row of at most a few hundred bytes.
--
-- Additive for running replicas: a replica of the previous version neither writes nor reads it.

CREATE TABLE queue_operator_actions (
    action_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action      text NOT NULL CHECK (action IN ('promote', 'release', 'check_with_core')),
    actor       text NOT NULL,
    user_id     text NOT NULL DEFAULT '',
    job_id      uuid,
    outcome     text NOT NULL DEFAULT '' CHECK (char_length(outcome) <= 512),
    create_time timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Each source of the timeline newest first, so a page reads a page's worth of each.
CREATE INDEX queue_operator_actions_newest_first ON queue_operator_actions (create_time DESC, action_id DESC);
CREATE INDEX queue_operator_actions_actor ON queue_operator_actions (actor, create_time DESC);
CREATE INDEX queue_operator_actions_user ON queue_operator_actions (user_id, create_time DESC);
CREATE INDEX queue_setting_changes_newest_first ON queue_setting_changes (create_time DESC, change_id DESC);
CREATE INDEX credit_ledger_grants_newest_first ON credit_ledger (create_time DESC, entry_id DESC) WHERE kind = 'grant';
-- A cancel's time: when it was asked for (a RUNNING or PENDING job's recorded intent), else when
-- the job ended (a QUEUED job canceled at once).
CREATE INDEX analysis_jobs_cancels_newest_first ON analysis_jobs ((COALESCE(cancel_requested_at, end_time)) DESC, job_id DESC)
    WHERE canceled_by IS NOT NULL;
CREATE INDEX analysis_jobs_retries_newest_first ON analysis_jobs (create_time DESC, job_id DESC)
    WHERE retry_of_job_id IS NOT NULL;
