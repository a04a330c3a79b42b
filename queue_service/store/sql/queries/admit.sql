-- What an admit reads and writes: the run's reservation with the admit's state read in the
-- same statement, that state alone, and the locked admit itself.

-- name: reserve_run_and_read_admit_state
-- Records a run id before the admit hands it to the core's CreateRun, unless the idempotency key
-- already has a job (a repeated click needs no new run) or a live reservation of another admit of
-- the key (`run_reservations_one_live_per_key`: that admit alone calls the core, this one waits for
-- its outcome), and reads what admit decides on: the job already holding the key, the user's queue
-- length, running deltas and balance, and the delta base (functions/queue_admit_state.sql). One
-- statement, one snapshot: `reserved` is false when the key's job exists or another admit of it is
-- under way.
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
  FROM queue_admit_state(%(user_id)s, %(idempotency_key)s, %(delta_of_job_id)s, %(max_free_admits)s) AS state;

-- name: admit_state
-- What admit decides on (functions/queue_admit_state.sql), read again after an admit placed
-- nothing, to say why.
SELECT state.* FROM queue_admit_state(%(user_id)s, %(idempotency_key)s, %(delta_of_job_id)s, %(max_free_admits)s) AS state;

-- name: admit_job
-- A locked section (`locks.locked_section`): inserts the job deciding its status, claims a
-- 'pending' job's first release for this replica, consumes the run's reservation, debits the
-- price and writes the charge (functions/queue_admit_job_v2.sql). One 'admitted' row with the
-- job's view; none when the key is taken, the balance is short, the user's queue or delta limit
-- is full, or the reservation is gone. The job keeps its document and sources, and a retry the
-- job it admits again (`retry_of_job_id`, NULL for every other admit).
-- A delta whose run was created held is PENDING, waiting for a turn
-- (functions/queue_seat_on_entry.sql). Whether the history is reconciled is read only for a
-- PENDING job, the one an admit may hand a release: a queued admit, the common one, does not
-- pay for the control file's read (about 0.07 ms of PostgreSQL's time per admit) for nothing.
SELECT s.row_kind, s.refunded_amount, s.run_unsettled, (s.job_view).*,
       CASE WHEN (s.job_view).status = 'pending' THEN queue_history_reconciled() END AS history_reconciled
  FROM queue_admit_job_v2(%(job_id)s, %(user_id)s, %(run_id)s, %(idempotency_key)s, %(request_digest)s,
                          %(delta_of_job_id)s::uuid, %(price)s, %(actor)s, %(reason)s, %(default_max_active)s,
                          %(max_queued)s, %(max_running_deltas)s, %(release_window_seconds)s,
                          %(release_lease_seconds)s, %(reconcile_after_seconds)s,
                          NULLIF(%(document_uri)s::text, ''), NULLIF(%(document_title)s::text, ''),
                          %(sources)s::jsonb, %(delta_held)s, %(retry_of_job_id)s::uuid) AS s
