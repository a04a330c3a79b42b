-- The capacity seat's release fence and timer: `release_attempts`, `next_release_at` and
-- `release_deadline` join the seat's columns (functions/README.md, "The capacity seat"), written by
-- queue_seat_* functions alone, as its other columns are since 0039. The new functions
-- (queue_seat_claim, queue_seat_on_exit, queue_seat_resume, queue_seat_due_for_cancel,
-- queue_seat_wait_behind_turn, queue_seat_wait_from_latest_turn) and the new texts of their
-- callers apply right after this migration, in the same transaction. queue_seat_turn_keys, whose
-- flag chose between two transitions, goes: only the functions replaced in that transaction
-- called it (no replica's statement names it). No table changes.
DROP FUNCTION IF EXISTS queue_seat_turn_keys(text, timestamp with time zone, boolean);
