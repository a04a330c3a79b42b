-- queue_refund_job_charge: the function.
--
-- Why, migration by migration (its text below is the last one's):
-- * 0008 (locked sections in one call): Gives a job's charge back, at most once (the ledger's
--   unique (job, kind) makes a second refund a no-op), recording who and why. Returns the refunded
--   amount (0: no charge, or already refunded).

CREATE OR REPLACE FUNCTION public.queue_refund_job_charge(p_job_id uuid, p_actor text, p_reason text)
 RETURNS integer
 LANGUAGE sql
AS $function$
    WITH refund AS (
        INSERT INTO credit_ledger (user_id, kind, amount, job_id, actor, reason)
        SELECT user_id, 'refund', -amount, job_id, p_actor, p_reason
          FROM credit_ledger
         WHERE job_id = p_job_id AND kind = 'charge'
        ON CONFLICT (job_id, kind) DO NOTHING
        RETURNING user_id, amount
    ),
    credited AS (
        UPDATE credit_accounts c
           SET balance = c.balance + refund.amount, updated_at = clock_timestamp()
          FROM refund
         WHERE c.user_id = refund.user_id
        RETURNING refund.amount
    )
    SELECT COALESCE((SELECT amount FROM credited), 0)
$function$;
