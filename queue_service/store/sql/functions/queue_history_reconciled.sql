-- queue_history_reconciled: the function.
-- requires: queue_current_timeline
--
-- Why, migration by migration (its text below is the last one's):
-- * 0021 (reconciled histories): Whether the history this primary writes now is recorded above
--   (false on a standby). The timeline is `queue_current_timeline()` (migration 0019): the one the
--   current WAL segment is written on, which a promoted standby starts at once. A role that may not
--   read the control file's system identifier gets false (every release asks the core, as before
--   the record). Evaluated by the statements that claim releases, so a claim knows whether its own
--   database history is reconciled.

CREATE OR REPLACE FUNCTION public.queue_history_reconciled()
 RETURNS boolean
 LANGUAGE sql
 STABLE
AS $function$
    SELECT CASE WHEN pg_is_in_recovery() OR NOT has_function_privilege('pg_control_system()', 'EXECUTE') THEN false
                ELSE EXISTS (
                    SELECT 1 FROM core_reconciled_histories
                     WHERE system_identifier = (SELECT system_identifier FROM pg_control_system())::text
                       AND timeline_id = queue_current_timeline())
           END
$function$;
