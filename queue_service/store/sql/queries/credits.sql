-- Credits: a grant once per key, a balance, and the ledger's pages (one query shape per index).

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

-- name: grant_by_key
-- The earlier grant made with this key.
SELECT amount FROM credit_ledger
 WHERE user_id = %(user_id)s AND idempotency_key = %(idempotency_key)s AND kind = 'grant';

-- name: balance_of_user
-- A user's balance (0 without an account).
SELECT COALESCE((SELECT balance FROM credit_accounts WHERE user_id = %(user_id)s), 0) AS balance;
