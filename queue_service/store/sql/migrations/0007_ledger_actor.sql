-- The audit trail: who moved each credit (`actor`) and why (`reason`), read by operators newest
-- first by user, by job, or across users (OperatorService.ListLedgerEntries).
--
-- Both columns have defaults, so replicas of the previous version keep inserting without naming
-- them during a rolling deploy; their entries, and every entry written before this migration,
-- read `unknown` (adding a column with a constant default rewrites no rows).
--   actor:  `<role>:<name>` of the caller the auth layer identified (`operator:alice`,
--           `web:web-backend`, `core:rust-core`), `anonymous` when authentication is off, or
--           `system:<reason>` for the service's own work (sweeper, dispatcher, reconciliation).
--   reason: the cause of the movement: grant, admit, cancel, completion, release,
--           release_give_up, reconcile.

ALTER TABLE credit_ledger
    ADD COLUMN actor  text NOT NULL DEFAULT 'unknown',
    ADD COLUMN reason text NOT NULL DEFAULT 'unknown';

-- A user's entries newest first (keyset on entry_id); it serves the old by-user lookups too.
-- By job: the unique (job_id, kind) of migration 0001 (two entries per job at most).
-- Across users: the primary key, read backwards.
CREATE INDEX credit_ledger_user_newest_first ON credit_ledger (user_id, entry_id DESC);

DROP INDEX credit_ledger_by_user;
