-- Every runtime query of the service, by name. `store.py` loads this file once and is the only
-- code that runs these. Blocks start with `-- name: <query_name>` and a description line. A line
-- `-- include: <query_name>` stands for that query's text (without its `;`), so a query another
-- one reads too is written once.
-- State changes are fenced: each UPDATE names the status (and attempt) it expects, so a late
-- duplicate is a harmless no-op.

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
-- price and writes the charge (functions/queue_admit_job.sql). One 'admitted' row with the
-- job's view; none when the key is taken, the balance is short, the user's queue or delta limit
-- is full, or the reservation is gone. The job keeps its document and sources.
-- A delta whose run was created held is PENDING, waiting for a turn (the trigger of
-- functions/analysis_jobs_wait_for_capacity.sql).
SELECT s.row_kind, s.refunded_amount, s.run_unsettled, (s.job_view).*, (SELECT queue_history_reconciled()) AS history_reconciled
  FROM queue_admit_job(%(job_id)s, %(user_id)s, %(run_id)s, %(idempotency_key)s, %(request_digest)s,
                       %(delta_of_job_id)s::uuid, %(price)s, %(actor)s, %(reason)s, %(default_max_active)s,
                       %(max_queued)s, %(max_running_deltas)s, %(release_window_seconds)s,
                       %(release_lease_seconds)s, %(reconcile_after_seconds)s,
                       NULLIF(%(document_uri)s::text, ''), NULLIF(%(document_title)s::text, ''),
                       %(sources)s::jsonb, %(delta_held)s) AS s

-- name: settle_job_run
-- A locked section: the core confirmed an ended job's run settled, so the job lets go of its slot
-- and the user's free slots are filled (functions/queue_settle_job_run.sql). A 'settled' row
-- when the run was unsettled until now, then a 'promoted' row per promoted job.
SELECT s.row_kind, s.refunded_amount, s.run_unsettled, (s.job_view).*, (SELECT queue_history_reconciled()) AS history_reconciled
  FROM queue_settle_job_run(%(job_id)s, %(settle_user_id)s, %(default_max_active)s, %(release_window_seconds)s,
                            %(release_lease_seconds)s) AS s

-- name: claim_due_run_settlements
-- Ended jobs whose run still has to be confirmed settled, due now; claimed for the lease (pushed
-- ahead, attempt counted) so one replica asks the core at a time.
UPDATE analysis_jobs j
   SET run_settle_due_at = clock_timestamp() + make_interval(secs => %(lease_seconds)s),
       run_settle_attempts = j.run_settle_attempts + 1
  FROM (SELECT job_id FROM analysis_jobs
         WHERE run_settle_due_at <= clock_timestamp()
         ORDER BY run_settle_due_at
         LIMIT %(batch_size)s
         FOR UPDATE SKIP LOCKED) AS due
 WHERE j.job_id = due.job_id
RETURNING j.job_id, j.user_id, j.run_id, j.run_settle_attempts;

-- name: schedule_run_settle_retry
-- The core gave no answer: ask again after the backoff (fenced by the attempt that failed).
UPDATE analysis_jobs
   SET run_settle_due_at = clock_timestamp() + make_interval(secs => %(backoff_seconds)s)
 WHERE job_id = %(job_id)s AND run_settle_due_at IS NOT NULL AND run_settle_attempts = %(attempt)s;

-- name: claim_run_reservation
-- A failed admit claims its own reservation before canceling the run, unless the admit did commit
-- after all (the reservation is gone) or the sweeper got there first. No row: cancel nothing.
UPDATE run_reservations
   SET canceling = true,
       cancel_after = clock_timestamp() + make_interval(secs => %(lease_seconds)s),
       cancel_attempts = cancel_attempts + 1
 WHERE run_id = %(run_id)s AND NOT canceling
RETURNING run_id, cancel_attempts;

-- name: claim_due_run_reservations
-- Reservations whose admit is gone (its grace or the last cancel's lease has passed), claimed so
-- one replica cancels each run at a time; an admit can no longer commit a claimed run.
UPDATE run_reservations r
   SET canceling = true,
       cancel_after = clock_timestamp() + make_interval(secs => %(lease_seconds)s),
       cancel_attempts = r.cancel_attempts + 1
  FROM (SELECT run_id FROM run_reservations
         WHERE cancel_after <= clock_timestamp()
         ORDER BY cancel_after
         LIMIT %(batch_size)s
         FOR UPDATE SKIP LOCKED) AS due
 WHERE r.run_id = due.run_id
RETURNING r.run_id, r.cancel_attempts;

-- name: schedule_run_reservation_retry
-- The core gave no answer to the reservation's CancelRun: try again after the backoff.
UPDATE run_reservations
   SET cancel_after = clock_timestamp() + make_interval(secs => %(backoff_seconds)s)
 WHERE run_id = %(run_id)s AND canceling AND cancel_attempts = %(attempt)s;

-- name: drop_run_reservation
-- The reserved run was never created at the core, or a job owns it now: forget it.
DELETE FROM run_reservations WHERE run_id = %(run_id)s;

-- name: settle_run_reservation
-- The failed admit's run is confirmed settled at the core: remembered as abandoned (never due
-- again), so a report of it that comes later is not taken for a job lost in a failover
-- (`run_reservations.settled_at`).
UPDATE run_reservations
   SET settled_at = clock_timestamp(), cancel_after = 'infinity'
 WHERE run_id = %(run_id)s AND settled_at IS NULL;

-- name: reservation_of_an_earlier_timeline
-- Whether the run's reservation was written on a primary a failover replaced
-- (functions/queue_current_timeline.sql).
SELECT EXISTS (SELECT 1 FROM run_reservations
                WHERE run_id = %(run_id)s AND settled_at IS NULL AND timeline_id < queue_current_timeline()) AS earlier;

-- name: run_abandoned
-- Whether the run was a failed admit's, confirmed settled at the core.
SELECT EXISTS (SELECT 1 FROM run_reservations WHERE run_id = %(run_id)s AND settled_at IS NOT NULL) AS abandoned;

-- name: forget_abandoned_runs
-- Abandoned runs older than the retention: the core reports none of them any more.
DELETE FROM run_reservations
 WHERE run_id IN (SELECT run_id FROM run_reservations
                   WHERE settled_at < clock_timestamp() - make_interval(secs => %(retention_seconds)s)
                   ORDER BY settled_at
                   LIMIT %(batch_size)s);

-- name: prune_ended_job_inputs
-- Empties the full sources of ended jobs (their runs settled) that ended more than the retention
-- ago, oldest first, at most `batch_size` (engine/pruner.py); the preview, the counts and the
-- document stay. `analysis_jobs_ended_holding_sources` finds exactly the jobs still holding them;
-- rows another transaction holds are left for the next batch.
UPDATE analysis_jobs j
   SET sources = NULL
  FROM (SELECT job_id FROM analysis_jobs
         WHERE end_time < clock_timestamp() - make_interval(secs => %(retention_seconds)s)
           AND end_time IS NOT NULL AND sources IS NOT NULL
           AND status IN ('succeeded', 'failed', 'canceled') AND run_settle_due_at IS NULL
         ORDER BY end_time
         LIMIT %(batch_size)s
         FOR UPDATE SKIP LOCKED) AS due
 WHERE j.job_id = due.job_id;

-- name: prune_ended_jobs
-- Deletes ended jobs (their runs settled) that ended more than the retention ago, oldest first,
-- at most `batch_size` (engine/pruner.py), read on `analysis_jobs_recently_ended`. A job a kept
-- delta re-check names as its base stays until that delta goes (the delta's reference must hold).
-- Their ledger entries stay (`credit_ledger.job_id` references no job); their search keys go with
-- them (`analysis_job_search_keys`, migration 0029). A job admitted within the last hour stays
-- whatever the retention: the free-work limit counts the hour's jobs (`admit_state`), so a
-- retention under an hour must not delete what it counts. Each deleted job is announced to the
-- job-change feed (functions/analysis_jobs_announce_change.sql), and open WatchJobs streams say it
-- vanished. Returns how many jobs it deleted.
WITH pruned AS (
    DELETE FROM analysis_jobs j
     USING (SELECT e.job_id FROM analysis_jobs e
             WHERE e.end_time < clock_timestamp() - make_interval(secs => %(retention_seconds)s)
               AND e.end_time IS NOT NULL
               AND e.create_time < clock_timestamp() - interval '1 hour'
               AND e.status IN ('succeeded', 'failed', 'canceled') AND e.run_settle_due_at IS NULL
               AND NOT EXISTS (SELECT 1 FROM analysis_jobs d WHERE d.delta_of_job_id = e.job_id)
             ORDER BY e.end_time
             LIMIT %(batch_size)s
             FOR UPDATE SKIP LOCKED) AS due
     WHERE j.job_id = due.job_id
    RETURNING j.job_id
), forgotten_keys AS (
    DELETE FROM analysis_job_search_keys k USING pruned WHERE k.job_id = pruned.job_id
)
SELECT count(*) AS pruned FROM pruned;

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
       -- A PENDING job whose retry a pause holds (`claim_due_releases`: the core may judge its
       -- run) is due again after the recheck, so an unanswered cancel reaches the core anyway.
       next_release_at = CASE WHEN status = 'pending' AND next_release_at IS NULL
                                   AND (capacity_wait_since IS NULL OR capacity_token IS NOT NULL)
                              THEN clock_timestamp() + make_interval(secs => %(cancel_recheck_seconds)s)
                              ELSE next_release_at
                         END
 WHERE job_id = %(job_id)s AND status IN ('pending', 'running')
RETURNING job_id;

-- name: claim_due_releases
-- Claims pending jobs due for release, skipping rows another replica is claiming, and reserves
-- them for this replica for the lease (pushes next_release_at ahead, counts the attempt). A job
-- whose user asked to cancel it (`cancel_requested`) is canceled instead of released. A due job
-- whose releases are paused (functions/queue_releases_paused.sql: a retry or a lease that fell due
-- during the pause) is not claimed: a pause holds releases, never the count. One whose due
-- attempt would still follow no release since it last waited (below `release_turn_attempt`: never
-- claimed, as an adopted held run, or only held back before the core was asked) goes back to
-- waiting for a grant; any other may have had a release the core applied (a lost answer, a lease
-- run out mid-call), so it keeps its place in what is in use
-- (its capacity token, or no wait at all) and only its retry is held: `next_release_at` NULL with
-- no wait for capacity, until the resume makes it due (functions/queue_set_releases_paused.sql) or
-- a cancel asks for it (`record_cancel_request`). Neither runs a release window.
WITH held AS (
    UPDATE analysis_jobs h
       SET capacity_wait_since = CASE WHEN h.release_attempts < h.release_turn_attempt THEN clock_timestamp() ELSE h.capacity_wait_since END,
           capacity_turn_key = CASE WHEN h.release_attempts < h.release_turn_attempt THEN clock_timestamp() ELSE h.capacity_turn_key END,
           capacity_token = CASE WHEN h.release_attempts < h.release_turn_attempt THEN NULL ELSE h.capacity_token END,
           next_release_at = NULL
      FROM (SELECT job_id FROM analysis_jobs
             -- With no pause in force (the usual case) a one-time filter: nothing is scanned.
             WHERE EXISTS (SELECT 1 FROM queue_release_pauses)
               AND status = 'pending' AND next_release_at <= clock_timestamp()
               AND cancel_requested_at IS NULL AND queue_releases_paused(user_id)
             LIMIT %(batch_size)s
             FOR UPDATE SKIP LOCKED) AS paused
     WHERE h.job_id = paused.job_id
)
UPDATE analysis_jobs j
   SET release_attempts = j.release_attempts + 1,
       next_release_at = clock_timestamp() + make_interval(secs => %(lease_seconds)s)
  FROM (SELECT job_id FROM analysis_jobs
         WHERE status = 'pending' AND next_release_at <= clock_timestamp()
           AND (NOT EXISTS (SELECT 1 FROM queue_release_pauses) OR cancel_requested_at IS NOT NULL
                OR NOT queue_releases_paused(user_id))
         ORDER BY next_release_at
         LIMIT %(batch_size)s
         FOR UPDATE SKIP LOCKED) AS due
 WHERE j.job_id = due.job_id
RETURNING j.job_id, j.user_id, j.run_id, j.release_attempts, j.cancel_requested_at IS NOT NULL AS cancel_requested,
          (SELECT queue_history_reconciled()) AS history_reconciled, j.delta_of_job_id IS NOT NULL AS delta;

-- name: hold_release_if_paused
-- A claimed release that waited in the dispatcher (for a place among the releases in flight) and
-- whose releases were paused meanwhile is not sent. A claim at the attempt that opened the job's
-- turn (its grant's, or the first of all: `release_turn_attempt`) follows no release since the job
-- last waited: the job goes back to waiting for a grant, its capacity given back. A later attempt
-- follows one the core may have applied: the job keeps its capacity and its retry is held, as
-- `claim_due_releases` holds one. Fenced by the attempt; the job's id and whether it waits again
-- when held, no row when its releases are not paused (or the attempt was overtaken).
UPDATE analysis_jobs
   SET capacity_wait_since = CASE WHEN release_attempts = release_turn_attempt THEN clock_timestamp() ELSE capacity_wait_since END,
       capacity_turn_key = CASE WHEN release_attempts = release_turn_attempt THEN clock_timestamp() ELSE capacity_turn_key END,
       capacity_token = CASE WHEN release_attempts = release_turn_attempt THEN NULL ELSE capacity_token END,
       next_release_at = NULL
 WHERE job_id = %(job_id)s AND status = 'pending' AND release_attempts = %(attempt)s
   AND cancel_requested_at IS NULL AND queue_releases_paused(user_id)
RETURNING job_id, release_attempts = release_turn_attempt AS waits_again;

-- name: run_owner
-- The user whose job owns a run (a job's user never changes); no row when no job owns it.
SELECT user_id FROM analysis_jobs WHERE run_id = %(run_id)s;

-- name: first_releases_owed
-- The user's PENDING jobs whose first release a promotion (or admit) claimed and nobody has
-- tried again since: the lease of that claim still runs, it is the first attempt, and the job
-- does not wait for the core's capacity (a grant hands those over). Run after a locked change
-- whose outcome was unknown, holding the user's lock (`Store.first_releases_owed`), so that a
-- change still committing has ended: the hand-over its answer would have made is made here. A
-- paused user's job (`held`) is not handed over: its release was never sent, so it goes back to
-- waiting for a grant, in this statement, as `hold_release_if_paused` sends back a claim at the
-- first attempt of its turn. A job with a recorded cancel is handed over (its run is canceled).
WITH owed AS (
    SELECT job_id, cancel_requested_at IS NULL AND queue_releases_paused(user_id) AS held
      FROM analysis_jobs
     WHERE user_id = %(user_id)s AND status = 'pending' AND release_attempts = 1
       AND next_release_at > clock_timestamp() AND capacity_wait_since IS NULL
       FOR UPDATE
), waiting AS (
    UPDATE analysis_jobs h
       SET capacity_wait_since = clock_timestamp(),
           capacity_turn_key = clock_timestamp(),
           capacity_token = NULL,
           next_release_at = NULL
      FROM owed
     WHERE h.job_id = owed.job_id AND owed.held
)
SELECT j.job_id, j.user_id, j.run_id, j.release_attempts, j.cancel_requested_at IS NOT NULL AS cancel_requested,
       (SELECT queue_history_reconciled()) AS history_reconciled, j.delta_of_job_id IS NOT NULL AS delta, owed.held
  FROM analysis_jobs j
  JOIN owed ON owed.job_id = j.job_id;

-- name: claim_release_of_job
-- Claims one pending job for an immediate release attempt (the Release RPC), unless another
-- replica holds it right now, it waits for the core's capacity (only a grant releases it) or its
-- releases are paused; as `claim_due_releases`, with its `cancel_requested`.
UPDATE analysis_jobs j
   SET release_attempts = j.release_attempts + 1,
       next_release_at = clock_timestamp() + make_interval(secs => %(lease_seconds)s)
  FROM (SELECT job_id FROM analysis_jobs
         WHERE job_id = %(job_id)s AND status = 'pending'
           AND NOT (capacity_wait_since IS NOT NULL AND capacity_token IS NULL)  -- waits for capacity
           AND (cancel_requested_at IS NOT NULL OR NOT queue_releases_paused(user_id))
         FOR UPDATE SKIP LOCKED) AS target
 WHERE j.job_id = target.job_id
RETURNING j.job_id, j.user_id, j.run_id, j.release_attempts, j.cancel_requested_at IS NOT NULL AS cancel_requested,
          (SELECT queue_history_reconciled()) AS history_reconciled, j.delta_of_job_id IS NOT NULL AS delta;

-- name: mark_released
-- The core accepted these releases: each job is RUNNING (fenced by the attempt that released it).
-- One statement for every release whose answer came while the previous one ran (the engine's
-- `Coalescer`): one commit and one WAL flush for a burst. The caller sorts the job ids, so two
-- such statements lock their rows in the same order.
--
-- The arrays are read through subqueries: a custom plan then does not see how many releases the
-- burst holds and costs what the generic plan costs, so PostgreSQL settles on the prepared
-- statement's generic plan. Given the arrays as constants, a custom plan of a burst of one is
-- cheaper than the generic plan's guess of ten, and whether PostgreSQL ever switched depended on
-- the sizes of a connection's first five bursts: in a saturated run it planned every call
-- afresh, the planning costing as much as the update.
UPDATE analysis_jobs j
   SET status = 'running',
       start_time = clock_timestamp(),
       next_release_at = NULL,
       last_error = '',
       next_reconcile_at = clock_timestamp() + make_interval(secs => %(reconcile_after_seconds)s)
  FROM unnest((SELECT %(job_ids)s::uuid[]), (SELECT %(attempts)s::integer[])) AS released(job_id, attempt)
 WHERE j.job_id = released.job_id AND j.status = 'pending' AND j.release_attempts = released.attempt
RETURNING j.job_id;

-- name: schedule_release_retry
-- A transient release failure: remember it and when to try again (never past the deadline);
-- `window_over` tells the caller the window has closed and the release must give up. An attempt
-- that sent nothing (`sent` false: held back before the core was asked) at the attempt that
-- opened the job's turn passes the turn on to the next attempt: it follows no release either.
UPDATE analysis_jobs
   SET next_release_at = LEAST(clock_timestamp() + make_interval(secs => %(backoff_seconds)s),
                               release_deadline),
       last_error = %(last_error)s,
       release_turn_attempt = CASE WHEN NOT %(sent)s AND release_turn_attempt = %(attempt)s
                                   THEN %(attempt)s + 1 ELSE release_turn_attempt END
 WHERE job_id = %(job_id)s AND status = 'pending' AND release_attempts = %(attempt)s
RETURNING next_release_at, release_deadline <= clock_timestamp() AS window_over;

-- name: next_release_due_in
-- Seconds until the earliest pending release is due (so the dispatcher sleeps exactly that long),
-- measured in the database's clock, the one next_release_at was set in: a replica whose own clock
-- is off still waits the right time; negative when one is overdue. NULL when nothing is pending
-- (not GREATEST(0, ...): GREATEST skips a NULL and said 0, so an idle dispatcher never slept).
SELECT extract(epoch FROM min(next_release_at) - clock_timestamp())::float8 AS seconds
  FROM analysis_jobs WHERE status = 'pending';

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

-- name: claim_due_reconciliations
-- Running jobs whose completion is overdue, or whose user's cancel went unanswered
-- (`cancel_requested`: the core is asked to cancel again, after `cancel_recheck_seconds`); claimed
-- (pushed ahead) so one replica asks the core.
UPDATE analysis_jobs j
   SET next_reconcile_at = clock_timestamp() + make_interval(secs => CASE WHEN j.cancel_requested_at IS NULL
                                                                          THEN %(recheck_seconds)s
                                                                          ELSE %(cancel_recheck_seconds)s END)
  FROM (SELECT job_id FROM analysis_jobs
         WHERE status = 'running' AND next_reconcile_at <= clock_timestamp()
         ORDER BY next_reconcile_at
         LIMIT %(batch_size)s
         FOR UPDATE SKIP LOCKED) AS due
 WHERE j.job_id = due.job_id
RETURNING j.job_id, j.user_id, j.run_id, j.cancel_requested_at IS NOT NULL AS cancel_requested;

-- name: job_views_by_ids
-- The API view of the given jobs.
SELECT * FROM analysis_job_views WHERE job_id = ANY(%(job_ids)s::uuid[]);

-- name: list_job_views
-- One page of a user's jobs, newest first (keyset on queue_seq), optionally by status. The page
-- starts after `after_job_id` (the last job of the previous page, one of this user's own), or
-- below `before_seq` (page tokens of earlier versions).
SELECT * FROM analysis_job_views
 WHERE user_id = %(user_id)s
   AND (%(before_seq)s::bigint IS NULL OR queue_seq < %(before_seq)s::bigint)
   AND (%(after_job_id)s::uuid IS NULL
        OR queue_seq < (SELECT a.queue_seq FROM analysis_jobs a
                         WHERE a.job_id = %(after_job_id)s::uuid AND a.user_id = %(user_id)s))
   AND (cardinality(%(statuses)s::text[]) = 0 OR status = ANY(%(statuses)s::text[]))
 ORDER BY queue_seq DESC
 LIMIT %(limit)s;

-- name: active_job_views_of_user
-- One page of a user's queued, pending and running jobs in queue order: those after queue_seq
-- `after_seq` (the WatchJobs snapshot, read a page at a time).
SELECT * FROM analysis_job_views
 WHERE user_id = %(user_id)s AND status IN ('queued', 'pending', 'running') AND queue_seq > %(after_seq)s
 ORDER BY queue_seq
 LIMIT %(limit)s;

-- name: watch_resync_views
-- One page (after queue_seq `after_seq`, in queue order) of what a WatchJobs stream missed during
-- a gap: the user's active jobs, the jobs it last reported as active (by queue_seq; they may have
-- ended meanwhile), and every job admitted after the newest it knew.
SELECT v.* FROM analysis_job_views v
 WHERE v.user_id = %(user_id)s
   AND v.queue_seq > %(after_seq)s
   AND v.job_id IN (SELECT a.job_id FROM analysis_jobs a
                     WHERE a.user_id = %(user_id)s AND a.queue_seq > %(after_seq)s
                       AND a.status IN ('queued', 'pending', 'running')
                    UNION ALL
                    SELECT r.job_id FROM analysis_jobs r
                     WHERE r.user_id = %(user_id)s AND r.queue_seq = ANY(%(seqs)s::bigint[])
                       AND r.queue_seq > %(after_seq)s
                    UNION ALL
                    SELECT n.job_id FROM analysis_jobs n
                     WHERE n.user_id = %(user_id)s AND n.queue_seq > GREATEST(%(newest_known_seq)s, %(after_seq)s))
 ORDER BY v.queue_seq
 LIMIT %(limit)s;

-- name: newest_seq_of_user
-- The queue_seq of the user's newest job (0 without jobs): where a WatchJobs stream's knowledge ends.
SELECT COALESCE(max(queue_seq), 0) AS seq FROM analysis_jobs WHERE user_id = %(user_id)s;

-- name: queued_job_views_of_user
-- A user's queued jobs in queue order (their positions shift when one leaves the queue).
SELECT * FROM analysis_job_views
 WHERE user_id = %(user_id)s AND status = 'queued'
 ORDER BY queue_seq;

-- name: recent_judging_seconds
-- Mean judging time of the latest first-pass jobs, for estimated start times.
SELECT avg(extract(epoch FROM end_time - start_time))::float8 AS seconds
  FROM (SELECT end_time, start_time FROM analysis_jobs
         WHERE status = 'succeeded' AND delta_of_job_id IS NULL AND start_time IS NOT NULL
         ORDER BY end_time DESC
         LIMIT 50) AS recent;

-- name: queue_depth
-- Jobs waiting, users waiting and jobs active, for the gauges (partial indexes only).
SELECT (SELECT count(*) FROM analysis_jobs WHERE status = 'queued') AS queued,
       (SELECT count(DISTINCT user_id) FROM analysis_jobs WHERE status = 'queued') AS users_waiting,
       (SELECT count(*) FROM analysis_jobs WHERE status = 'pending') AS pending,
       (SELECT count(*) FROM analysis_jobs WHERE status = 'running') AS running;

-- name: grant_credits
-- Adds a grant to the ledger and the balance, once per (user, key). No row for a repeated key.
-- The operator's note is NULL when none was given.
WITH grant_entry AS (
    INSERT INTO credit_ledger (user_id, kind, amount, idempotency_key, actor, reason, note)
    VALUES (%(user_id)s, 'grant', %(amount)s, %(idempotency_key)s, %(actor)s, %(reason)s, NULLIF(%(note)s::text, ''))
    ON CONFLICT (user_id, idempotency_key) WHERE kind = 'grant' DO NOTHING
    RETURNING user_id, amount
)
INSERT INTO credit_accounts AS c (user_id, balance)
SELECT user_id, amount FROM grant_entry
ON CONFLICT (user_id) DO UPDATE
   SET balance = c.balance + EXCLUDED.balance, updated_at = clock_timestamp()
RETURNING c.balance;

-- name: ledger_entries_of_job
-- One page of a job's ledger entries (its charge and refund), newest first, optionally within
-- one user and of one actor; the unique (job_id, kind) index finds them.
SELECT entry_id, create_time, user_id, kind, amount, job_id, idempotency_key, actor, reason, note
  FROM credit_ledger
 WHERE job_id = %(job_id)s
   AND (%(user_id)s::text = '' OR user_id = %(user_id)s::text)
   AND (%(actor)s::text = '' OR actor = %(actor)s::text)
   AND entry_id < COALESCE(%(before_entry_id)s::bigint, 9223372036854775807)
 ORDER BY entry_id DESC
 LIMIT %(limit)s;

-- name: ledger_entries_of_user
-- One page of a user's ledger entries, newest first (keyset on entry_id, `credit_ledger_user_newest_first`).
SELECT entry_id, create_time, user_id, kind, amount, job_id, idempotency_key, actor, reason, note
  FROM credit_ledger
 WHERE user_id = %(user_id)s
   AND entry_id < COALESCE(%(before_entry_id)s::bigint, 9223372036854775807)
 ORDER BY entry_id DESC
 LIMIT %(limit)s;

-- name: ledger_entries_of_actor
-- One page of one actor's ledger entries, optionally within one user, newest first (keyset on
-- entry_id, `credit_ledger_actor_newest_first`).
SELECT entry_id, create_time, user_id, kind, amount, job_id, idempotency_key, actor, reason, note
  FROM credit_ledger
 WHERE actor = %(actor)s
   AND (%(user_id)s::text = '' OR user_id = %(user_id)s::text)
   AND entry_id < COALESCE(%(before_entry_id)s::bigint, 9223372036854775807)
 ORDER BY entry_id DESC
 LIMIT %(limit)s;

-- name: ledger_entries
-- One page of every user's ledger entries, newest first (the primary key, read backwards).
SELECT entry_id, create_time, user_id, kind, amount, job_id, idempotency_key, actor, reason, note
  FROM credit_ledger
 WHERE entry_id < COALESCE(%(before_entry_id)s::bigint, 9223372036854775807)
 ORDER BY entry_id DESC
 LIMIT %(limit)s;

-- name: job_inputs
-- What a job was admitted with, in full (OperatorService.RetryJob); its primary key finds it.
-- `source_count` set with `sources` NULL: the sources were pruned past their retention. Its
-- newest retry, if any (the index of retries), guards a plain retry from admitting another.
SELECT j.job_id, j.user_id, j.status, j.delta_of_job_id, j.document_uri, j.document_title, j.sources, j.source_count,
       (SELECT r.job_id FROM analysis_jobs r
         WHERE r.retry_of_job_id = j.job_id
         ORDER BY r.create_time DESC, r.job_id DESC LIMIT 1) AS newest_retry_job_id
  FROM analysis_jobs j
 WHERE j.job_id = %(job_id)s;

-- name: grant_by_key
-- The earlier grant made with this key.
SELECT amount FROM credit_ledger
 WHERE user_id = %(user_id)s AND idempotency_key = %(idempotency_key)s AND kind = 'grant';

-- name: balance_of_user
-- A user's balance (0 without an account).
SELECT COALESCE((SELECT balance FROM credit_accounts WHERE user_id = %(user_id)s), 0) AS balance;

-- name: operator_overview
-- The operator's overview: active jobs from the partial indexes over the rows in flight, ended
-- jobs and admits within the window from the time indexes (`analysis_jobs_*newest_admitted`,
-- `analysis_jobs_recently_ended`). `now()`, not
-- clock_timestamp(): a volatile bound cannot be an index condition (the statement runs alone in
-- its transaction, so both are the same instant).
SELECT (SELECT count(*) FROM analysis_jobs WHERE status = 'queued') AS queued,
       (SELECT count(*) FROM analysis_jobs WHERE status = 'pending') AS pending,
       (SELECT count(*) FROM analysis_jobs WHERE status = 'running') AS running,
       (SELECT count(DISTINCT user_id) FROM analysis_jobs WHERE status = 'queued') AS users_waiting,
       (SELECT min(create_time) FROM analysis_jobs WHERE status = 'queued') AS oldest_queued_create_time,
       (SELECT count(*) FROM analysis_jobs
         WHERE status = 'pending' AND release_attempts > 0 AND last_error <> '') AS releases_retrying,
       -- Being reconciled with the core: RUNNING jobs whose completion is overdue or that were
       -- made due for a GetRun (after a failover), and ended jobs whose run the core has not
       -- confirmed settled yet (a run the core lost, a release given up): they keep their seats.
       ((SELECT count(*) FROM analysis_jobs
          WHERE status = 'running'
            AND (start_time < now() - make_interval(secs => %(reconcile_after_seconds)s) OR next_reconcile_at <= now()))
        + (SELECT count(*) FROM analysis_jobs WHERE run_settle_due_at IS NOT NULL)) AS runs_reconciling,
       ended.succeeded_in_window, ended.failed_in_window, ended.canceled_in_window,
       clock_timestamp() AS read_time
  FROM (SELECT count(*) FILTER (WHERE status = 'succeeded') AS succeeded_in_window,
               count(*) FILTER (WHERE status = 'failed') AS failed_in_window,
               count(*) FILTER (WHERE status = 'canceled') AS canceled_in_window
          FROM (SELECT status FROM analysis_jobs
                 WHERE end_time IS NOT NULL
                   AND end_time >= now() - make_interval(mins => %(window_minutes)s)
                 -- The order and the cap keep a prepared (generic) plan on the end_time index
                 -- whatever the window; a window with more ended jobs counts its newest 100000.
                 ORDER BY end_time DESC
                 LIMIT 100000) AS recent) AS ended;

-- name: users_with_work
-- The users with a QUEUED, PENDING or RUNNING job, the one waiting longest first. Each arm reads
-- one status through its partial index (the rows in flight), as the overview's counts do.
SELECT user_id,
       count(*) FILTER (WHERE status = 'queued') AS queued,
       count(*) FILTER (WHERE status = 'pending') AS pending,
       count(*) FILTER (WHERE status = 'running') AS running,
       min(create_time) FILTER (WHERE status = 'queued') AS oldest_queued_create_time,
       min(create_time) AS oldest_create_time,
       count(*) OVER () AS users_total
  FROM (SELECT user_id, status, create_time FROM analysis_jobs WHERE status = 'queued'
        UNION ALL
        SELECT user_id, status, create_time FROM analysis_jobs WHERE status = 'pending'
        UNION ALL
        SELECT user_id, status, create_time FROM analysis_jobs WHERE status = 'running') AS live
 GROUP BY user_id
 ORDER BY min(create_time) FILTER (WHERE status = 'queued') NULLS LAST, min(create_time), user_id
 LIMIT %(limit)s;

-- name: queue_history
-- A point per minute over the window: queued and active at the minute's end, admitted and ended
-- during it. The rows that can count are the ones in flight (partial indexes) and the window's
-- ended ones (the end_time index, capped as the overview caps them): every job admitted in the
-- window is one or the other. One pass: each job gives its events (admitted, promoted, ended) in
-- the window, counted per minute; the depth at a minute's end is the depth now minus what the
-- later minutes added (sums over the later minutes), so the cost grows with the window's jobs,
-- not with jobs times minutes. `now()`: index conditions (see operator_overview).
WITH bounds AS (
    SELECT date_trunc('minute', now()) - make_interval(mins => %(window_minutes)s - 1) AS first_minute
),
jobs AS (
    SELECT status, create_time, promote_time, end_time FROM analysis_jobs WHERE status = 'queued'
    UNION ALL
    SELECT status, create_time, promote_time, end_time FROM analysis_jobs WHERE status = 'pending'
    UNION ALL
    SELECT status, create_time, promote_time, end_time FROM analysis_jobs WHERE status = 'running'
    UNION ALL
    (SELECT status, create_time, promote_time, end_time FROM analysis_jobs
      WHERE end_time IS NOT NULL
        AND end_time >= date_trunc('minute', now()) - make_interval(mins => %(window_minutes)s - 1)
      ORDER BY end_time DESC
      LIMIT 100000)
),
depth_now AS (
    SELECT count(*) FILTER (WHERE status = 'queued') AS queued,
           count(*) FILTER (WHERE status IN ('pending', 'running')) AS active
      FROM jobs
),
events AS (
    -- (minute, admitted, promoted, left the queue, ended, ended while active)
    SELECT date_trunc('minute', j.create_time) AS minute, 1 AS admitted, 0 AS promoted, 0 AS left_queue, 0 AS ended, 0 AS ended_active
      FROM jobs j, bounds b WHERE j.create_time >= b.first_minute
    UNION ALL
    SELECT date_trunc('minute', j.promote_time), 0, 1, 1, 0, 0
      FROM jobs j, bounds b WHERE j.promote_time >= b.first_minute
    UNION ALL
    SELECT date_trunc('minute', j.end_time), 0, 0, (j.promote_time IS NULL)::int, 1, (j.promote_time IS NOT NULL)::int
      FROM jobs j, bounds b WHERE j.end_time >= b.first_minute
),
per_minute AS (
    SELECT m AS minute,
           count(e.minute) FILTER (WHERE e.admitted = 1) AS admitted,
           count(e.minute) FILTER (WHERE e.ended = 1) AS ended,
           COALESCE(sum(e.admitted - e.left_queue), 0) AS queued_change,
           COALESCE(sum(e.promoted - e.ended_active), 0) AS active_change
      FROM bounds b
     CROSS JOIN generate_series(b.first_minute, date_trunc('minute', now()), interval '1 minute') AS m
      LEFT JOIN events e ON e.minute = m
     GROUP BY m
)
SELECT p.minute, p.admitted, p.ended,
       d.queued - COALESCE(sum(p.queued_change) OVER later, 0) AS queued,
       d.active - COALESCE(sum(p.active_change) OVER later, 0) AS active
  FROM per_minute p, depth_now d
WINDOW later AS (ORDER BY p.minute DESC ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
 ORDER BY p.minute;

-- name: replica_heartbeat
-- This replica's report (`queue_replicas`), and the rows of replicas whose heartbeat stopped an
-- hour ago deleted (the index on heartbeat_time finds them).
WITH forgotten AS (
    DELETE FROM queue_replicas WHERE heartbeat_time < clock_timestamp() - interval '1 hour'
)
INSERT INTO queue_replicas AS r (replica_id, host, start_time, heartbeat_time, draining, calls_in_flight, watch_streams,
                                 overview_streams, core_answered, core_refused, core_unknown, core_last_unknown_at, core_health)
VALUES (%(replica_id)s, %(host)s, %(start_time)s, clock_timestamp(), %(draining)s, %(calls_in_flight)s, %(watch_streams)s,
        %(overview_streams)s, %(core_answered)s, %(core_refused)s, %(core_unknown)s, %(core_last_unknown_at)s,
        %(core_health)s)
ON CONFLICT (replica_id) DO UPDATE
   SET heartbeat_time = EXCLUDED.heartbeat_time, draining = EXCLUDED.draining,
       calls_in_flight = EXCLUDED.calls_in_flight, watch_streams = EXCLUDED.watch_streams,
       overview_streams = EXCLUDED.overview_streams, core_answered = EXCLUDED.core_answered,
       core_refused = EXCLUDED.core_refused, core_unknown = EXCLUDED.core_unknown,
       core_last_unknown_at = EXCLUDED.core_last_unknown_at, core_health = EXCLUDED.core_health;

-- name: forget_replica
-- A replica that stops cleanly leaves the list at once.
DELETE FROM queue_replicas WHERE replica_id = %(replica_id)s;

-- name: replicas
-- The replicas heard from within the last hour, the longest running first.
SELECT replica_id, host, start_time, heartbeat_time, draining, calls_in_flight, watch_streams, overview_streams,
       core_answered, core_refused, core_unknown, core_last_unknown_at, core_health, clock_timestamp() AS read_time
  FROM queue_replicas
 WHERE heartbeat_time >= clock_timestamp() - interval '1 hour'
 ORDER BY start_time, replica_id;

-- name: fresh_core_health_reports
-- The core's health as each replica heard from within `fresh_seconds` reads it (the Overview's
-- CoreHealth), and when they were read (one row with a NULL report when none is fresh).
SELECT r.core_health, c.read_time
  FROM (SELECT clock_timestamp() AS read_time) c
  LEFT JOIN queue_replicas r
         ON r.heartbeat_time >= c.read_time - make_interval(secs => %(fresh_seconds)s) AND r.core_health IS NOT NULL;

-- name: admits_per_minute
-- Admits per minute over the window, oldest minute first, empty minutes included.
SELECT count(j.job_id) AS admits
  FROM generate_series(date_trunc('minute', clock_timestamp()) - make_interval(mins => %(window_minutes)s - 1),
                       date_trunc('minute', clock_timestamp()),
                       interval '1 minute') AS minute
  LEFT JOIN analysis_jobs j
         ON j.create_time >= minute AND j.create_time < minute + interval '1 minute'
 GROUP BY minute
 ORDER BY minute;

-- name: search_job_views_of_user
-- One page of the operator's job search within one user, newest admitted first. The upper
-- bound is the page token's keyset position or `created_before`, whichever is lower, so the
-- walk over the user index (`analysis_jobs_user_newest_admitted`) starts right there; one query shape per index keeps
-- the plan index-driven when the statement is prepared.
SELECT * FROM analysis_job_views
 WHERE user_id = %(user_id)s
   AND (cardinality(%(statuses)s::text[]) = 0 OR status = ANY(%(statuses)s::text[]))
   AND (create_time, job_id) < (COALESCE(%(upper_time)s::timestamptz, 'infinity'),
                                COALESCE(%(upper_job_id)s::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
   AND create_time >= COALESCE(%(created_after)s::timestamptz, '-infinity')
   AND (NOT %(has_error)s OR last_error <> '')
 ORDER BY create_time DESC, job_id DESC
 LIMIT %(limit)s;

-- name: search_job_views_in_status
-- One page of the job search within one status across users (an ended status:
-- `analysis_jobs_ended_status_newest_admitted`; an active one: that status's partial index).
SELECT * FROM analysis_job_views
 WHERE status = %(status)s
   AND (create_time, job_id) < (COALESCE(%(upper_time)s::timestamptz, 'infinity'),
                                COALESCE(%(upper_job_id)s::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
   AND create_time >= COALESCE(%(created_after)s::timestamptz, '-infinity')
   AND (NOT %(has_error)s OR last_error <> '')
 ORDER BY create_time DESC, job_id DESC
 LIMIT %(limit)s;

-- name: search_job_views
-- One page of the job search across users and statuses (the admit-time index, `analysis_jobs_newest_admitted`).
SELECT * FROM analysis_job_views
 WHERE (cardinality(%(statuses)s::text[]) = 0 OR status = ANY(%(statuses)s::text[]))
   AND (create_time, job_id) < (COALESCE(%(upper_time)s::timestamptz, 'infinity'),
                                COALESCE(%(upper_job_id)s::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
   AND create_time >= COALESCE(%(created_after)s::timestamptz, '-infinity')
   AND (NOT %(has_error)s OR last_error <> '')
 ORDER BY create_time DESC, job_id DESC
 LIMIT %(limit)s;

-- name: job_search_narrowing
-- The filters of the searches in what jobs judge (below), after the condition whose index each
-- walks: a fragment they include, never run alone. The user, the statuses, the keyset position,
-- the admit time, errors, and the other search fields (`also_*`; empty: every job, and the store
-- empties the one the shape walks, so a custom plan counts its selectivity once); newest admitted
-- first, one page. The uri is matched exactly by `starts_with` (the shapes' range is its bound).
   AND (%(user_id)s::text = '' OR j.user_id = %(user_id)s::text)
   AND (cardinality(%(statuses)s::text[]) = 0 OR j.status = ANY(%(statuses)s::text[]))
   AND (j.create_time, j.job_id) < (COALESCE(%(upper_time)s::timestamptz, 'infinity'),
                                    COALESCE(%(upper_job_id)s::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
   AND j.create_time >= COALESCE(%(created_after)s::timestamptz, '-infinity')
   AND (NOT %(has_error)s OR j.last_error <> '')
   AND (%(also_document_uri_prefix)s::text = '' OR starts_with(k.document_uri, %(also_document_uri_prefix)s::text))
   AND (%(also_title_words)s::text = '' OR k.title_words @@ plainto_tsquery('simple', %(also_title_words)s::text))
   AND (%(also_source_doi)s::text = '' OR k.source_dois @> ARRAY[%(also_source_doi)s::text])
 ORDER BY j.create_time DESC, j.job_id DESC
 LIMIT %(limit)s

-- name: search_job_views_by_source_doi
-- One page of the job search among the jobs citing a DOI (`analysis_job_search_keys_by_source_doi`,
-- migration 0029: few jobs cite one DOI, so all are read, narrowed and sorted), then the page's views.
SELECT v.* FROM analysis_job_views v
 WHERE v.job_id IN (SELECT j.job_id FROM analysis_job_search_keys k JOIN analysis_jobs j ON j.job_id = k.job_id
                     WHERE k.source_dois @> ARRAY[%(source_doi)s::text]
-- include: job_search_narrowing
                   )
 ORDER BY v.create_time DESC, v.job_id DESC;

-- name: search_job_views_by_document_uri
-- One page of the job search among the jobs whose document uri starts with a prefix: the range of
-- `analysis_job_search_keys_by_document_uri` (migration 0029; "C" collation, so a prefix is a range)
-- from the prefix to the prefix followed by the highest code point (`starts_with` decides), then the
-- page's views.
SELECT v.* FROM analysis_job_views v
 WHERE v.job_id IN (SELECT j.job_id FROM analysis_job_search_keys k JOIN analysis_jobs j ON j.job_id = k.job_id
                     WHERE k.document_uri COLLATE "C" >= %(document_uri_prefix)s::text
                       AND k.document_uri COLLATE "C" < %(document_uri_prefix)s::text || chr(1114111)
                       AND starts_with(k.document_uri, %(document_uri_prefix)s::text)
-- include: job_search_narrowing
                   )
 ORDER BY v.create_time DESC, v.job_id DESC;

-- name: search_job_views_by_title_words
-- One page of the job search among the jobs whose title holds every word (`title_words` and its
-- index `analysis_job_search_keys_by_title_words`, migration 0029, 'simple' configuration), then the
-- page's views. For words in many titles the planner walks the newest jobs instead, testing the stored words.
SELECT v.* FROM analysis_job_views v
 WHERE v.job_id IN (SELECT j.job_id FROM analysis_job_search_keys k JOIN analysis_jobs j ON j.job_id = k.job_id
                     WHERE k.title_words @@ plainto_tsquery('simple', %(title_words)s::text)
-- include: job_search_narrowing
                   )
 ORDER BY v.create_time DESC, v.job_id DESC;

-- name: active_jobs_matching
-- The QUEUED, PENDING and RUNNING jobs a bulk cancel would touch, oldest admitted first (the
-- partial indexes over the rows in flight: only those are read).
SELECT job_id, user_id
  FROM analysis_jobs
 WHERE status IN ('queued', 'pending', 'running')  -- lets a prepared (generic) plan see how few rows that is
   AND status = ANY(%(statuses)s::text[])
   AND (%(user_id)s::text = '' OR user_id = %(user_id)s::text)
   AND create_time >= COALESCE(%(created_after)s::timestamptz, '-infinity')
   AND create_time < COALESCE(%(created_before)s::timestamptz, 'infinity')
   AND (NOT %(has_error)s OR last_error <> '')
   AND (%(document_uri_prefix)s::text = '' OR starts_with(document_uri, %(document_uri_prefix)s::text))
   AND (%(title_words)s::text = '' AND %(source_doi)s::text = ''
        OR EXISTS (SELECT 1 FROM analysis_job_search_keys k
                    WHERE k.job_id = analysis_jobs.job_id
                      AND (%(title_words)s::text = '' OR k.title_words @@ plainto_tsquery('simple', %(title_words)s::text))
                      AND (%(source_doi)s::text = '' OR k.source_dois @> ARRAY[%(source_doi)s::text])))
 ORDER BY create_time, job_id
 LIMIT %(limit)s;

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

-- name: grant_capacity
-- A section under the fleet-wide capacity lock (`locks.capacity_section`): hands the free
-- capacity to waiting jobs in fair order, each one's release claimed for this replica
-- (functions/queue_grant_capacity.sql). 'granted' rows, then a 'state' row.
SELECT s.row_kind, s.job_id, s.user_id, s.run_id, s.release_attempts, s.waited_seconds AS capacity_waited_seconds, s.probe, s.limited,
       s.in_use, s.capacity_limit, s.cancel_requested, (SELECT queue_history_reconciled()) AS history_reconciled,
       (SELECT g.delta_of_job_id IS NOT NULL FROM analysis_jobs g WHERE g.job_id = s.job_id) AS delta
  FROM queue_grant_capacity(%(lease_seconds)s, %(release_window_seconds)s, %(probe_interval_seconds)s,
                            %(max_grants)s) AS s

-- name: capacity_refused
-- The core answered a release RESOURCE_EXHAUSTED: the job waits again with its place, and the
-- fleet learns the core's limit (functions/queue_capacity_refused.sql). One row with the limit
-- learned; none when the attempt was fenced.
SELECT s.row_kind, s.core_limit FROM queue_capacity_refused(%(job_id)s, %(attempt)s, %(probe_interval_seconds)s) AS s;

-- name: capacity_probe_taken
-- The core took a release above the limit it had taught us: the limit grows by one.
SELECT queue_capacity_probe_taken();

-- name: seed_capacity
-- A fresh database takes its capacity from QUEUE_CORE_CAPACITY; afterwards only the operator call
-- changes it. Returns the capacity in force. Replicas starting together race for the seed: the
-- loser's insert waits for the winner's and then conflicts with a row its own snapshot cannot see,
-- so the row is returned through ON CONFLICT DO UPDATE (which reads the committed row), changing
-- nothing, rather than read again. Also who set the capacity in force (`system:seed`, or the
-- operator who set it at run time).
INSERT INTO queue_capacity AS c (capacity, updated_by) VALUES (%(capacity)s, 'system:seed')
ON CONFLICT (singleton) DO UPDATE SET capacity = c.capacity
RETURNING c.capacity, c.updated_by;

-- name: set_core_capacity
-- The operator's change of the capacity, with its actor in the row and in the change log; what
-- the core taught us is forgotten (a new setting starts afresh). The previous value and the change.
WITH previous AS (
    SELECT capacity FROM queue_capacity FOR UPDATE
),
changed AS (
    INSERT INTO queue_capacity AS c (capacity, updated_by) VALUES (%(capacity)s, %(actor)s)
    ON CONFLICT (singleton) DO UPDATE
       SET capacity = EXCLUDED.capacity, core_limit = NULL, next_probe_at = NULL,
           updated_by = EXCLUDED.updated_by, updated_at = clock_timestamp()
    RETURNING c.capacity
)
INSERT INTO queue_setting_changes (setting, old_value, new_value, actor)
SELECT 'core_capacity', (SELECT capacity FROM previous), (SELECT capacity FROM changed), %(actor)s
RETURNING change_id, setting, user_id, old_value, new_value, actor, create_time, note;

-- name: set_user_queue_limit
-- The operator's change of a user's slots (`user_queue_limits`; 0: back to the default), with its
-- actor in the change log. A raised limit fills the new slots at the user's next promotion.
WITH previous AS (
    SELECT max_active FROM user_queue_limits WHERE user_id = %(user_id)s FOR UPDATE
),
removed AS (
    DELETE FROM user_queue_limits WHERE user_id = %(user_id)s AND %(max_active)s = 0
),
upserted AS (
    INSERT INTO user_queue_limits AS l (user_id, max_active)
    SELECT %(user_id)s, %(max_active)s WHERE %(max_active)s > 0
    ON CONFLICT (user_id) DO UPDATE SET max_active = EXCLUDED.max_active, updated_at = clock_timestamp()
)
INSERT INTO queue_setting_changes (setting, user_id, old_value, new_value, actor)
SELECT 'user_max_active', %(user_id)s, (SELECT max_active FROM previous), NULLIF(%(max_active)s, 0), %(actor)s
RETURNING change_id, setting, user_id, old_value, new_value, actor, create_time, note;

-- name: set_releases_paused
-- A section under the fleet-wide capacity lock (`locks.capacity_section`): pauses or resumes the
-- releases of the fleet ('') or of one user, recorded with its actor and note
-- (functions/queue_set_releases_paused.sql). A resume makes the retries the pause held due at
-- once, each with a release window from now. One 'changed' row; none when nothing changed.
SELECT s.row_kind, s.change_id, s.setting, s.user_id, s.old_value, s.new_value, s.actor, s.create_time, s.note
  FROM queue_set_releases_paused(%(user_id)s, %(paused)s, %(actor)s, %(note)s, %(release_window_seconds)s::float8) AS s

-- name: user_settings
-- One user's settings in force: her first-pass limit (her own or the default), and the pauses
-- that hold her runs back (her own, the fleet's); primary-key reads.
SELECT COALESCE(l.max_active, %(default_max_active)s) AS max_active,
       l.max_active IS NULL AS max_active_is_default,
       own.paused_at AS paused_at, own.paused_by AS paused_by, own.note AS pause_note,
       fleet.paused_at AS fleet_paused_at
  FROM (SELECT 1) AS one
  LEFT JOIN user_queue_limits l ON l.user_id = %(user_id)s
  LEFT JOIN queue_release_pauses own ON own.user_id = %(user_id)s AND %(user_id)s <> ''
  LEFT JOIN queue_release_pauses fleet ON fleet.user_id = '';

-- name: setting_changes
-- One page of the fleet settings' change log, newest first (keyset on change_id).
SELECT change_id, setting, user_id, old_value, new_value, actor, create_time, note
  FROM queue_setting_changes
 WHERE change_id < COALESCE(%(before_change_id)s::bigint, 9223372036854775807)
 ORDER BY change_id DESC
 LIMIT %(limit)s;

-- name: capacity_state
-- The core's capacity now: the setting, what the core taught us, what is in use and who waits
-- (the partial index of jobs waiting for capacity; the slot index for what is in use), and the
-- pauses of releases in force (the fleet's, how many users are paused, and who, up to a bound).
SELECT COALESCE(c.capacity, 0) AS capacity,
       c.core_limit,
       c.next_probe_at,
       COALESCE(c.core_refusals, 0) AS core_refusals,
       c.updated_by,
       c.updated_at,
       queue_capacity_in_use() AS in_use,
       (SELECT count(*) FROM analysis_jobs w
         WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL) AS waiting_jobs,
       (SELECT count(DISTINCT w.user_id) FROM analysis_jobs w
         WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL) AS waiting_users,
       (SELECT min(w.capacity_wait_since) FROM analysis_jobs w
         WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL) AS oldest_wait_since,
       fleet.paused_at AS fleet_paused_at,
       fleet.paused_by AS fleet_paused_by,
       fleet.note AS fleet_pause_note,
       (SELECT count(*) FROM queue_release_pauses p WHERE p.user_id <> '') AS paused_users,
       ARRAY(SELECT p.user_id FROM queue_release_pauses p WHERE p.user_id <> ''
              ORDER BY p.user_id LIMIT %(paused_users_named)s) AS paused_user_ids
  FROM (SELECT 1) AS one
  LEFT JOIN queue_capacity c ON true
  LEFT JOIN queue_release_pauses fleet ON fleet.user_id = '';

-- name: capacity_positions
-- The 1-based places of the given jobs in the fleet-wide order for the core (only jobs waiting
-- for capacity have one).
SELECT job_id, capacity_position FROM analysis_jobs_capacity_order
 WHERE job_id = ANY(%(job_ids)s::uuid[]);

-- name: commit_probe
-- Health's durable write, with no table to bloat: a transactional WAL message (logical decoding
-- consumers see it under the prefix `acurio.queue.health`). Its commit is flushed and waits for
-- the synchronous standbys like any commit of the service; a read-only standby refuses it.
SELECT pg_logical_emit_message(true, 'acurio.queue.health', '') IS NOT NULL AS written

-- name: commit_probe_reading_identity
-- Health's durable write (`commit_probe`), reading on the way which database history this is, as
-- `database_identity` does: the identity watch takes a reading this fresh instead of a look of
-- its own (engine/core_reconciliation.py), one wake-up and round trip fewer every two seconds.
SELECT pg_logical_emit_message(true, 'acurio.queue.health', '') IS NOT NULL AS written,
       (SELECT system_identifier FROM pg_control_system())::text AS system_identifier,
       queue_current_timeline() AS timeline_id,
       queue_history_reconciled() AS reconciled

-- name: replication_stance
-- What a commit of this session waits for: its synchronous_commit, the synchronous standbys the
-- primary names, the standbys streaming from it (sync_state is NULL where the role may not read
-- replication details), and whether this node is a standby itself.
SELECT current_setting('synchronous_commit') AS synchronous_commit,
       current_setting('synchronous_standby_names') AS synchronous_standby_names,
       pg_is_in_recovery() AS in_recovery,
       (SELECT count(*) FROM pg_stat_replication) AS standbys,
       (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')) AS synchronous_standbys,
       (SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL) AS standbys_hidden;

-- name: job_feed_start
-- Where a reader of the job-change feed starts: the present snapshot (store/feed.py).
SELECT pg_current_snapshot()::text AS snapshot;

-- name: job_feed_since
-- The feed's rows that the previous read's snapshot (`after`) could not see, written by a
-- transaction in flight then (its xip list) or not yet begun (an xid at or past its xmax), and
-- this statement's snapshot, the next read's `after`. `pg_current_snapshot()` is the statement's
-- own snapshot, the one the rows are read with, so a row of a transaction still in flight is not
-- passed over: it is not visible, and its xid stays in the next `after`. Only rows of the
-- watched users and of PENDING jobs nobody claimed, unless `all_users`. The first row carries the
-- snapshot even when no change came, and, when `watch_line`, whether any of the new rows, of any
-- user, may have moved the fleet's line for capacity (`line_moved`: a job that is or was PENDING
-- or RUNNING changed; the first such row answers it).
SELECT now_snapshot.snapshot::text AS snapshot, now_snapshot.line_moved,
       f.change_id, f.job_id, f.user_id, f.status, f.old_status,
       f.release_claimed, extract(epoch FROM clock_timestamp() - f.change_time)::float8 AS lag_seconds
  FROM (SELECT pg_current_snapshot() AS snapshot,
               %(watch_line)s AND EXISTS (
                   SELECT 1 FROM analysis_job_feed m
                    WHERE (m.xid >= pg_snapshot_xmax(%(after)s::pg_snapshot)
                           OR m.xid = ANY(ARRAY(SELECT pg_snapshot_xip(%(after)s::pg_snapshot))))
                      AND (m.status IN ('pending', 'running') OR m.old_status IN ('pending', 'running'))) AS line_moved
       ) AS now_snapshot
  LEFT JOIN LATERAL (
      SELECT c.change_id, c.job_id, c.user_id, c.status, c.old_status, c.release_claimed, c.change_time
        FROM analysis_job_feed c
       WHERE (c.xid >= pg_snapshot_xmax(%(after)s::pg_snapshot)
              OR c.xid = ANY(ARRAY(SELECT pg_snapshot_xip(%(after)s::pg_snapshot))))
         AND (%(all_users)s OR c.user_id = ANY(%(user_ids)s::text[]) OR (c.status = 'pending' AND NOT c.release_claimed))
       ORDER BY c.change_id
       LIMIT %(limit)s
  ) AS f ON true
 ORDER BY f.change_id;

-- name: job_feed_horizon
-- The oldest transaction still in flight: every transaction with a smaller id has ended.
SELECT pg_snapshot_xmin(pg_current_snapshot())::text AS xmin;

-- name: trim_job_feed
-- Deletes up to `batch_size` feed rows of transactions older than `before_xid` (the sweeper's
-- mark of a horizon at least the feed's retention old: every reader has read them).
DELETE FROM analysis_job_feed f
 WHERE f.ctid = ANY(ARRAY(SELECT c.ctid FROM analysis_job_feed c
                           WHERE c.xid < %(before_xid)s::xid8
                           ORDER BY c.xid
                           LIMIT %(batch_size)s));

-- name: job_feed_hint
-- A wake-up hint for the other replicas' feed readers, in a transaction of its own (no WAL, so the
-- notify lock is held only for its queueing), after a change of this replica committed.
SELECT pg_notify('analysis_job_feed', %(sender)s);

-- name: adopt_run
-- A locked section: adopts a run the core holds or judges into a job its database lost, with
-- its charge (functions/queue_adopt_run.sql). First row: 'adopted', 'known' or
-- 'key_taken' with a job's view, or 'reserved', 'delta_base_lost', 'balance_short' without one;
-- after an adopted judging run, a 'taken_back' row for each of the user's PENDING jobs it sent
-- back to her queue (the database then keeps them from the core until the run settles).
SELECT s.row_kind, s.refunded_amount, s.run_unsettled, (s.job_view).*
  FROM queue_adopt_run(%(job_id)s, %(user_id)s, %(run_id)s, %(idempotency_key)s, %(request_digest)s,
                       %(delta_of_run_id)s::uuid, %(price)s, %(judging)s, %(actor)s, %(reason)s,
                       %(default_max_active)s, %(release_window_seconds)s, %(release_lease_seconds)s,
                       %(reconcile_after_seconds)s) AS s

-- name: runs_unknown_to_queue
-- Of the given runs (the core's live ones), those no job owns and no admit has reserved: the
-- candidates for adoption (the unique index on run_id and the reservations' primary key). A
-- first-pass run the core judges (`judging_first_pass`) counts even with a reservation: it
-- judges only once its job committed, so its admit is not in flight, its job was lost.
SELECT r.run_id
  FROM unnest(%(run_ids)s::uuid[]) AS r(run_id)
 WHERE NOT EXISTS (SELECT 1 FROM analysis_jobs j WHERE j.run_id = r.run_id)
   AND (r.run_id = ANY(%(judging_first_pass)s::uuid[])
        OR NOT EXISTS (SELECT 1 FROM run_reservations v WHERE v.run_id = r.run_id));

-- name: database_clock
-- The database's clock now: taken before a listing of the core's live runs, it bounds which
-- jobs the listing must show (`jobs_with_runs_not_listed`).
SELECT clock_timestamp() AS now;

-- name: jobs_with_runs_not_listed
-- Active jobs (QUEUED, PENDING, RUNNING) whose run the core's listing of its live runs did not
-- show, admitted before the listing began (`listed_after`, the database's clock then): a job is
-- inserted only after the core answered its CreateRun, so such a run was live at the core when
-- the listing began, unless it ended meanwhile (its completion on the way) or the core lost it.
-- The caller asks the core about each (`GetRun`). A job whose user's cancel is recorded is left
-- to the cancel's own retry. Each status is read through its partial index, as the overview's
-- counts are; the listed runs are an anti-join, not a linear `<> ALL`.
SELECT j.job_id, j.user_id, j.run_id, j.status, j.release_attempts
  FROM (SELECT job_id, user_id, run_id, status, release_attempts, create_time, cancel_requested_at
          FROM analysis_jobs WHERE status = 'running'
        UNION ALL
        SELECT job_id, user_id, run_id, status, release_attempts, create_time, cancel_requested_at
          FROM analysis_jobs WHERE status = 'pending'
        UNION ALL
        SELECT job_id, user_id, run_id, status, release_attempts, create_time, cancel_requested_at
          FROM analysis_jobs WHERE status = 'queued') AS j
 WHERE j.create_time < %(listed_after)s
   AND j.cancel_requested_at IS NULL
   AND NOT EXISTS (SELECT 1 FROM unnest(%(run_ids)s::uuid[]) AS r(run_id) WHERE r.run_id = j.run_id)
 ORDER BY j.create_time
 LIMIT %(batch_size)s;

-- name: run_to_probe_at_the_core
-- One run the core must know, asked about every few seconds (`GetRun`) so a core that came back
-- without its runs is noticed before the next listing: the longest-running job's run, else a
-- PENDING one's, else a QUEUED one's (each read off its partial index). A job whose user's cancel
-- is recorded is skipped, as `jobs_with_runs_not_listed` skips it. None without active jobs.
SELECT run_id
  FROM ((SELECT run_id, 1 AS rank FROM analysis_jobs WHERE status = 'running' AND cancel_requested_at IS NULL
          ORDER BY next_reconcile_at LIMIT 1)
        UNION ALL
        (SELECT run_id, 2 AS rank FROM analysis_jobs WHERE status = 'pending' AND cancel_requested_at IS NULL
          ORDER BY next_release_at LIMIT 1)
        UNION ALL
        (SELECT run_id, 3 AS rank FROM analysis_jobs WHERE status = 'queued' AND cancel_requested_at IS NULL
          ORDER BY user_id, queue_seq LIMIT 1)) AS c
 ORDER BY rank
 LIMIT 1;

-- name: runs_taking_a_slot
-- Of the given runs (first-pass runs the core reports judging), those that take their user's
-- slot as far as the queue can tell: owned by a job holding it (PENDING or RUNNING, or ended with
-- its run not yet confirmed settled), or owned by no job (its job lost in a failover; a
-- reservation does not make it an admit in flight: a first-pass run judges only once its job
-- committed, and the standby may have had the reservation but not that commit). A run
-- whose job ended with its run confirmed settled is not counted: only the core's own answer
-- settles a run, and a failover loses commits, it does not invent them.
SELECT r.run_id
  FROM unnest(%(run_ids)s::uuid[]) AS r(run_id)
  LEFT JOIN analysis_jobs j ON j.run_id = r.run_id
 WHERE j.job_id IS NULL OR j.status IN ('pending', 'running') OR j.run_settle_due_at IS NOT NULL;

-- name: user_slot_limit
-- The user's first-pass limit: her own (`user_queue_limits`) or the default.
SELECT COALESCE((SELECT max_active FROM user_queue_limits WHERE user_id = %(user_id)s), %(default_max_active)s) AS max_active;

-- name: record_lost_run
-- Reconciliation could not adopt a run whose job was lost: the loss, for the operator (once per run).
INSERT INTO core_runs_lost (run_id, user_id, job_id, idempotency_key, price, core_state, reason)
VALUES (%(run_id)s, %(user_id)s, %(job_id)s, %(idempotency_key)s, %(price)s, %(core_state)s, %(reason)s)
ON CONFLICT (run_id) DO NOTHING
RETURNING run_id;

-- name: database_identity
-- Which database history this is: the cluster's system identifier and its current timeline
-- (functions/queue_current_timeline.sql: the WAL segment being written names it, which a
-- promoted standby changes at once; the last checkpoint's only on a standby). A change means a
-- failover may have lost commits.
-- `reconciled`: the queue has reconciled this history with the core's runs
-- (functions/queue_history_reconciled.sql).
SELECT (SELECT system_identifier FROM pg_control_system())::text AS system_identifier,
       queue_current_timeline() AS timeline_id,
       queue_history_reconciled() AS reconciled;

-- name: history_reconciled
-- Whether the queue has reconciled the history this primary writes now with the core's runs: if
-- so, it has forgotten no run the core judges, and a release need not ask the core (I9).
SELECT queue_history_reconciled() AS reconciled;

-- name: record_reconciled_history
-- A reconciliation that went through whole on this history: recorded, but only while the
-- database still writes the history the reconciliation began on. Whether it is recorded now.
WITH current_history AS (
    SELECT (SELECT system_identifier FROM pg_control_system())::text AS system_identifier,
           queue_current_timeline() AS timeline_id
     WHERE NOT pg_is_in_recovery()  -- a standby writes no history of its own
), recorded AS (
    INSERT INTO core_reconciled_histories (system_identifier, timeline_id)
    SELECT system_identifier, timeline_id FROM current_history
     WHERE system_identifier = %(system_identifier)s AND timeline_id = %(timeline_id)s
    ON CONFLICT DO NOTHING
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM current_history
                WHERE system_identifier = %(system_identifier)s AND timeline_id = %(timeline_id)s) AS recorded;

-- name: reconcile_running_jobs_now
-- After a failover: every RUNNING job is due for the sweeper's reconciliation with the core
-- (`GetRun`) now, not QUEUE_RECONCILE_AFTER_SECONDS after its start: its completion may have been
-- acknowledged by the old primary and lost. The number of jobs made due.
WITH due AS (
    UPDATE analysis_jobs SET next_reconcile_at = clock_timestamp()
     WHERE status = 'running' AND next_reconcile_at > clock_timestamp()
    RETURNING 1
)
SELECT count(*) AS jobs FROM due;

-- name: record_operator_action
-- An operator's Promote, Release or CheckJobWithCore, for the audit timeline (migration 0035).
INSERT INTO queue_operator_actions (action, actor, user_id, job_id, outcome)
VALUES (%(action)s, %(actor)s, %(user_id)s, %(job_id)s, left(%(outcome)s, 512));

-- name: release_pauses
-- The pauses of releases in force: the fleet's first, then users', the longest paused first
-- (one row per pause in force), and how many users are paused.
SELECT p.user_id, p.paused_at, p.paused_by, p.note,
       (SELECT count(*) FROM queue_release_pauses u WHERE u.user_id <> '') AS paused_users
  FROM queue_release_pauses p
 ORDER BY p.user_id <> '', p.paused_at, p.user_id
 LIMIT %(limit)s;

-- name: audit_events
-- One page of the audit timeline, newest first (keyset on the event's time and key, below
-- `before_time`/`before_key` when set): each source read newest first off its own index (migration
-- 0035) and cut to a page, then merged. Filtered by actor and by user ('' for either: all).
WITH settings AS (
    SELECT s.create_time AS occurred_at, 'setting:' || lpad(s.change_id::text, 19, '0') AS event_key,
           CASE s.setting WHEN 'core_capacity' THEN 'capacity' WHEN 'user_max_active' THEN 'user_limit'
                ELSE CASE WHEN s.new_value = 1 THEN 'pause' ELSE 'resume' END END AS kind,
           s.actor, COALESCE(s.user_id, '') AS user_id, NULL::uuid AS job_id, NULL::uuid AS retry_of_job_id,
           COALESCE(s.old_value, 0)::bigint AS old_value, COALESCE(s.new_value, 0)::bigint AS new_value,
           0::bigint AS amount, s.note, '' AS outcome
      FROM queue_setting_changes s
     WHERE (%(actor)s = '' OR s.actor = %(actor)s)
       AND (%(user_id)s = '' OR s.user_id = %(user_id)s)
       AND (%(before_time)s::timestamptz IS NULL OR s.create_time <= %(before_time)s::timestamptz)
     ORDER BY s.create_time DESC, s.change_id DESC
     LIMIT %(limit)s
),
grants AS (
    SELECT g.create_time, 'grant:' || lpad(g.entry_id::text, 19, '0'), 'grant', g.actor, g.user_id, NULL::uuid, NULL::uuid,
           0::bigint, 0::bigint, g.amount, COALESCE(g.note, ''), ''
      FROM credit_ledger g
     WHERE g.kind = 'grant'
       AND (%(actor)s = '' OR g.actor = %(actor)s)
       AND (%(user_id)s = '' OR g.user_id = %(user_id)s)
       AND (%(before_time)s::timestamptz IS NULL OR g.create_time <= %(before_time)s::timestamptz)
     ORDER BY g.create_time DESC, g.entry_id DESC
     LIMIT %(limit)s
),
cancels AS (
    SELECT COALESCE(c.cancel_requested_at, c.end_time), 'cancel:' || c.job_id::text, 'cancel', c.canceled_by, c.user_id, c.job_id,
           NULL::uuid, 0::bigint, 0::bigint, 0::bigint, '', c.status
      FROM analysis_jobs c
     WHERE c.canceled_by IS NOT NULL
       AND (%(actor)s = '' OR c.canceled_by = %(actor)s)
       AND (%(user_id)s = '' OR c.user_id = %(user_id)s)
       AND (%(before_time)s::timestamptz IS NULL OR COALESCE(c.cancel_requested_at, c.end_time) <= %(before_time)s::timestamptz)
     ORDER BY COALESCE(c.cancel_requested_at, c.end_time) DESC, c.job_id DESC
     LIMIT %(limit)s
),
retries AS (
    SELECT r.create_time, 'retry:' || r.job_id::text, 'retry',
           COALESCE((SELECT l.actor FROM credit_ledger l WHERE l.job_id = r.job_id AND l.kind = 'charge'), 'unknown'),
           r.user_id, r.job_id, r.retry_of_job_id, 0::bigint, 0::bigint, 0::bigint, '', r.status
      FROM analysis_jobs r
     WHERE r.retry_of_job_id IS NOT NULL
       AND (%(actor)s = '' OR EXISTS (SELECT 1 FROM credit_ledger l WHERE l.job_id = r.job_id AND l.kind = 'charge' AND l.actor = %(actor)s))
       AND (%(user_id)s = '' OR r.user_id = %(user_id)s)
       AND (%(before_time)s::timestamptz IS NULL OR r.create_time <= %(before_time)s::timestamptz)
     ORDER BY r.create_time DESC, r.job_id DESC
     LIMIT %(limit)s
),
actions AS (
    SELECT a.create_time, 'action:' || lpad(a.action_id::text, 19, '0'), a.action, a.actor, a.user_id, a.job_id, NULL::uuid,
           0::bigint, 0::bigint, 0::bigint, '', a.outcome
      FROM queue_operator_actions a
     WHERE (%(actor)s = '' OR a.actor = %(actor)s)
       AND (%(user_id)s = '' OR a.user_id = %(user_id)s)
       AND (%(before_time)s::timestamptz IS NULL OR a.create_time <= %(before_time)s::timestamptz)
     ORDER BY a.create_time DESC, a.action_id DESC
     LIMIT %(limit)s
)
SELECT * FROM (
    SELECT * FROM settings UNION ALL SELECT * FROM grants UNION ALL SELECT * FROM cancels
    UNION ALL SELECT * FROM retries UNION ALL SELECT * FROM actions
) AS events
 WHERE %(before_time)s::timestamptz IS NULL OR (occurred_at, event_key) < (%(before_time)s::timestamptz, %(before_key)s::text)
 ORDER BY occurred_at DESC, event_key DESC
 LIMIT %(limit)s;
