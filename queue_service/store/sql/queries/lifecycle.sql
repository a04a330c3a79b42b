-- The locked sections that move a job on (end, promote, settle its run, refund), the reads
-- they decide on, and a user's cancel recorded before the core is asked.

-- name: settle_job_run
-- A locked section: the core confirmed an ended job's run settled, so the job lets go of its slot
-- and the user's free slots are filled (functions/queue_settle_job_run.sql). A 'settled' row
-- when the run was unsettled until now, then a 'promoted' row per promoted job.
SELECT s.row_kind, s.refunded_amount, s.run_unsettled, (s.job_view).*, (SELECT queue_history_reconciled()) AS history_reconciled
  FROM queue_settle_job_run(%(job_id)s, %(settle_user_id)s, %(default_max_active)s, %(release_window_seconds)s,
                            %(release_lease_seconds)s) AS s

-- name: refund_failed_job
-- A locked section: refunds a job that ended FAILED while its user canceled it
-- (functions/queue_refund_failed_job.sql). A 'refunded' row with the amount; none when the job
-- did not fail.
SELECT s.row_kind, s.refunded_amount, s.run_unsettled, (s.job_view).*
  FROM queue_refund_failed_job(%(job_id)s, %(actor)s, %(reason)s) AS s

-- name: end_job
-- A locked section: ends a job by a named transition, refunds it when asked and, when its run is
-- settled, fills the freed slots (functions/queue_end_job_viewed.sql). No rows when the job
-- was not in an expected status (fenced); else an 'ended' row with the job's view, then a
-- 'promoted' row per promoted job.
SELECT s.row_kind, s.refunded_amount, s.run_unsettled, (s.job_view).*, (SELECT queue_history_reconciled()) AS history_reconciled
  FROM queue_end_job_viewed(%(job_id)s, %(status)s, %(from_statuses)s::text[], %(last_error)s,
                            %(expected_attempts)s::integer, %(run_unsettled)s, %(refund)s, %(actor)s,
                            %(reason)s, %(default_max_active)s, %(release_window_seconds)s,
                            %(release_lease_seconds)s) AS s

-- name: promote
-- A locked section: fills every free slot of the user from the queue, oldest first, each promoted
-- job's first release claimed for this replica (functions/queue_promote_viewed.sql). A
-- 'promoted' row per promoted job, in order.
SELECT s.row_kind, s.refunded_amount, s.run_unsettled, (s.job_view).*, (SELECT queue_history_reconciled()) AS history_reconciled
  FROM queue_promote_viewed(%(promote_user_id)s, %(default_max_active)s, %(release_window_seconds)s,
                            %(release_lease_seconds)s) AS s

-- name: job_by_id
-- One job's row fields the lifecycle needs. A job waits for capacity as the view says
-- (analysis_job_views.waiting_for_capacity): its run was never released since it began to wait.
SELECT job_id, user_id, run_id, status, delta_of_job_id, run_settle_due_at IS NOT NULL AS run_unsettled,
       cancel_requested_at IS NOT NULL AS cancel_requested, canceled_by, release_attempts,
       status = 'pending' AND capacity_wait_since IS NOT NULL AND capacity_token IS NULL AS waiting_for_capacity
  FROM analysis_jobs WHERE job_id = %(job_id)s;

-- name: waiting_jobs_to_cancel
-- PENDING jobs waiting for the fleet's capacity whose user's cancel was recorded (the intent came
-- while a grant was being released, and that release met the core at its capacity): no release
-- of theirs is due until a grant, so the sweeper ends them instead (`Sweeper.sweep_once`).
SELECT job_id, user_id
  FROM analysis_jobs
 WHERE status = 'pending' AND capacity_wait_since IS NOT NULL AND capacity_token IS NULL
   AND cancel_requested_at IS NOT NULL
 LIMIT %(batch_size)s;

-- name: record_cancel_request
-- The user asked to cancel a PENDING or RUNNING job: recorded before the core is asked, so every
-- ending that follows applies it (`cancel_requested_at`). Fenced: no row when the job is no longer
-- active (it ended, or is still QUEUED). The first request's time is kept. A RUNNING job is due
-- for the sweeper's reconciliation after `cancel_recheck_seconds`, which asks the core to cancel
-- again if no answer has ended the job by then. Who asked is kept with it (`canceled_by`, the
-- first asker), so the ending names them whoever applies it.
UPDATE analysis_jobs
   SET cancel_requested_at = COALESCE(cancel_requested_at, clock_timestamp()),
       canceled_by = COALESCE(canceled_by, %(actor)s),
       next_reconcile_at = CASE WHEN status = 'running'
                                THEN LEAST(next_reconcile_at, clock_timestamp() + make_interval(secs => %(cancel_recheck_seconds)s))
                           END,
       -- A PENDING job whose retry a pause holds is due again after the recheck, so an
       -- unanswered cancel reaches the core anyway (functions/queue_seat_due_for_cancel.sql).
       next_release_at = queue_seat_due_for_cancel(status, next_release_at, capacity_wait_since, capacity_token,
                                                   %(cancel_recheck_seconds)s)
 WHERE job_id = %(job_id)s AND status IN ('pending', 'running')
RETURNING job_id;

-- name: users_needing_promotion
-- Users with queued work and a free slot: what a lost tail call left behind.
-- OFFSET 0 keeps the DISTINCT a subquery of its own, so the free-slot check runs once per user
-- rather than once per queued job.
SELECT u.user_id
  FROM (SELECT DISTINCT user_id FROM analysis_jobs WHERE status = 'queued' OFFSET 0) AS u
 WHERE analysis_jobs_free_slot(u.user_id, %(default_max_active)s) IS NOT NULL
 LIMIT %(batch_size)s;

-- name: expired_pending_releases
-- Pending jobs past their release window that no replica is attempting right now.
SELECT job_id, user_id, release_attempts
  FROM analysis_jobs
 WHERE status = 'pending' AND release_deadline < clock_timestamp() AND next_release_at < clock_timestamp()
 ORDER BY release_deadline
 LIMIT %(batch_size)s;

-- name: end_runs
-- `end_run` for several runs in one statement (`locks.locked_sections_of_runs`: every run's user
-- locked first). Each run's rows carry its 1-based place in the arrays (`batch_index`); each
-- run's owner is read in the statement's snapshot, the one its lock was chosen from. The arrays
-- are read through subqueries, so its prepared statement keeps a generic plan (see `mark_released`).
SELECT r.batch_index, s.row_kind, s.refunded_amount, s.run_unsettled, (s.job_view).*, (SELECT queue_history_reconciled()) AS history_reconciled
  FROM unnest((SELECT %(run_ids)s::uuid[]), (SELECT %(statuses)s::text[]), (SELECT %(last_errors)s::text[]),
              (SELECT %(refunds)s::boolean[]), (SELECT %(actors)s::text[]), (SELECT %(reasons)s::text[]))
       WITH ORDINALITY AS r(run_id, status, last_error, refund, actor, reason, batch_index),
       LATERAL queue_end_run_viewed(r.run_id, (SELECT j.user_id FROM analysis_jobs j WHERE j.run_id = r.run_id),
                                    r.status, r.last_error, r.refund, r.actor, r.reason, %(default_max_active)s,
                                    %(release_window_seconds)s, %(release_lease_seconds)s) AS s

-- name: end_run
-- A locked section keyed by the run's job's user (`locks.locked_section_of_run`): ends that job as
-- the core reported, refunds when asked and fills the freed slots (functions/queue_end_run_viewed.sql). An 'ended' row then 'promoted' rows; an 'owner' row (the job was not active);
-- or a 'reserved' / 'unknown' row without a job.
SELECT s.row_kind, s.refunded_amount, s.run_unsettled, (s.job_view).*, (SELECT queue_history_reconciled()) AS history_reconciled
  FROM queue_end_run_viewed(%(run_id)s, locked.locked_user_id, %(status)s, %(last_error)s, %(refund)s,
                            %(actor)s, %(reason)s, %(default_max_active)s, %(release_window_seconds)s,
                            %(release_lease_seconds)s) AS s
