-- Every B-tree index keyed by a rising time or sequence, once declared newest first (DESC), is
-- built ascending; the reads that want newest first scan it backwards, so no query changes and a
-- replica of the previous version reads them the same. Why: B-tree splits a full page in half
-- unless it is the rightmost one, which it packs to the fillfactor. A DESC index on a rising key
-- takes every new entry on its leftmost page (or, keyed by user first, at the front of the user's
-- run), so a split leaves half a page behind that no later entry fills; ascending, an index whose
-- entries are written once (the ledger's, the audit tables', the ended jobs') packs its pages
-- full (bench.probes.btree_turnover: 50% against 88%). It was not what kept the jobs' indexes
-- growing in the soak: kept re-check bases hold their pages (docs/scaling.md, section 12.3). The
-- index names keep saying what they are for. Admits and ends wait while the indexes are rebuilt
-- (docs/operations.md, "Migrations").
DROP INDEX analysis_jobs_cancels_newest_first;
CREATE INDEX analysis_jobs_cancels_newest_first ON analysis_jobs (COALESCE(cancel_requested_at, end_time), job_id) WHERE (canceled_by IS NOT NULL);
DROP INDEX analysis_jobs_ended_status_newest_admitted;
CREATE INDEX analysis_jobs_ended_status_newest_admitted ON analysis_jobs (status, create_time, job_id) WHERE (status = ANY (ARRAY['succeeded'::text, 'failed'::text, 'canceled'::text]));
DROP INDEX analysis_jobs_newest_admitted;
CREATE INDEX analysis_jobs_newest_admitted ON analysis_jobs (create_time, job_id);
DROP INDEX analysis_jobs_recent_first_pass_durations;
CREATE INDEX analysis_jobs_recent_first_pass_durations ON analysis_jobs (end_time) WHERE ((status = 'succeeded'::text) AND (delta_of_job_id IS NULL));
DROP INDEX analysis_jobs_recently_ended;
CREATE INDEX analysis_jobs_recently_ended ON analysis_jobs (end_time) WHERE (end_time IS NOT NULL);
DROP INDEX analysis_jobs_retries_newest_first;
CREATE INDEX analysis_jobs_retries_newest_first ON analysis_jobs (create_time, job_id) WHERE (retry_of_job_id IS NOT NULL);
DROP INDEX analysis_jobs_user_newest_admitted;
CREATE INDEX analysis_jobs_user_newest_admitted ON analysis_jobs (user_id, create_time, job_id);
DROP INDEX analysis_jobs_user_newest_first;
CREATE INDEX analysis_jobs_user_newest_first ON analysis_jobs (user_id, queue_seq);
DROP INDEX core_runs_lost_newest_first;
CREATE INDEX core_runs_lost_newest_first ON core_runs_lost (recorded_at);
DROP INDEX credit_ledger_actor_newest_first;
CREATE INDEX credit_ledger_actor_newest_first ON credit_ledger (actor, entry_id);
DROP INDEX credit_ledger_grants_newest_first;
CREATE INDEX credit_ledger_grants_newest_first ON credit_ledger (create_time, entry_id) WHERE (kind = 'grant'::text);
DROP INDEX credit_ledger_user_newest_first;
CREATE INDEX credit_ledger_user_newest_first ON credit_ledger (user_id, entry_id);
DROP INDEX queue_operator_actions_actor;
CREATE INDEX queue_operator_actions_actor ON queue_operator_actions (actor, create_time);
DROP INDEX queue_operator_actions_newest_first;
CREATE INDEX queue_operator_actions_newest_first ON queue_operator_actions (create_time, action_id);
DROP INDEX queue_operator_actions_user;
CREATE INDEX queue_operator_actions_user ON queue_operator_actions (user_id, create_time);
DROP INDEX queue_setting_changes_newest_first;
CREATE INDEX queue_setting_changes_newest_first ON queue_setting_changes (create_time, change_id);
