-- What keeps the queue whole across a failover or a core restart: the core's runs as the
-- second copy (adoption, the runs the queue does not know or the core did not list), the
-- database's identity and reconciled history, health's durable write and the replication stance.

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

-- name: adopt_run
-- A locked section: adopts a run the core holds or judges into a job its database lost, with
-- its charge and a retry's lineage (`retry_of_job_id`, read from the key the core's record kept;
-- NULL for a run no retry created) (functions/queue_adopt_run_v2.sql). First row: 'adopted',
-- 'known' or 'key_taken' with a job's view, or 'reserved', 'delta_base_lost', 'balance_short' without one;
-- after an adopted judging run, a 'taken_back' row for each of the user's PENDING jobs it sent
-- back to her queue (the database then keeps them from the core until the run settles).
SELECT s.row_kind, s.refunded_amount, s.run_unsettled, (s.job_view).*
  FROM queue_adopt_run_v2(%(job_id)s, %(user_id)s, %(run_id)s, %(idempotency_key)s, %(request_digest)s,
                          %(delta_of_run_id)s::uuid, %(price)s, %(judging)s, %(actor)s, %(reason)s,
                          %(default_max_active)s, %(release_window_seconds)s, %(release_lease_seconds)s,
                          %(reconcile_after_seconds)s, %(retry_of_job_id)s::uuid) AS s

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
