-- queue_admit_state: the function.
--
-- What an admit decides on: the job already holding this idempotency key, the user's queue length,
-- active deltas (waiting for a turn or judging) and balance, the delta base, whether the fleet's
-- capacity is limited or her releases are paused (a delta's run is then created held, to wait for
-- its turn), and her free work of the last hour: her jobs admitted within it that cost nothing in
-- the end by her own choice, at most `max_free_admits` of them (read newest first on
-- `analysis_jobs_user_newest_admitted`, each refund by `credit_ledger_once_per_job`), with the
-- seconds until the oldest of those leaves the hour. Her choice: a job priced 0 that she admitted
-- (an operator's retry is not hers), or one refunded after she asked to cancel it (`canceled_by`,
-- migration 0027: the web app acting for her, `web:<name>`, or with authentication off anyone,
-- `anonymous`). A refund she did not ask for (the core's failure with `refund_credit`, a release
-- given up, a reconciliation, an operator's or the service's cancel) never counts
-- (docs/security.md, "What one user can store"). Read with the run's reservation, and again
-- after an admit placed nothing, to say why (sql/queries/admit.sql).
--
-- Why (its text below is the last one's):
-- * Round five of the performance work (a file alone, no migration): the read was the admit's
--   named query `admit_state` (sql/queries/admit.sql), included in the run's reservation. Prepared,
--   that statement was planned afresh on every call once its tables had grown and been analyzed
--   (1.4 ms of planning and 0.85 ms to run, against 0.36 ms on its generic plan): the plan cache
--   compares the generic plan's cost, taken when the plan is rebuilt, with the average cost of the
--   custom plans made since the statement was prepared, and the custom plans kept coming out
--   cheaper on paper. Here the read always runs on its generic plan (`SET plan_cache_mode`), which
--   bench/explain.py checks is index-driven; the statements that call it have no plan worth
--   making again per call. STABLE: it reads with the snapshot of the statement that calls it, so
--   the reservation and this read still see one snapshot.

CREATE OR REPLACE FUNCTION public.queue_admit_state(p_user_id text, p_idempotency_key text, p_delta_of_job_id uuid, p_max_free_admits integer)
 RETURNS TABLE(existing_job_id uuid, existing_digest bytea, queued_count bigint, running_deltas bigint, capacity_limited boolean, balance bigint, base_user_id text, base_status text, base_run_id uuid, free_admits_last_hour bigint, free_admit_frees_in_seconds double precision)
 LANGUAGE plpgsql
 STABLE
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
-- The result's columns are also PL/pgSQL variables: a name in the query is the table's column.
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT existing.job_id AS existing_job_id,
           existing.request_digest AS existing_digest,
           (SELECT count(*) FROM analysis_jobs q
             WHERE q.user_id = p_user_id AND q.status = 'queued') AS queued_count,
           (SELECT count(*) FROM analysis_jobs d
             WHERE d.user_id = p_user_id AND d.status IN ('pending', 'running') AND d.delta_of_job_id IS NOT NULL) AS running_deltas,
           EXISTS (SELECT 1 FROM queue_capacity c WHERE c.capacity > 0 OR c.core_limit IS NOT NULL)
           OR queue_releases_paused(p_user_id) AS capacity_limited,
           COALESCE((SELECT c.balance FROM credit_accounts c WHERE c.user_id = p_user_id), 0) AS balance,
           base.user_id AS base_user_id,
           base.status AS base_status,
           base.run_id AS base_run_id,
           free.admits AS free_admits_last_hour,
           free.frees_in_seconds AS free_admit_frees_in_seconds
      FROM (SELECT 1) AS one
     CROSS JOIN LATERAL (
           SELECT count(*) AS admits,
                  extract(epoch FROM min(f.create_time) + interval '1 hour' - clock_timestamp())::float8 AS frees_in_seconds
             FROM (SELECT j.create_time FROM analysis_jobs j
                    WHERE j.user_id = p_user_id AND j.create_time > clock_timestamp() - interval '1 hour'
                      AND ((j.price = 0 AND j.retry_of_job_id IS NULL)
                           OR ((starts_with(j.canceled_by, 'web:') OR j.canceled_by = 'anonymous')
                               AND EXISTS (SELECT 1 FROM credit_ledger r WHERE r.job_id = j.job_id AND r.kind = 'refund')))
                    ORDER BY j.create_time DESC
                    LIMIT p_max_free_admits) AS f) AS free
      LEFT JOIN analysis_jobs existing
             ON existing.user_id = p_user_id AND existing.idempotency_key = p_idempotency_key
      LEFT JOIN analysis_jobs base
             ON base.job_id = p_delta_of_job_id;
END
$function$;
