-- The operator's settings and their change log: the capacity, a user's slots, the pauses of
-- releases, and what a user's settings in force read.

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

-- name: release_pauses
-- The pauses of releases in force: the fleet's first, then users', the longest paused first
-- (one row per pause in force), and how many users are paused.
SELECT p.user_id, p.paused_at, p.paused_by, p.note,
       (SELECT count(*) FROM queue_release_pauses u WHERE u.user_id <> '') AS paused_users
  FROM queue_release_pauses p
 ORDER BY p.user_id <> '', p.paused_at, p.user_id
 LIMIT %(limit)s;
