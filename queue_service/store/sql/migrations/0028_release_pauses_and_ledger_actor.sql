-- An explicit, audited pause of releases, fleet-wide or for one user (docs/operations.md,
-- "Pausing releases"), and the ledger read by actor.
--
-- `queue_release_pauses` holds one row per pause in force: `user_id` '' for the fleet-wide pause
-- (the key of OperatorService.SetReleasesPaused, where an empty user id means the fleet), else the
-- paused user. A pause holds runs back on the capacity path (functions/queue_releases_paused.sql):
-- a job entering PENDING while its releases are paused waits for a grant as it does under a
-- capacity, the grant hands nothing to a paused user (nothing at all while the fleet is paused),
-- and a release falling due while paused (a retry, a lease run out) goes back to waiting instead
-- of being claimed. Admits go on (charged, queued or pending as usual). Being in the database,
-- every replica obeys it at its next claim or grant.
--
-- Every pause and resume is a setting change (`releases_paused`, 1 paused, 0 not; `user_id` for a
-- user's, NULL for the fleet's), with its actor and the operator's note.
--
-- Additive for running replicas: their queries read none of this (a replica of the previous
-- version ignores a pause; the deploy moves every replica before a pause is relied upon).

CREATE TABLE queue_release_pauses (
    user_id   text PRIMARY KEY,
    paused_by text NOT NULL,
    note      text NOT NULL DEFAULT '' CHECK (char_length(note) <= 512),
    paused_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

ALTER TABLE queue_setting_changes
    DROP CONSTRAINT queue_setting_changes_setting_check,
    DROP CONSTRAINT queue_setting_changes_check,
    ADD COLUMN note text NOT NULL DEFAULT '' CHECK (char_length(note) <= 512),
    ADD CONSTRAINT queue_setting_changes_setting_check
        CHECK (setting IN ('core_capacity', 'user_max_active', 'releases_paused')),
    ADD CONSTRAINT queue_setting_changes_check
        CHECK (setting = 'releases_paused' OR (setting = 'user_max_active') = (user_id IS NOT NULL));

-- ListLedgerEntries by actor: one actor's entries newest first, a page read off the index.
CREATE INDEX credit_ledger_actor_newest_first ON credit_ledger (actor, entry_id DESC);
