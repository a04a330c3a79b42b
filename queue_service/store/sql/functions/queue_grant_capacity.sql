-- queue_grant_capacity: the function.
--
-- Why, migration by migration (its text below is the last one's):
-- * 0014 (fleet capacity): Hands the free capacity to waiting jobs, one at a time in the fair order
--   (each grant changes the order: the user's runs in use grow), numbering each with the lowest
--   free token and claiming its release for the caller (attempt counted, leased; its release window
--   starts now; like every release claim it carries a recorded cancel intent, and then the attempt
--   cancels the run). Only ever called under the fleet-wide capacity lock, so grants of two
--   replicas never see the same free capacity. Rows skipped while another transaction holds them (a
--   cancel) wait for the next grant. While the core refuses, the limit is what it last took plus
--   one probe per probe interval. Returns a 'granted' row per grant, then one 'state' row: whether
--   the capacity is limited (a replica keeps granting while it is), what is in use after the grants
--   and the limit they used.
-- * 0016 (capacity turn order): As in 0014, with the next in line from
--   `queue_capacity_next_in_line` and the user's other waiting jobs moved behind every waiting user
--   with the grant (their keys: the grant's time).
-- * 0023 (deltas take turns under the capacity): As in 0014/0016; a grant moves all of the user's
--   other waiting jobs, deltas included, behind every user waiting now.
-- * 0028 (release pauses and ledger actor): Nothing is granted while the fleet's releases are
--   paused (taken under the same lock as the pause, so a grant either ran before the pause
--   committed or sees it), and a paused user's jobs are passed over (queue_capacity_first_waiting).
--   The state row says limited while any pause is in force, so replicas keep asking and a resume
--   is granted at once.
-- * 0034 (release turn attempt): The grant's claim is recorded as the attempt that opens the job's
--   turn (`release_turn_attempt`): a pause may send a claim at that attempt back to waiting, never
--   a later one (it follows a release the core may have applied).
-- * Text only, no migration (after 0036): the user's other waiting jobs are moved behind in two
--   updates, her first-pass jobs through her slots' index and her re-checks through her active
--   re-checks' index; the one update over both was served by the index of every waiting job, so
--   each grant read them all.
-- * 0039 (the capacity seat's one owner): The seat's hand-over is queue_seat_grant's, the user's
--   other waiting jobs moved behind by queue_seat_turn_keys; the loop and the fair order stay here.
-- * 0040 (the seat's release fence and timer): that move is queue_seat_wait_behind_turn.

CREATE OR REPLACE FUNCTION public.queue_grant_capacity(p_lease_seconds double precision, p_release_window_seconds double precision, p_probe_interval_seconds double precision, p_max_grants integer)
 RETURNS TABLE(row_kind text, job_id uuid, user_id text, run_id uuid, release_attempts integer, waited_seconds double precision, probe boolean, limited boolean, in_use integer, capacity_limit integer, cancel_requested boolean)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_settings queue_capacity%ROWTYPE;
    v_now constant timestamptz := clock_timestamp();
    v_limit integer;
    v_in_use integer;
    v_granted integer := 0;
    v_probe boolean;
    v_job_id uuid;
    v_job record;
    v_token integer;
BEGIN
    SELECT * INTO v_settings FROM queue_capacity;
    IF v_settings.capacity > 0 THEN
        v_limit := v_settings.capacity;
    END IF;
    IF v_settings.core_limit IS NOT NULL THEN
        v_limit := least(coalesce(v_limit, 2147483647),
                         v_settings.core_limit
                         + CASE WHEN v_settings.next_probe_at IS NULL OR v_settings.next_probe_at <= v_now THEN 1 ELSE 0 END);
    END IF;
    v_in_use := queue_capacity_in_use();
    WHILE NOT EXISTS (SELECT 1 FROM queue_release_pauses p WHERE p.user_id = '')
          AND v_granted < p_max_grants AND (v_limit IS NULL OR v_in_use < v_limit) LOOP
        v_job_id := queue_capacity_next_in_line();
        EXIT WHEN v_job_id IS NULL;
        SELECT min(s) INTO v_token
          FROM generate_series(1, v_in_use + 1) AS s
         WHERE NOT EXISTS (SELECT 1 FROM analysis_jobs h
                            WHERE h.capacity_token = s
                              AND (h.status IN ('pending', 'running') OR h.run_settle_due_at IS NOT NULL));
        v_probe := v_settings.core_limit IS NOT NULL AND v_in_use >= v_settings.core_limit;
        SELECT * INTO v_job FROM queue_seat_grant(v_job_id, v_token, v_now, p_lease_seconds, p_release_window_seconds);
        INSERT INTO user_capacity_turns AS t (user_id, last_turn_at) VALUES (v_job.user_id, v_now)
        ON CONFLICT ON CONSTRAINT user_capacity_turns_pkey DO UPDATE SET last_turn_at = EXCLUDED.last_turn_at;
        -- Her other waiting jobs (several slots, re-checks) wait behind every user waiting now.
        PERFORM queue_seat_wait_behind_turn(v_job.user_id, v_now);
        v_in_use := v_in_use + 1;
        v_granted := v_granted + 1;
        RETURN QUERY SELECT 'granted'::text, v_job.job_id, v_job.user_id, v_job.run_id, v_job.release_attempts,
                            extract(epoch FROM v_now - v_job.capacity_wait_since)::float8, v_probe, true, v_in_use, v_limit,
                            v_job.cancel_requested_at IS NOT NULL;
        IF v_probe THEN
            -- One release above what the core last took, then none until the next probe is due.
            UPDATE queue_capacity SET next_probe_at = v_now + make_interval(secs => p_probe_interval_seconds);
            EXIT;
        END IF;
    END LOOP;
    RETURN QUERY SELECT 'state'::text, NULL::uuid, NULL::text, NULL::uuid, NULL::integer, NULL::float8, NULL::boolean,
                        coalesce(v_settings.capacity > 0 OR v_settings.core_limit IS NOT NULL, false)
                        OR EXISTS (SELECT 1 FROM queue_release_pauses)
                        OR EXISTS (SELECT 1 FROM analysis_jobs w
                                    WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL),
                        v_in_use, v_limit, NULL::boolean;
END
$function$;
