-- What an admit reads and writes: the run's reservation with the admit's state read in the
-- same statement, that state alone, and the locked admit itself.

-- name: reserve_run_and_read_admit_state
-- Records a run id before the admit hands it to the core's CreateRun, unless the idempotency key
-- already has a job (a repeated click needs no new run) or a live reservation of another admit of
-- the key (`run_reservations_one_live_per_key`: that admit alone calls the core, this one waits for
-- its outcome), and reads what admit decides on: the job already holding the key, the user's queue
-- length, running deltas and balance, and the delta base (`admit_state`). One statement, one
-- snapshot: `reserved` is false when the key's job exists or another admit of it is under way.
WITH reserved AS (
    INSERT INTO run_reservations (run_id, user_id, cancel_after, timeline_id, idempotency_key)
    SELECT %(run_id)s, %(user_id)s, clock_timestamp() + make_interval(secs => %(grace_seconds)s), queue_current_timeline(),
           %(idempotency_key)s
     WHERE NOT EXISTS (SELECT 1 FROM analysis_jobs
                        WHERE user_id = %(user_id)s AND idempotency_key = %(idempotency_key)s)
        ON CONFLICT (user_id, idempotency_key) WHERE NOT canceling DO NOTHING
    RETURNING run_id
)
SELECT EXISTS (SELECT 1 FROM reserved) AS reserved, state.*
  FROM (
-- include: admit_state
       ) AS state;

-- name: admit_state
-- What admit decides on: the job already holding this idempotency key, the user's queue length,
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
-- (docs/security.md, "What one user can store"). Read with the run's reservation (above), and
-- again after an admit placed nothing, to say why.
SELECT existing.job_id AS existing_job_id,
       existing.request_digest AS existing_digest,
       (SELECT count(*) FROM analysis_jobs q
         WHERE q.user_id = %(user_id)s AND q.status = 'queued') AS queued_count,
       (SELECT count(*) FROM analysis_jobs d
         WHERE d.user_id = %(user_id)s AND d.status IN ('pending', 'running') AND d.delta_of_job_id IS NOT NULL) AS running_deltas,
       EXISTS (SELECT 1 FROM queue_capacity c WHERE c.capacity > 0 OR c.core_limit IS NOT NULL)
       OR queue_releases_paused(%(user_id)s) AS capacity_limited,
       COALESCE((SELECT c.balance FROM credit_accounts c WHERE c.user_id = %(user_id)s), 0) AS balance,
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
                WHERE j.user_id = %(user_id)s AND j.create_time > clock_timestamp() - interval '1 hour'
                  AND ((j.price = 0 AND j.retry_of_job_id IS NULL)
                       OR ((starts_with(j.canceled_by, 'web:') OR j.canceled_by = 'anonymous')
                           AND EXISTS (SELECT 1 FROM credit_ledger r WHERE r.job_id = j.job_id AND r.kind = 'refund')))
                ORDER BY j.create_time DESC
                LIMIT %(max_free_admits)s) AS f) AS free
  LEFT JOIN analysis_jobs existing
         ON existing.user_id = %(user_id)s AND existing.idempotency_key = %(idempotency_key)s
  LEFT JOIN analysis_jobs base
         ON base.job_id = %(delta_of_job_id)s;

-- name: admit_job
-- A locked section (`locks.locked_section`): inserts the job deciding its status, claims a
-- 'pending' job's first release for this replica, consumes the run's reservation, debits the
-- price and writes the charge (functions/queue_admit_job_v2.sql). One 'admitted' row with the
-- job's view; none when the key is taken, the balance is short, the user's queue or delta limit
-- is full, or the reservation is gone. The job keeps its document and sources, and a retry the
-- job it admits again (`retry_of_job_id`, NULL for every other admit).
-- A delta whose run was created held is PENDING, waiting for a turn
-- (functions/queue_seat_on_entry.sql).
SELECT s.row_kind, s.refunded_amount, s.run_unsettled, (s.job_view).*, (SELECT queue_history_reconciled()) AS history_reconciled
  FROM queue_admit_job_v2(%(job_id)s, %(user_id)s, %(run_id)s, %(idempotency_key)s, %(request_digest)s,
                          %(delta_of_job_id)s::uuid, %(price)s, %(actor)s, %(reason)s, %(default_max_active)s,
                          %(max_queued)s, %(max_running_deltas)s, %(release_window_seconds)s,
                          %(release_lease_seconds)s, %(reconcile_after_seconds)s,
                          NULLIF(%(document_uri)s::text, ''), NULLIF(%(document_title)s::text, ''),
                          %(sources)s::jsonb, %(delta_held)s, %(retry_of_job_id)s::uuid) AS s
