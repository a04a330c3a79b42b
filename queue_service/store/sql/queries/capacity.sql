-- The core's capacity, fleet-wide: the grant, a refusal, a probe taken, the seed, a claimed
-- release held for a pause, and what the capacity's state and line read.

-- name: hold_release_if_paused
-- A claimed release that waited in the dispatcher (for a place among the releases in flight) and
-- whose releases were paused meanwhile is not sent. A claim at the attempt that opened the job's
-- turn (its grant's, or the first of all: `release_turn_attempt`) follows no release since the job
-- last waited: the job goes back to waiting for a grant, its capacity given back. A later attempt
-- follows one the core may have applied: the job keeps its capacity and its retry is held, as
-- `claim_due_releases` holds one (functions/queue_seat_hold_for_pause.sql). Fenced by the attempt; the job's id and whether it waits again
-- when held, no row when its releases are not paused (or the attempt was overtaken).
SELECT h.job_id, h.waits_again
  FROM queue_seat_hold_for_pause(
           ARRAY(SELECT job_id FROM analysis_jobs
                  WHERE job_id = %(job_id)s AND status = 'pending' AND release_attempts = %(attempt)s
                    AND cancel_requested_at IS NULL AND queue_releases_paused(user_id)
                  FOR UPDATE),
           true) AS h;

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
