-- The durable retries, one claim each (`model.ClaimKind`): a PENDING job's release, an ended
-- job's run to confirm settled, an orphaned reservation's run to cancel, a RUNNING job to
-- reconcile; each claimed for a lease and scheduled again, fenced by its attempt.

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

-- name: claim_due_releases
-- Claims pending jobs due for release, skipping rows another replica is claiming, and reserves
-- them for this replica for the lease (pushes next_release_at ahead, counts the attempt). A job
-- whose user asked to cancel it (`cancel_requested`) is canceled instead of released. Due jobs a
-- pause holds are taken out first, in the same call (functions/queue_seat_claim_due.sql): a
-- pause holds releases, never the count. Rows of kind 'held' (a job held) and 'claimed'.
SELECT c.row_kind, c.job_id, c.user_id, c.run_id, c.release_attempts, c.cancel_requested,
       (SELECT queue_history_reconciled()) AS history_reconciled, c.delta
  FROM queue_seat_claim_due(%(batch_size)s, %(lease_seconds)s) AS c;

-- name: run_owner
-- The user whose job owns a run (a job's user never changes); no row when no job owns it.
SELECT user_id FROM analysis_jobs WHERE run_id = %(run_id)s;

-- name: first_releases_owed
-- The user's PENDING jobs whose first release a promotion (or admit) claimed and nobody has
-- tried again since: the lease of that claim still runs, it is the first attempt, and the job
-- does not wait for the core's capacity (a grant hands those over). Run after a locked change
-- whose outcome was unknown, holding the user's lock (`Sections.first_releases_owed`), so that a
-- change still committing has ended: the hand-over its answer would have made is made here. A
-- paused user's job (`held`) is not handed over: its release was never sent, so it goes back to
-- waiting for a grant (`send_back_to_wait`, in the same transaction), as `hold_release_if_paused`
-- sends back a claim at the first attempt of its turn. A job with a recorded cancel is handed
-- over (its run is canceled).
SELECT j.job_id, j.user_id, j.run_id, j.release_attempts, j.cancel_requested_at IS NOT NULL AS cancel_requested,
       (SELECT queue_history_reconciled()) AS history_reconciled, j.delta_of_job_id IS NOT NULL AS delta,
       j.cancel_requested_at IS NULL AND queue_releases_paused(j.user_id) AS held
  FROM analysis_jobs j
 WHERE j.user_id = %(user_id)s AND j.status = 'pending' AND j.release_attempts = 1
   AND j.next_release_at > clock_timestamp() AND j.capacity_wait_since IS NULL
   FOR UPDATE;

-- name: send_back_to_wait
-- These PENDING jobs, their first release never sent, go back to waiting for a grant
-- (functions/queue_seat_wait.sql). How many did.
SELECT queue_seat_wait(%(job_ids)s::uuid[]) AS waiting;

-- name: claim_release_of_job
-- Claims one pending job for an immediate release attempt (the Release RPC), unless another
-- replica holds it right now, it waits for the core's capacity (only a grant releases it) or its
-- releases are paused; as `claim_due_releases`, with its `cancel_requested`.
SELECT c.job_id, c.user_id, c.run_id, c.release_attempts, c.cancel_requested,
       (SELECT queue_history_reconciled()) AS history_reconciled, c.delta
  FROM queue_seat_claim(
           ARRAY(SELECT job_id FROM analysis_jobs
                  WHERE job_id = %(job_id)s AND status = 'pending'
                    AND NOT (capacity_wait_since IS NOT NULL AND capacity_token IS NULL)  -- waits for capacity
                    AND (cancel_requested_at IS NOT NULL OR NOT queue_releases_paused(user_id))
                  FOR UPDATE SKIP LOCKED),
           %(lease_seconds)s) AS c;

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
       next_release_at = queue_seat_on_exit(),
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
SELECT r.next_release_at, r.window_over
  FROM queue_seat_release_failed(%(job_id)s, %(attempt)s, %(backoff_seconds)s, %(last_error)s, %(sent)s) AS r;

-- name: next_release_due_in
-- Seconds until the earliest pending release is due (so the dispatcher sleeps exactly that long),
-- measured in the database's clock, the one next_release_at was set in: a replica whose own clock
-- is off still waits the right time; negative when one is overdue. NULL when nothing is pending
-- (not GREATEST(0, ...): GREATEST skips a NULL and said 0, so an idle dispatcher never slept).
SELECT extract(epoch FROM min(next_release_at) - clock_timestamp())::float8 AS seconds
  FROM analysis_jobs WHERE status = 'pending';

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
