-- The database histories (system identifier and timeline) whose judging runs the queue has
-- reconciled with the core's live runs. Only a failover (a new timeline) or a restore (a new
-- system) can make the database forget a run the core judges, and the first reconciliation on
-- the new history adopts what it forgot; until a history is recorded here, every first-pass
-- release asks the core first (I9 at the core), and once it is, the slot index is enough again.
CREATE TABLE core_reconciled_histories (
    system_identifier text NOT NULL,
    timeline_id integer NOT NULL,
    reconciled_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (system_identifier, timeline_id)
);

-- Whether the history this primary writes now is recorded above (false on a standby). The
-- timeline is `queue_current_timeline()` (migration 0019): the one the current WAL segment is
-- written on, which a promoted standby starts at once. A role that may not read the control file's system identifier gets false (every
-- release asks the core, as before the record). Evaluated by the statements that claim releases,
-- so a claim knows whether its own database history is reconciled.
CREATE FUNCTION queue_history_reconciled() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN pg_is_in_recovery() OR NOT has_function_privilege('pg_control_system()', 'EXECUTE') THEN false
                ELSE EXISTS (
                    SELECT 1 FROM core_reconciled_histories
                     WHERE system_identifier = (SELECT system_identifier FROM pg_control_system())::text
                       AND timeline_id = queue_current_timeline())
           END
$$;
