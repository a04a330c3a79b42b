-- The schema that the migrations in migrations/ and the files in functions/ produce, dumped from
-- PostgreSQL's catalog. Read this file to know the schema; change a table or an index through a
-- new migration, a function, trigger or view in its file in functions/ (where its why is), then
-- regenerate this file with `python -m tests.integration.schema_tool` (tests/integration/test_schema.py fails while it is
-- stale). Every object appears once, in its final definition. In the order it applies in:
-- sequences, tables (with their indexes), functions, views, functions over views, triggers; each
-- sorted by name.
-- Dumped on PostgreSQL 18.

CREATE SEQUENCE public.analysis_jobs_queue_seq AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1;

CREATE TABLE public.analysis_job_feed (
    xid             xid8 DEFAULT pg_current_xact_id() NOT NULL,
    change_id       bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    change_time     timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    job_id          uuid NOT NULL,
    user_id         text NOT NULL,
    status          text NOT NULL,
    old_status      text,
    release_claimed boolean NOT NULL
);
CREATE INDEX analysis_job_feed_by_xid ON public.analysis_job_feed USING btree (xid);

CREATE TABLE public.analysis_job_search_keys (
    job_id       uuid NOT NULL,
    document_uri text,
    source_dois  text[] NOT NULL,
    title_words  tsvector NOT NULL,
    CONSTRAINT analysis_job_search_keys_pkey PRIMARY KEY (job_id)
);
CREATE INDEX analysis_job_search_keys_by_document_uri ON public.analysis_job_search_keys USING btree (document_uri COLLATE "C");
CREATE INDEX analysis_job_search_keys_by_source_doi ON public.analysis_job_search_keys USING gin (source_dois);
CREATE INDEX analysis_job_search_keys_by_title_words ON public.analysis_job_search_keys USING gin (title_words);

CREATE TABLE public.analysis_jobs (
    job_id               uuid NOT NULL,
    user_id              text NOT NULL,
    run_id               uuid NOT NULL,
    idempotency_key      text NOT NULL,
    request_digest       bytea NOT NULL,
    status               text NOT NULL,
    queue_seq            bigint NOT NULL,
    slot                 integer,
    delta_of_job_id      uuid,
    price                bigint NOT NULL,
    release_attempts     integer DEFAULT 0 NOT NULL,
    next_release_at      timestamp with time zone,
    release_deadline     timestamp with time zone,
    next_reconcile_at    timestamp with time zone,
    last_error           text DEFAULT ''::text NOT NULL,
    create_time          timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    promote_time         timestamp with time zone,
    start_time           timestamp with time zone,
    end_time             timestamp with time zone,
    run_settle_due_at    timestamp with time zone,
    run_settle_attempts  integer DEFAULT 0 NOT NULL,
    cancel_requested_at  timestamp with time zone,
    capacity_wait_since  timestamp with time zone,
    capacity_token       integer,
    capacity_turn_before timestamp with time zone,
    capacity_turn_key    timestamp with time zone,
    document_uri         text,
    document_title       text,
    sources              jsonb,
    source_count         integer,
    sources_preview      jsonb,
    retry_of_job_id      uuid,
    canceled_by          text,
    release_turn_attempt integer DEFAULT 1 NOT NULL,
    CONSTRAINT analysis_jobs_active_first_pass_has_slot CHECK ((status <> ALL (ARRAY['pending'::text, 'running'::text])) OR delta_of_job_id IS NOT NULL OR slot IS NOT NULL),
    CONSTRAINT analysis_jobs_capacity_token_check CHECK (capacity_token >= 1),
    CONSTRAINT analysis_jobs_delta_of_job_id_fkey FOREIGN KEY (delta_of_job_id) REFERENCES analysis_jobs(job_id),
    CONSTRAINT analysis_jobs_document_bounded CHECK (char_length(document_uri) <= 2048 AND char_length(document_title) <= 512),
    CONSTRAINT analysis_jobs_idempotency UNIQUE (user_id, idempotency_key),
    CONSTRAINT analysis_jobs_only_ended_jobs_settle CHECK (run_settle_due_at IS NULL OR (status = ANY (ARRAY['succeeded'::text, 'failed'::text, 'canceled'::text]))),
    CONSTRAINT analysis_jobs_pkey PRIMARY KEY (job_id),
    CONSTRAINT analysis_jobs_price_check CHECK (price >= 0),
    CONSTRAINT analysis_jobs_run_id_key UNIQUE (run_id),
    CONSTRAINT analysis_jobs_slot_check CHECK (slot >= 1),
    CONSTRAINT analysis_jobs_slot_first_pass_only CHECK (slot IS NULL OR delta_of_job_id IS NULL),
    CONSTRAINT analysis_jobs_sources_bounded CHECK (source_count >= 0 AND source_count <= 1000 AND jsonb_array_length(sources_preview) <= 10),
    CONSTRAINT analysis_jobs_status_check CHECK (status = ANY (ARRAY['queued'::text, 'pending'::text, 'running'::text, 'succeeded'::text, 'failed'::text, 'canceled'::text]))
);
CREATE INDEX analysis_jobs_active_deltas ON public.analysis_jobs USING btree (user_id) WHERE ((status = ANY (ARRAY['pending'::text, 'running'::text])) AND (delta_of_job_id IS NOT NULL));
CREATE INDEX analysis_jobs_cancels_newest_first ON public.analysis_jobs USING btree (COALESCE(cancel_requested_at, end_time) DESC, job_id DESC) WHERE (canceled_by IS NOT NULL);
CREATE INDEX analysis_jobs_capacity_turn_order ON public.analysis_jobs USING btree (capacity_turn_key, capacity_wait_since, queue_seq) WHERE ((status = 'pending'::text) AND (capacity_wait_since IS NOT NULL) AND (capacity_token IS NULL));
CREATE INDEX analysis_jobs_delta_base ON public.analysis_jobs USING btree (delta_of_job_id) WHERE (delta_of_job_id IS NOT NULL);
CREATE INDEX analysis_jobs_deltas_taking_capacity ON public.analysis_jobs USING btree (user_id) WHERE (((status = ANY (ARRAY['pending'::text, 'running'::text])) OR (run_settle_due_at IS NOT NULL)) AND (delta_of_job_id IS NOT NULL) AND ((capacity_wait_since IS NULL) OR (capacity_token IS NOT NULL)));
CREATE INDEX analysis_jobs_deltas_waiting_turn_order ON public.analysis_jobs USING btree (capacity_turn_key, capacity_wait_since, queue_seq) WHERE ((status = 'pending'::text) AND (capacity_wait_since IS NOT NULL) AND (capacity_token IS NULL) AND (delta_of_job_id IS NOT NULL));
CREATE INDEX analysis_jobs_ended_holding_sources ON public.analysis_jobs USING btree (end_time) WHERE ((end_time IS NOT NULL) AND (sources IS NOT NULL));
CREATE INDEX analysis_jobs_ended_status_newest_admitted ON public.analysis_jobs USING btree (status, create_time DESC, job_id DESC) WHERE (status = ANY (ARRAY['succeeded'::text, 'failed'::text, 'canceled'::text]));
CREATE INDEX analysis_jobs_first_pass_taking_capacity ON public.analysis_jobs USING btree (user_id) WHERE (((status = ANY (ARRAY['pending'::text, 'running'::text])) OR (run_settle_due_at IS NOT NULL)) AND (delta_of_job_id IS NULL) AND (slot IS NOT NULL) AND ((capacity_wait_since IS NULL) OR (capacity_token IS NOT NULL)));
CREATE INDEX analysis_jobs_newest_admitted ON public.analysis_jobs USING btree (create_time DESC, job_id DESC);
CREATE UNIQUE INDEX analysis_jobs_one_holder_per_capacity_token ON public.analysis_jobs USING btree (capacity_token) WHERE ((capacity_token IS NOT NULL) AND ((status = ANY (ARRAY['pending'::text, 'running'::text])) OR (run_settle_due_at IS NOT NULL)));
CREATE UNIQUE INDEX analysis_jobs_one_holder_per_slot ON public.analysis_jobs USING btree (user_id, slot) WHERE (((status = ANY (ARRAY['pending'::text, 'running'::text])) OR (run_settle_due_at IS NOT NULL)) AND (delta_of_job_id IS NULL));
CREATE INDEX analysis_jobs_queued_in_order ON public.analysis_jobs USING btree (user_id, queue_seq) WHERE (status = 'queued'::text);
CREATE INDEX analysis_jobs_recent_first_pass_durations ON public.analysis_jobs USING btree (end_time DESC) WHERE ((status = 'succeeded'::text) AND (delta_of_job_id IS NULL));
CREATE INDEX analysis_jobs_recently_ended ON public.analysis_jobs USING btree (end_time DESC) WHERE (end_time IS NOT NULL);
CREATE INDEX analysis_jobs_reconcile_due ON public.analysis_jobs USING btree (next_reconcile_at) WHERE (status = 'running'::text);
CREATE INDEX analysis_jobs_release_due ON public.analysis_jobs USING btree (next_release_at) WHERE (status = 'pending'::text);
CREATE INDEX analysis_jobs_retries ON public.analysis_jobs USING btree (retry_of_job_id, create_time) WHERE (retry_of_job_id IS NOT NULL);
CREATE INDEX analysis_jobs_retries_newest_first ON public.analysis_jobs USING btree (create_time DESC, job_id DESC) WHERE (retry_of_job_id IS NOT NULL);
CREATE INDEX analysis_jobs_run_settle_due ON public.analysis_jobs USING btree (run_settle_due_at) WHERE (run_settle_due_at IS NOT NULL);
CREATE INDEX analysis_jobs_running_deltas ON public.analysis_jobs USING btree (user_id) WHERE ((status = 'running'::text) AND (delta_of_job_id IS NOT NULL));
CREATE INDEX analysis_jobs_user_newest_admitted ON public.analysis_jobs USING btree (user_id, create_time DESC, job_id DESC);
CREATE INDEX analysis_jobs_user_newest_first ON public.analysis_jobs USING btree (user_id, queue_seq DESC);
CREATE INDEX analysis_jobs_waiting_for_capacity ON public.analysis_jobs USING btree (capacity_wait_since) WHERE ((status = 'pending'::text) AND (capacity_wait_since IS NOT NULL) AND (capacity_token IS NULL));

CREATE TABLE public.core_reconciled_histories (
    system_identifier text NOT NULL,
    timeline_id       integer NOT NULL,
    reconciled_at     timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT core_reconciled_histories_pkey PRIMARY KEY (system_identifier, timeline_id)
);

CREATE TABLE public.core_runs_lost (
    run_id          uuid NOT NULL,
    user_id         text NOT NULL,
    job_id          uuid,
    idempotency_key text DEFAULT ''::text NOT NULL,
    price           bigint DEFAULT 0 NOT NULL,
    core_state      text NOT NULL,
    reason          text NOT NULL,
    recorded_at     timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT core_runs_lost_pkey PRIMARY KEY (run_id)
);
CREATE INDEX core_runs_lost_newest_first ON public.core_runs_lost USING btree (recorded_at DESC);

CREATE TABLE public.credit_accounts (
    user_id    text NOT NULL,
    balance    bigint NOT NULL,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT credit_accounts_balance_check CHECK (balance >= 0),
    CONSTRAINT credit_accounts_pkey PRIMARY KEY (user_id)
);

CREATE TABLE public.credit_ledger (
    entry_id        bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    user_id         text NOT NULL,
    kind            text NOT NULL,
    amount          bigint NOT NULL,
    job_id          uuid,
    idempotency_key text,
    create_time     timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    actor           text DEFAULT 'unknown'::text NOT NULL,
    reason          text DEFAULT 'unknown'::text NOT NULL,
    note            text,
    CONSTRAINT credit_ledger_grant_key CHECK ((kind = 'grant'::text) = (idempotency_key IS NOT NULL)),
    CONSTRAINT credit_ledger_job_entries CHECK ((kind = 'grant'::text) = (job_id IS NULL)),
    CONSTRAINT credit_ledger_kind_check CHECK (kind = ANY (ARRAY['grant'::text, 'charge'::text, 'refund'::text])),
    CONSTRAINT credit_ledger_note_bounded CHECK (char_length(note) <= 512),
    CONSTRAINT credit_ledger_once_per_job UNIQUE (job_id, kind),
    CONSTRAINT credit_ledger_pkey PRIMARY KEY (entry_id),
    CONSTRAINT credit_ledger_sign CHECK (kind = 'charge'::text AND amount < 0 OR (kind = ANY (ARRAY['grant'::text, 'refund'::text])) AND amount > 0)
);
CREATE INDEX credit_ledger_actor_newest_first ON public.credit_ledger USING btree (actor, entry_id DESC);
CREATE UNIQUE INDEX credit_ledger_grant_idempotency ON public.credit_ledger USING btree (user_id, idempotency_key) WHERE (kind = 'grant'::text);
CREATE INDEX credit_ledger_grants_newest_first ON public.credit_ledger USING btree (create_time DESC, entry_id DESC) WHERE (kind = 'grant'::text);
CREATE INDEX credit_ledger_user_newest_first ON public.credit_ledger USING btree (user_id, entry_id DESC);

CREATE TABLE public.queue_capacity (
    singleton     boolean DEFAULT true NOT NULL,
    capacity      integer NOT NULL,
    core_limit    integer,
    next_probe_at timestamp with time zone,
    core_refusals bigint DEFAULT 0 NOT NULL,
    updated_by    text DEFAULT 'unknown'::text NOT NULL,
    updated_at    timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT queue_capacity_capacity_check CHECK (capacity >= 0 AND capacity <= 1000000),
    CONSTRAINT queue_capacity_core_limit_check CHECK (core_limit >= 0),
    CONSTRAINT queue_capacity_pkey PRIMARY KEY (singleton),
    CONSTRAINT queue_capacity_singleton_check CHECK (singleton)
);

CREATE TABLE public.queue_operator_actions (
    action_id   bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    action      text NOT NULL,
    actor       text NOT NULL,
    user_id     text DEFAULT ''::text NOT NULL,
    job_id      uuid,
    outcome     text DEFAULT ''::text NOT NULL,
    create_time timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT queue_operator_actions_action_check CHECK (action = ANY (ARRAY['promote'::text, 'release'::text, 'check_with_core'::text])),
    CONSTRAINT queue_operator_actions_outcome_check CHECK (char_length(outcome) <= 512),
    CONSTRAINT queue_operator_actions_pkey PRIMARY KEY (action_id)
);
CREATE INDEX queue_operator_actions_actor ON public.queue_operator_actions USING btree (actor, create_time DESC);
CREATE INDEX queue_operator_actions_newest_first ON public.queue_operator_actions USING btree (create_time DESC, action_id DESC);
CREATE INDEX queue_operator_actions_user ON public.queue_operator_actions USING btree (user_id, create_time DESC);

CREATE TABLE public.queue_release_pauses (
    user_id   text NOT NULL,
    paused_by text NOT NULL,
    note      text DEFAULT ''::text NOT NULL,
    paused_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT queue_release_pauses_note_check CHECK (char_length(note) <= 512),
    CONSTRAINT queue_release_pauses_pkey PRIMARY KEY (user_id)
);

CREATE TABLE public.queue_replicas (
    replica_id           text NOT NULL,
    host                 text NOT NULL,
    start_time           timestamp with time zone NOT NULL,
    heartbeat_time       timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    draining             boolean DEFAULT false NOT NULL,
    calls_in_flight      integer DEFAULT 0 NOT NULL,
    watch_streams        integer DEFAULT 0 NOT NULL,
    overview_streams     integer DEFAULT 0 NOT NULL,
    core_answered        bigint DEFAULT 0 NOT NULL,
    core_refused         bigint DEFAULT 0 NOT NULL,
    core_unknown         bigint DEFAULT 0 NOT NULL,
    core_last_unknown_at timestamp with time zone,
    core_health          jsonb,
    CONSTRAINT queue_replicas_pkey PRIMARY KEY (replica_id)
);
CREATE INDEX queue_replicas_by_heartbeat ON public.queue_replicas USING btree (heartbeat_time);

CREATE TABLE public.queue_schema_functions (
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT queue_schema_functions_pkey PRIMARY KEY (name, checksum)
);

CREATE TABLE public.queue_schema_migrations (
    version    integer NOT NULL,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT queue_schema_migrations_pkey PRIMARY KEY (version)
);

CREATE TABLE public.queue_setting_changes (
    change_id   bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    setting     text NOT NULL,
    user_id     text,
    old_value   integer,
    new_value   integer,
    actor       text NOT NULL,
    create_time timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    note        text DEFAULT ''::text NOT NULL,
    CONSTRAINT queue_setting_changes_check CHECK (setting = 'releases_paused'::text OR (setting = 'user_max_active'::text) = (user_id IS NOT NULL)),
    CONSTRAINT queue_setting_changes_note_check CHECK (char_length(note) <= 512),
    CONSTRAINT queue_setting_changes_pkey PRIMARY KEY (change_id),
    CONSTRAINT queue_setting_changes_setting_check CHECK (setting = ANY (ARRAY['core_capacity'::text, 'user_max_active'::text, 'releases_paused'::text]))
);
CREATE INDEX queue_setting_changes_newest_first ON public.queue_setting_changes USING btree (create_time DESC, change_id DESC);

CREATE TABLE public.run_reservations (
    run_id          uuid NOT NULL,
    user_id         text NOT NULL,
    create_time     timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    cancel_after    timestamp with time zone NOT NULL,
    canceling       boolean DEFAULT false NOT NULL,
    cancel_attempts integer DEFAULT 0 NOT NULL,
    timeline_id     integer,
    settled_at      timestamp with time zone,
    idempotency_key text,
    CONSTRAINT run_reservations_pkey PRIMARY KEY (run_id)
);
CREATE INDEX run_reservations_cancel_due ON public.run_reservations USING btree (cancel_after);
CREATE UNIQUE INDEX run_reservations_one_live_per_key ON public.run_reservations USING btree (user_id, idempotency_key) WHERE (NOT canceling);
CREATE INDEX run_reservations_settled ON public.run_reservations USING btree (settled_at) WHERE (settled_at IS NOT NULL);

CREATE TABLE public.user_capacity_turns (
    user_id      text NOT NULL,
    last_turn_at timestamp with time zone NOT NULL,
    CONSTRAINT user_capacity_turns_pkey PRIMARY KEY (user_id)
);

CREATE TABLE public.user_queue_limits (
    user_id    text NOT NULL,
    max_active integer NOT NULL,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT user_queue_limits_max_active_check CHECK (max_active >= 1 AND max_active <= 1000),
    CONSTRAINT user_queue_limits_pkey PRIMARY KEY (user_id)
);

CREATE OR REPLACE FUNCTION public.analysis_jobs_announce(p_job analysis_jobs, p_old_status text)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    INSERT INTO analysis_job_feed (job_id, user_id, status, old_status, release_claimed)
    VALUES (p_job.job_id, p_job.user_id, p_job.status, p_old_status,
            p_job.status = 'pending' AND p_job.release_attempts > 0);
END
$function$;

CREATE OR REPLACE FUNCTION public.analysis_jobs_announce_change()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    retried analysis_jobs%ROWTYPE;
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM analysis_jobs_announce(OLD, OLD.status);
        RETURN NULL;
    END IF;
    PERFORM analysis_jobs_announce(NEW, CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END);
    IF TG_OP = 'INSERT' AND NEW.retry_of_job_id IS NOT NULL THEN
        SELECT * INTO retried FROM analysis_jobs a WHERE a.job_id = NEW.retry_of_job_id FOR NO KEY UPDATE;
        IF FOUND THEN
            PERFORM analysis_jobs_announce(retried, retried.status);
        END IF;
    END IF;
    RETURN NULL;
END
$function$;

CREATE OR REPLACE FUNCTION public.analysis_jobs_free_slot(p_user_id text, p_default_max_active integer)
 RETURNS integer
 LANGUAGE sql
 STABLE
AS $function$
    WITH lim AS (
        SELECT COALESCE((SELECT l.max_active FROM user_queue_limits l WHERE l.user_id = p_user_id),
                        p_default_max_active) AS max_active
    ),
    holders AS (
        SELECT a.slot FROM analysis_jobs a
         WHERE a.user_id = p_user_id AND a.delta_of_job_id IS NULL AND a.slot IS NOT NULL
           AND (a.status IN ('pending', 'running') OR a.run_settle_due_at IS NOT NULL)
    )
    SELECT s
      FROM lim, generate_series(1, lim.max_active) AS s
     WHERE (SELECT count(*) FROM holders) < lim.max_active
       AND s NOT IN (SELECT slot FROM holders)
     ORDER BY s
     LIMIT 1
$function$;

CREATE OR REPLACE FUNCTION public.analysis_jobs_keep_search_keys()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    INSERT INTO analysis_job_search_keys (job_id, document_uri, source_dois, title_words)
    VALUES (NEW.job_id, NEW.document_uri,
            ARRAY(SELECT DISTINCT queue_doi_search_key(s.e->>'doi')
                    FROM jsonb_array_elements(COALESCE(NEW.sources, '[]'::jsonb)) AS s(e)
                   WHERE COALESCE(queue_doi_search_key(s.e->>'doi'), '') <> ''),
            to_tsvector('simple'::regconfig, COALESCE(NEW.document_title, '')));
    RETURN NULL;
END
$function$;

CREATE OR REPLACE FUNCTION public.analysis_jobs_retry_lineage()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF NEW.retry_of_job_id IS NULL AND NEW.idempotency_key ~ '^retry:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}' THEN
        NEW.retry_of_job_id := substring(NEW.idempotency_key FROM 7 FOR 36)::uuid;
    END IF;
    RETURN NEW;
END
$function$;

CREATE OR REPLACE FUNCTION public.analysis_jobs_trim_search_keys()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    kept_dois text[] := ARRAY(SELECT DISTINCT queue_doi_search_key(s.e->>'doi')
                                FROM jsonb_array_elements(COALESCE(NEW.sources_preview, '[]'::jsonb)) AS s(e)
                               WHERE COALESCE(queue_doi_search_key(s.e->>'doi'), '') <> '');
BEGIN
    UPDATE analysis_job_search_keys
       SET source_dois = kept_dois
     WHERE job_id = NEW.job_id AND source_dois IS DISTINCT FROM kept_dois;
    RETURN NULL;
END
$function$;

CREATE OR REPLACE FUNCTION public.analysis_jobs_wait_for_capacity()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_now constant timestamptz := clock_timestamp();
BEGIN
    IF (TG_OP = 'INSERT' OR OLD.status = 'queued')
       AND (EXISTS (SELECT 1 FROM queue_capacity c WHERE c.capacity > 0 OR c.core_limit IS NOT NULL)
            OR queue_releases_paused(NEW.user_id)) THEN
        NEW.capacity_wait_since := v_now;
        NEW.capacity_turn_key := v_now;
        NEW.capacity_token := NULL;
        NEW.next_release_at := NULL;
        NEW.release_attempts := CASE WHEN TG_OP = 'INSERT' THEN 0 ELSE OLD.release_attempts END;
    END IF;
    RETURN NEW;
END
$function$;

CREATE OR REPLACE FUNCTION public.queue_capacity_first_waiting(p_deltas_only boolean, p_skipped uuid[], p_rank_to_beat integer)
 RETURNS TABLE(job_id uuid, runs_in_use integer)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_job_id uuid;
    v_user_id text;
    v_key timestamptz;
    v_wait timestamptz;
    v_seq bigint;
    v_rank integer;
BEGIN
    job_id := NULL;
    runs_in_use := p_rank_to_beat;
    LOOP
        -- The next waiting job after (v_key, v_wait, v_seq) in turn order, each query spelled so
        -- that its partial index serves it.
        IF p_deltas_only AND v_job_id IS NULL THEN
            SELECT w.job_id, w.user_id, w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
              INTO v_job_id, v_user_id, v_key, v_wait, v_seq
              FROM analysis_jobs w
             WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL
               AND w.delta_of_job_id IS NOT NULL AND w.job_id <> ALL (p_skipped)
               AND NOT EXISTS (SELECT 1 FROM queue_release_pauses p WHERE p.user_id = w.user_id)
             ORDER BY w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
             LIMIT 1;
        ELSIF p_deltas_only THEN
            SELECT w.job_id, w.user_id, w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
              INTO v_job_id, v_user_id, v_key, v_wait, v_seq
              FROM analysis_jobs w
             WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL
               AND w.delta_of_job_id IS NOT NULL AND w.job_id <> ALL (p_skipped)
               AND NOT EXISTS (SELECT 1 FROM queue_release_pauses p WHERE p.user_id = w.user_id)
               AND (w.capacity_turn_key, w.capacity_wait_since, w.queue_seq) > (v_key, v_wait, v_seq)
             ORDER BY w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
             LIMIT 1;
        ELSIF v_job_id IS NULL THEN
            SELECT w.job_id, w.user_id, w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
              INTO v_job_id, v_user_id, v_key, v_wait, v_seq
              FROM analysis_jobs w
             WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL
               AND w.job_id <> ALL (p_skipped)
               AND NOT EXISTS (SELECT 1 FROM queue_release_pauses p WHERE p.user_id = w.user_id)
             ORDER BY w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
             LIMIT 1;
        ELSE
            SELECT w.job_id, w.user_id, w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
              INTO v_job_id, v_user_id, v_key, v_wait, v_seq
              FROM analysis_jobs w
             WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL
               AND w.job_id <> ALL (p_skipped)
               AND NOT EXISTS (SELECT 1 FROM queue_release_pauses p WHERE p.user_id = w.user_id)
               AND (w.capacity_turn_key, w.capacity_wait_since, w.queue_seq) > (v_key, v_wait, v_seq)
             ORDER BY w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
             LIMIT 1;
        END IF;
        EXIT WHEN NOT FOUND;
        v_rank := queue_capacity_in_use_of_user(v_user_id);
        IF runs_in_use IS NULL OR v_rank < runs_in_use THEN
            job_id := v_job_id;
            runs_in_use := v_rank;
        END IF;
        EXIT WHEN v_rank = 0;
    END LOOP;
    IF job_id IS NOT NULL THEN
        RETURN NEXT;
    END IF;
END
$function$;

CREATE OR REPLACE FUNCTION public.queue_capacity_give_back_turn(p_user_id text, p_turn_before timestamp with time zone, p_turn_granted timestamp with time zone)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_turn_now timestamptz;
BEGIN
    IF p_turn_before IS NULL THEN
        DELETE FROM user_capacity_turns t WHERE t.user_id = p_user_id AND t.last_turn_at = p_turn_granted;
    ELSE
        UPDATE user_capacity_turns t SET last_turn_at = p_turn_before
         WHERE t.user_id = p_user_id AND t.last_turn_at = p_turn_granted;
    END IF;
    SELECT t.last_turn_at INTO v_turn_now FROM user_capacity_turns t WHERE t.user_id = p_user_id;
    UPDATE analysis_jobs w
       SET capacity_turn_key = GREATEST(v_turn_now, w.capacity_wait_since)
     WHERE w.user_id = p_user_id AND w.status = 'pending'
       AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL;
END
$function$;

CREATE OR REPLACE FUNCTION public.queue_capacity_in_use()
 RETURNS integer
 LANGUAGE sql
 STABLE
AS $function$
    SELECT (SELECT count(*) FROM analysis_jobs a
             WHERE (a.status IN ('pending', 'running') OR a.run_settle_due_at IS NOT NULL) AND a.delta_of_job_id IS NULL
               AND a.slot IS NOT NULL
               AND (a.capacity_wait_since IS NULL OR a.capacity_token IS NOT NULL))::integer
         + (SELECT count(*) FROM analysis_jobs d
             WHERE (d.status IN ('pending', 'running') OR d.run_settle_due_at IS NOT NULL) AND d.delta_of_job_id IS NOT NULL
               AND (d.capacity_wait_since IS NULL OR d.capacity_token IS NOT NULL))::integer
$function$;

CREATE OR REPLACE FUNCTION public.queue_capacity_in_use_of_user(p_user_id text)
 RETURNS integer
 LANGUAGE sql
 STABLE
AS $function$
    SELECT (SELECT count(*) FROM analysis_jobs a
             WHERE a.user_id = p_user_id
               AND (a.status IN ('pending', 'running') OR a.run_settle_due_at IS NOT NULL) AND a.delta_of_job_id IS NULL
               AND a.slot IS NOT NULL
               AND (a.capacity_wait_since IS NULL OR a.capacity_token IS NOT NULL))::integer
         + (SELECT count(*) FROM analysis_jobs d
             WHERE d.user_id = p_user_id
               AND (d.status IN ('pending', 'running') OR d.run_settle_due_at IS NOT NULL) AND d.delta_of_job_id IS NOT NULL
               AND (d.capacity_wait_since IS NULL OR d.capacity_token IS NOT NULL))::integer
$function$;

CREATE OR REPLACE FUNCTION public.queue_capacity_next_in_line()
 RETURNS uuid
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_best uuid;
    v_locked record;
    v_skipped uuid[] := '{}';
BEGIN
    LOOP
        SELECT f.job_id INTO v_best FROM queue_capacity_first_waiting(false, v_skipped, NULL) f;
        IF v_best IS NULL THEN
            RETURN NULL;
        END IF;
        SELECT w.status, w.capacity_wait_since, w.capacity_token INTO v_locked
          FROM analysis_jobs w
         WHERE w.job_id = v_best
           FOR UPDATE SKIP LOCKED;
        IF FOUND AND v_locked.status = 'pending' AND v_locked.capacity_wait_since IS NOT NULL
           AND v_locked.capacity_token IS NULL THEN
            RETURN v_best;
        END IF;
        -- Locked by another transaction (or changed meanwhile): the order without it.
        v_skipped := v_skipped || v_best;
    END LOOP;
END
$function$;

CREATE OR REPLACE FUNCTION public.queue_capacity_probe_taken()
 RETURNS void
 LANGUAGE sql
AS $function$
    UPDATE queue_capacity
       SET core_limit = CASE WHEN capacity > 0 AND core_limit + 1 >= capacity THEN NULL ELSE core_limit + 1 END,
           next_probe_at = NULL
     WHERE core_limit IS NOT NULL
$function$;

CREATE OR REPLACE FUNCTION public.queue_capacity_refused(p_job_id uuid, p_attempt integer, p_probe_interval_seconds double precision)
 RETURNS TABLE(row_kind text, core_limit integer)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_in_use integer;
    v_user_id text;
    v_turn_before timestamptz;
    v_turn_granted timestamptz;
BEGIN
    UPDATE analysis_jobs a
       SET capacity_token = NULL,
           next_release_at = NULL,
           capacity_wait_since = COALESCE(a.capacity_wait_since, clock_timestamp())
     WHERE a.job_id = p_job_id AND a.status = 'pending' AND a.release_attempts = p_attempt
    RETURNING a.user_id, a.capacity_turn_before, a.capacity_turn_key INTO v_user_id, v_turn_before, v_turn_granted;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM queue_capacity_give_back_turn(v_user_id, v_turn_before, v_turn_granted);
    v_in_use := queue_capacity_in_use();
    INSERT INTO queue_capacity AS c (capacity, core_limit, next_probe_at, core_refusals)
    VALUES (0, v_in_use, clock_timestamp() + make_interval(secs => p_probe_interval_seconds), 1)
    ON CONFLICT (singleton) DO UPDATE
       SET core_limit = least(COALESCE(c.core_limit, v_in_use), v_in_use),
           next_probe_at = clock_timestamp() + make_interval(secs => p_probe_interval_seconds),
           core_refusals = c.core_refusals + 1;
    RETURN QUERY SELECT 'refused'::text, c.core_limit FROM queue_capacity c;
END
$function$;

CREATE OR REPLACE FUNCTION public.queue_current_timeline()
 RETURNS integer
 LANGUAGE sql
AS $function$
    SELECT CASE WHEN pg_is_in_recovery() THEN (SELECT timeline_id FROM pg_control_checkpoint())
                ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int
           END
$function$;

CREATE OR REPLACE FUNCTION public.queue_doi_search_key(doi text)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE STRICT
AS $function$
    SELECT lower(regexp_replace(doi, '[\u0080-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u115f-\u1160\u180e\u200b-\u200f\u2028-\u2029\u202a-\u202e\u2060-\u2064\u2066-\u206f\u3164\ufeff\uffa0\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]', '', 'g'))
$function$;

CREATE OR REPLACE FUNCTION public.queue_end_job(p_job_id uuid, p_status text, p_from_statuses text[], p_last_error text, p_expected_attempts integer, p_run_unsettled boolean, p_refund boolean, p_actor text, p_reason text, p_default_max_active integer, p_release_window_seconds double precision, p_lease_seconds double precision)
 RETURNS TABLE(row_kind text, out_job_id uuid, out_user_id text, out_run_id uuid, out_status text, out_delta_of_job_id uuid, out_run_unsettled boolean, out_refunded integer)
 LANGUAGE plpgsql
AS $function$
DECLARE
    ended analysis_jobs%ROWTYPE;
BEGIN
    UPDATE analysis_jobs a
       SET status = p_status,
           end_time = clock_timestamp(),
           last_error = CASE WHEN p_last_error <> '' THEN p_last_error ELSE a.last_error END,
           next_release_at = NULL,
           next_reconcile_at = NULL,
           run_settle_due_at = CASE WHEN p_run_unsettled THEN clock_timestamp() END,
           canceled_by = CASE WHEN p_status = 'canceled' AND p_reason = 'cancel' THEN COALESCE(a.canceled_by, p_actor)
                              ELSE a.canceled_by END
     WHERE a.job_id = p_job_id
       AND a.status = ANY(p_from_statuses)
       AND (p_expected_attempts IS NULL OR a.release_attempts = p_expected_attempts)
    RETURNING a.* INTO ended;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT 'ended', ended.job_id, ended.user_id, ended.run_id, ended.status, ended.delta_of_job_id,
                        ended.run_settle_due_at IS NOT NULL,
                        CASE
                            WHEN p_refund THEN queue_refund_job_charge(ended.job_id, p_actor, p_reason)
                            WHEN ended.status = 'failed' AND ended.cancel_requested_at IS NOT NULL
                                THEN queue_refund_job_charge(ended.job_id, p_actor, 'cancel')
                            ELSE 0
                        END;
    IF NOT p_run_unsettled THEN
        RETURN QUERY SELECT 'promoted', p.promoted_job_id, ended.user_id, p.promoted_run_id, 'pending'::text,
                            NULL::uuid, false, 0
                       FROM queue_promote_queued_jobs(ended.user_id, p_default_max_active, p_release_window_seconds, p_lease_seconds) AS p;
    END IF;
END
$function$;

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
        UPDATE analysis_jobs a
           SET capacity_token = v_token,
               capacity_turn_before = (SELECT t.last_turn_at FROM user_capacity_turns t WHERE t.user_id = a.user_id),
               capacity_turn_key = v_now,
               release_attempts = a.release_attempts + 1,
               release_turn_attempt = a.release_attempts + 1,
               next_release_at = v_now + make_interval(secs => p_lease_seconds),
               release_deadline = v_now + make_interval(secs => p_release_window_seconds)
         WHERE a.job_id = v_job_id
        RETURNING a.job_id, a.user_id, a.run_id, a.release_attempts, a.capacity_wait_since, a.cancel_requested_at INTO v_job;
        INSERT INTO user_capacity_turns AS t (user_id, last_turn_at) VALUES (v_job.user_id, v_now)
        ON CONFLICT ON CONSTRAINT user_capacity_turns_pkey DO UPDATE SET last_turn_at = EXCLUDED.last_turn_at;
        -- Her other waiting jobs (several slots, re-checks) wait behind every user waiting now.
        UPDATE analysis_jobs o
           SET capacity_turn_key = v_now
         WHERE o.user_id = v_job.user_id AND o.status = 'pending'
           AND o.capacity_wait_since IS NOT NULL AND o.capacity_token IS NULL AND o.capacity_turn_key < v_now;
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

CREATE OR REPLACE FUNCTION public.queue_history_reconciled()
 RETURNS boolean
 LANGUAGE sql
 STABLE
AS $function$
    SELECT CASE WHEN pg_is_in_recovery() OR NOT has_function_privilege('pg_control_system()', 'EXECUTE') THEN false
                ELSE EXISTS (
                    SELECT 1 FROM core_reconciled_histories
                     WHERE system_identifier = (SELECT system_identifier FROM pg_control_system())::text
                       AND timeline_id = queue_current_timeline())
           END
$function$;

CREATE OR REPLACE FUNCTION public.queue_promote_queued_jobs(p_user_id text, p_default_max_active integer, p_release_window_seconds double precision, p_lease_seconds double precision)
 RETURNS TABLE(promoted_job_id uuid, promoted_run_id uuid)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_slot integer;
BEGIN
    LOOP
        v_slot := analysis_jobs_free_slot(p_user_id, p_default_max_active);
        EXIT WHEN v_slot IS NULL;
        UPDATE analysis_jobs j
           SET status = 'pending',
               slot = v_slot,
               promote_time = clock_timestamp(),
               next_release_at = clock_timestamp() + make_interval(secs => p_lease_seconds),
               release_deadline = clock_timestamp() + make_interval(secs => p_release_window_seconds),
               release_attempts = 1
         WHERE j.job_id = (SELECT q.job_id FROM analysis_jobs q
                            WHERE q.user_id = p_user_id AND q.status = 'queued'
                            ORDER BY q.queue_seq
                            LIMIT 1)
        RETURNING j.job_id, j.run_id INTO promoted_job_id, promoted_run_id;
        EXIT WHEN NOT FOUND;
        RETURN NEXT;
    END LOOP;
END
$function$;

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

CREATE OR REPLACE FUNCTION public.queue_releases_paused(p_user_id text)
 RETURNS boolean
 LANGUAGE sql
 STABLE
AS $function$
    SELECT EXISTS (SELECT 1 FROM queue_release_pauses p WHERE p.user_id = '' OR p.user_id = p_user_id)
$function$;

CREATE OR REPLACE FUNCTION public.queue_set_releases_paused(p_user_id text, p_paused boolean, p_actor text, p_note text)
 RETURNS TABLE(row_kind text, change_id bigint, setting text, user_id text, old_value integer, new_value integer, actor text, create_time timestamp with time zone, note text)
 LANGUAGE sql
AS $function$
    SELECT * FROM queue_set_releases_paused(p_user_id, p_paused, p_actor, p_note, NULL::double precision)
$function$;

CREATE OR REPLACE FUNCTION public.queue_set_releases_paused(p_user_id text, p_paused boolean, p_actor text, p_note text, p_release_window_seconds double precision)
 RETURNS TABLE(row_kind text, change_id bigint, setting text, user_id text, old_value integer, new_value integer, actor text, create_time timestamp with time zone, note text)
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF p_paused THEN
        INSERT INTO queue_release_pauses AS p (user_id, paused_by, note) VALUES (p_user_id, p_actor, p_note)
        ON CONFLICT ON CONSTRAINT queue_release_pauses_pkey DO NOTHING;
    ELSE
        DELETE FROM queue_release_pauses p WHERE p.user_id = p_user_id;
    END IF;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF NOT p_paused THEN
        -- The retries the pause held (their runs may judge: they kept their capacity) are due now.
        UPDATE analysis_jobs j
           SET next_release_at = clock_timestamp(),
               release_deadline = GREATEST(j.release_deadline,
                                           clock_timestamp() + make_interval(secs => p_release_window_seconds))
         WHERE j.status = 'pending' AND j.next_release_at IS NULL
           AND (j.capacity_wait_since IS NULL OR j.capacity_token IS NOT NULL)
           AND (p_user_id = '' OR j.user_id = p_user_id)
           AND NOT queue_releases_paused(j.user_id);
    END IF;
    RETURN QUERY
    INSERT INTO queue_setting_changes AS c (setting, user_id, old_value, new_value, actor, note)
    VALUES ('releases_paused', NULLIF(p_user_id, ''), CASE WHEN p_paused THEN 0 ELSE 1 END,
            CASE WHEN p_paused THEN 1 ELSE 0 END, p_actor, p_note)
    RETURNING 'changed'::text, c.change_id, c.setting, c.user_id, c.old_value, c.new_value, c.actor, c.create_time, c.note;
END
$function$;

CREATE OR REPLACE FUNCTION public.queue_take_back_unreleased_jobs(p_user_id text, p_default_max_active integer)
 RETURNS SETOF uuid
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_job record;
BEGIN
    WHILE analysis_jobs_free_slot(p_user_id, p_default_max_active) IS NULL LOOP
        SELECT p.job_id, p.capacity_token, p.capacity_turn_before, p.capacity_turn_key INTO v_job
          FROM analysis_jobs p
         WHERE p.user_id = p_user_id AND p.status = 'pending' AND p.delta_of_job_id IS NULL
           AND p.cancel_requested_at IS NULL
           AND ((p.capacity_wait_since IS NOT NULL AND p.capacity_token IS NULL)
                OR p.release_attempts <= p.release_turn_attempt)
         ORDER BY p.queue_seq DESC
         LIMIT 1
           FOR UPDATE;
        EXIT WHEN NOT FOUND;
        UPDATE analysis_jobs j
           SET status = 'queued',
               slot = NULL,
               promote_time = NULL,
               next_release_at = NULL,
               release_deadline = NULL,
               release_attempts = 0,
               capacity_wait_since = NULL,
               capacity_token = NULL,
               capacity_turn_before = NULL,
               capacity_turn_key = NULL
         WHERE j.job_id = v_job.job_id;
        IF v_job.capacity_token IS NOT NULL THEN
            -- Its grant is given back, and the turn with it (as `queue_capacity_refused` does).
            PERFORM queue_capacity_give_back_turn(p_user_id, v_job.capacity_turn_before, v_job.capacity_turn_key);
        END IF;
        RETURN NEXT v_job.job_id;
    END LOOP;
END
$function$;

CREATE VIEW public.analysis_job_views AS
 SELECT job_id,
    user_id,
    run_id,
    status,
    delta_of_job_id,
    release_attempts,
    last_error,
    create_time,
    promote_time,
    start_time,
    end_time,
    price,
    queue_seq,
        CASE
            WHEN status = 'queued'::text THEN ( SELECT count(*) AS count
               FROM analysis_jobs q
              WHERE q.user_id = j.user_id AND q.status = 'queued'::text AND q.queue_seq <= j.queue_seq)
            ELSE 0::bigint
        END AS queue_position,
        CASE
            WHEN status = 'queued'::text THEN COALESCE(( SELECT q.job_id
               FROM analysis_jobs q
              WHERE q.user_id = j.user_id AND q.status = 'queued'::text AND q.queue_seq < j.queue_seq
              ORDER BY q.queue_seq DESC
             LIMIT 1), ( SELECT a.job_id
               FROM analysis_jobs a
              WHERE a.user_id = j.user_id AND (a.status = ANY (ARRAY['pending'::text, 'running'::text])) AND a.delta_of_job_id IS NULL
              ORDER BY a.promote_time, a.queue_seq
             LIMIT 1))
            ELSE NULL::uuid
        END AS waiting_for_job_id,
        CASE
            WHEN status = 'queued'::text THEN ( SELECT min(COALESCE(a.start_time, a.promote_time)) AS min
               FROM analysis_jobs a
              WHERE a.user_id = j.user_id AND (a.status = ANY (ARRAY['pending'::text, 'running'::text])) AND a.delta_of_job_id IS NULL)
            ELSE NULL::timestamp with time zone
        END AS active_since,
    ( SELECT l.max_active
           FROM user_queue_limits l
          WHERE l.user_id = j.user_id) AS max_active_override,
    COALESCE(( SELECT true
           FROM credit_ledger r
          WHERE r.job_id = j.job_id AND r.kind = 'refund'::text), false) AS refunded,
    status = 'pending'::text AND capacity_wait_since IS NOT NULL AND capacity_token IS NULL AS waiting_for_capacity,
    capacity_wait_since,
    document_uri,
    document_title,
    source_count,
    sources_preview,
    retry_of_job_id,
    ARRAY( SELECT r.job_id
           FROM analysis_jobs r
          WHERE r.retry_of_job_id = j.job_id
          ORDER BY r.create_time, r.job_id) AS retried_as_job_ids,
    canceled_by
   FROM analysis_jobs j;

CREATE VIEW public.analysis_jobs_capacity_order AS
 SELECT job_id,
    user_id,
    run_id,
    capacity_wait_since,
    row_number() OVER (ORDER BY (queue_releases_paused(user_id)), (queue_capacity_in_use_of_user(user_id)), capacity_turn_key, capacity_wait_since, queue_seq) AS capacity_position
   FROM analysis_jobs w
  WHERE status = 'pending'::text AND capacity_wait_since IS NOT NULL AND capacity_token IS NULL;

CREATE OR REPLACE FUNCTION public.queue_admit_job(p_job_id uuid, p_user_id text, p_run_id uuid, p_idempotency_key text, p_request_digest bytea, p_delta_of_job_id uuid, p_price integer, p_actor text, p_reason text, p_default_max_active integer, p_max_queued integer, p_max_running_deltas integer, p_release_window_seconds double precision, p_release_lease_seconds double precision, p_reconcile_after_seconds double precision)
 RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
 LANGUAGE sql
AS $function$
    SELECT * FROM queue_admit_job(p_job_id, p_user_id, p_run_id, p_idempotency_key, p_request_digest, p_delta_of_job_id,
                                  p_price, p_actor, p_reason, p_default_max_active, p_max_queued, p_max_running_deltas,
                                  p_release_window_seconds, p_release_lease_seconds, p_reconcile_after_seconds,
                                  NULL::text, NULL::text, NULL::jsonb)
$function$;

CREATE OR REPLACE FUNCTION public.queue_admit_job(p_job_id uuid, p_user_id text, p_run_id uuid, p_idempotency_key text, p_request_digest bytea, p_delta_of_job_id uuid, p_price integer, p_actor text, p_reason text, p_default_max_active integer, p_max_queued integer, p_max_running_deltas integer, p_release_window_seconds double precision, p_release_lease_seconds double precision, p_reconcile_after_seconds double precision, p_document_uri text, p_document_title text, p_sources jsonb)
 RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
 LANGUAGE sql
AS $function$
    SELECT * FROM queue_admit_job(p_job_id, p_user_id, p_run_id, p_idempotency_key, p_request_digest, p_delta_of_job_id,
                                  p_price, p_actor, p_reason, p_default_max_active, p_max_queued, p_max_running_deltas,
                                  p_release_window_seconds, p_release_lease_seconds, p_reconcile_after_seconds,
                                  p_document_uri, p_document_title, p_sources, false)
$function$;

CREATE OR REPLACE FUNCTION public.queue_admit_job(p_job_id uuid, p_user_id text, p_run_id uuid, p_idempotency_key text, p_request_digest bytea, p_delta_of_job_id uuid, p_price integer, p_actor text, p_reason text, p_default_max_active integer, p_max_queued integer, p_max_running_deltas integer, p_release_window_seconds double precision, p_release_lease_seconds double precision, p_reconcile_after_seconds double precision, p_document_uri text, p_document_title text, p_sources jsonb, p_delta_held boolean)
 RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
 LANGUAGE sql
AS $function$
    SELECT * FROM queue_admit_job_v2(p_job_id, p_user_id, p_run_id, p_idempotency_key, p_request_digest, p_delta_of_job_id,
                                     p_price, p_actor, p_reason, p_default_max_active, p_max_queued, p_max_running_deltas,
                                     p_release_window_seconds, p_release_lease_seconds, p_reconcile_after_seconds,
                                     p_document_uri, p_document_title, p_sources, p_delta_held, NULL::uuid)
$function$;

CREATE OR REPLACE FUNCTION public.queue_admit_job_v2(p_job_id uuid, p_user_id text, p_run_id uuid, p_idempotency_key text, p_request_digest bytea, p_delta_of_job_id uuid, p_price integer, p_actor text, p_reason text, p_default_max_active integer, p_max_queued integer, p_max_running_deltas integer, p_release_window_seconds double precision, p_release_lease_seconds double precision, p_reconcile_after_seconds double precision, p_document_uri text, p_document_title text, p_sources jsonb, p_delta_held boolean, p_retry_of_job_id uuid)
 RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_is_delta constant boolean := p_delta_of_job_id IS NOT NULL;
    v_delta_judging constant boolean := p_delta_of_job_id IS NOT NULL AND NOT p_delta_held;
    v_delta_held constant boolean := p_delta_of_job_id IS NOT NULL AND p_delta_held;
    v_admitted uuid;
BEGIN
    WITH reservation AS (
        SELECT r.run_id FROM run_reservations r
         WHERE r.run_id = p_run_id AND NOT r.canceling
           FOR UPDATE
    ),
    queue AS (
        -- The user's queue length, counted once: it decides the placement and guards the cap.
        SELECT CASE WHEN v_is_delta THEN 0 ELSE (SELECT count(*) FROM analysis_jobs q
                                                   WHERE q.user_id = p_user_id AND q.status = 'queued') END AS queued
    ),
    placement AS (
        SELECT clock_timestamp() AS now,
               queue.queued,
               CASE
                   WHEN v_is_delta OR queue.queued > 0 THEN NULL
                   ELSE analysis_jobs_free_slot(p_user_id, p_default_max_active)
               END AS slot
          FROM queue
    ),
    inserted AS (
        INSERT INTO analysis_jobs (
            job_id, user_id, run_id, idempotency_key, request_digest, status, queue_seq, slot,
            delta_of_job_id, price, create_time, promote_time, next_release_at, release_attempts,
            release_deadline, start_time, next_reconcile_at,
            document_uri, document_title, sources, source_count, sources_preview, retry_of_job_id)
        SELECT p_job_id, p_user_id, p_run_id, p_idempotency_key, p_request_digest,
               CASE WHEN v_delta_judging THEN 'running' WHEN v_delta_held OR pl.slot IS NOT NULL THEN 'pending' ELSE 'queued' END,
               nextval('analysis_jobs_queue_seq'),
               pl.slot,
               p_delta_of_job_id,
               p_price,
               pl.now,
               CASE WHEN v_is_delta OR pl.slot IS NOT NULL THEN pl.now END,
               CASE WHEN v_delta_held OR pl.slot IS NOT NULL THEN pl.now + make_interval(secs => p_release_lease_seconds) END,
               CASE WHEN v_delta_held OR pl.slot IS NOT NULL THEN 1 ELSE 0 END,
               CASE WHEN v_delta_held OR pl.slot IS NOT NULL THEN pl.now + make_interval(secs => p_release_window_seconds) END,
               CASE WHEN v_delta_judging THEN pl.now END,
               CASE WHEN v_delta_judging THEN pl.now + make_interval(secs => p_reconcile_after_seconds) END,
               p_document_uri, p_document_title, p_sources, jsonb_array_length(p_sources),
               (SELECT jsonb_agg(jsonb_build_object('doi', s.e->>'doi', 'citation', left(s.e->>'citation', 512)) ORDER BY s.n)
                  FROM jsonb_array_elements(p_sources) WITH ORDINALITY AS s(e, n)
                 WHERE s.n <= 10),
               p_retry_of_job_id
          FROM placement pl, reservation r
         WHERE (p_price = 0 OR EXISTS (SELECT 1 FROM credit_accounts c
                                        WHERE c.user_id = p_user_id AND c.balance >= p_price))
           AND (v_is_delta OR pl.queued < p_max_queued)
           AND (NOT v_is_delta OR (SELECT count(*) FROM analysis_jobs d
                                    WHERE d.user_id = p_user_id AND d.status IN ('pending', 'running')
                                      AND d.delta_of_job_id IS NOT NULL) < p_max_running_deltas)
        ON CONFLICT (user_id, idempotency_key) DO NOTHING
        RETURNING analysis_jobs.job_id, analysis_jobs.user_id, analysis_jobs.price
    ),
    consumed AS (
        DELETE FROM run_reservations r WHERE r.run_id = p_run_id AND EXISTS (SELECT 1 FROM inserted)
    ),
    debit AS (
        -- Under the user lock nothing else lowers this balance; its CHECK (balance >= 0) is the backstop.
        UPDATE credit_accounts c
           SET balance = c.balance - i.price, updated_at = clock_timestamp()
          FROM inserted i
         WHERE c.user_id = i.user_id AND i.price > 0
    ),
    charge AS (
        INSERT INTO credit_ledger (user_id, kind, amount, job_id, actor, reason)
        SELECT i.user_id, 'charge', -i.price, i.job_id, p_actor, p_reason FROM inserted i WHERE i.price > 0
    )
    SELECT i.job_id INTO v_admitted FROM inserted i;
    IF v_admitted IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT 'admitted'::text, 0, false, v FROM analysis_job_views v WHERE v.job_id = v_admitted;
END
$function$;

CREATE OR REPLACE FUNCTION public.queue_adopt_run(p_job_id uuid, p_user_id text, p_run_id uuid, p_idempotency_key text, p_request_digest bytea, p_delta_of_run_id uuid, p_price bigint, p_judging boolean, p_actor text, p_reason text, p_default_max_active integer, p_release_window_seconds double precision, p_release_lease_seconds double precision, p_reconcile_after_seconds double precision)
 RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
 LANGUAGE sql
AS $function$
    SELECT * FROM queue_adopt_run_v2(p_job_id, p_user_id, p_run_id, p_idempotency_key, p_request_digest, p_delta_of_run_id,
                                     p_price, p_judging, p_actor, p_reason, p_default_max_active, p_release_window_seconds,
                                     p_release_lease_seconds, p_reconcile_after_seconds, NULL::uuid)
$function$;

CREATE OR REPLACE FUNCTION public.queue_adopt_run_v2(p_job_id uuid, p_user_id text, p_run_id uuid, p_idempotency_key text, p_request_digest bytea, p_delta_of_run_id uuid, p_price bigint, p_judging boolean, p_actor text, p_reason text, p_default_max_active integer, p_release_window_seconds double precision, p_release_lease_seconds double precision, p_reconcile_after_seconds double precision, p_retry_of_job_id uuid)
 RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_existing uuid;
    v_base uuid;
    v_slot integer;
    v_status text;
    v_taken_back uuid[] := '{}';
    v_now timestamptz := clock_timestamp();
BEGIN
    SELECT j.job_id INTO v_existing FROM analysis_jobs j WHERE j.run_id = p_run_id;
    IF v_existing IS NOT NULL THEN
        RETURN QUERY SELECT 'known'::text, 0, false, v FROM analysis_job_views v WHERE v.job_id = v_existing;
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM run_reservations r WHERE r.run_id = p_run_id) THEN
        -- A judging first-pass run: its admit did commit, on a database that lost it. A claimed
        -- reservation from an earlier timeline: its admit ran on a primary a failover replaced.
        IF NOT ((p_judging AND p_delta_of_run_id IS NULL)
                OR EXISTS (SELECT 1 FROM run_reservations r
                            WHERE r.run_id = p_run_id AND r.canceling AND r.timeline_id < queue_current_timeline())) THEN
            RETURN QUERY SELECT 'reserved'::text, 0, false, NULL::analysis_job_views;
            RETURN;
        END IF;
        DELETE FROM run_reservations r WHERE r.run_id = p_run_id;
    END IF;
    SELECT j.job_id INTO v_existing FROM analysis_jobs j
     WHERE (j.user_id = p_user_id AND j.idempotency_key = p_idempotency_key) OR j.job_id = p_job_id
     LIMIT 1;
    IF v_existing IS NOT NULL THEN
        RETURN QUERY SELECT 'key_taken'::text, 0, false, v FROM analysis_job_views v WHERE v.job_id = v_existing;
        RETURN;
    END IF;
    IF p_delta_of_run_id IS NOT NULL THEN
        SELECT b.job_id INTO v_base FROM analysis_jobs b WHERE b.run_id = p_delta_of_run_id AND b.user_id = p_user_id;
        IF v_base IS NULL THEN
            RETURN QUERY SELECT 'delta_base_lost'::text, 0, false, NULL::analysis_job_views;
            RETURN;
        END IF;
    END IF;
    IF p_price > 0 AND NOT EXISTS (SELECT 1 FROM credit_accounts c WHERE c.user_id = p_user_id AND c.balance >= p_price) THEN
        RETURN QUERY SELECT 'balance_short'::text, 0, false, NULL::analysis_job_views;
        RETURN;
    END IF;

    IF v_base IS NOT NULL THEN
        -- A re-check the core holds waits for its turn while the capacity is limited (0023).
        v_status := CASE WHEN p_judging THEN 'running' ELSE 'pending' END;
    ELSIF p_judging THEN
        v_status := 'running';
        -- The core judges this run: the user's jobs it has not been asked to judge give way.
        SELECT coalesce(array_agg(t.job_id), '{}') INTO v_taken_back
          FROM queue_take_back_unreleased_jobs(p_user_id, p_default_max_active) AS t(job_id);
        v_slot := COALESCE(analysis_jobs_free_slot(p_user_id, p_default_max_active),
                           (SELECT COALESCE(max(h.slot), 0) + 1 FROM analysis_jobs h
                             WHERE h.user_id = p_user_id AND h.delta_of_job_id IS NULL AND h.slot IS NOT NULL
                               AND (h.status IN ('pending', 'running') OR h.run_settle_due_at IS NOT NULL)));
    ELSE
        IF NOT EXISTS (SELECT 1 FROM analysis_jobs q WHERE q.user_id = p_user_id AND q.status = 'queued') THEN
            v_slot := analysis_jobs_free_slot(p_user_id, p_default_max_active);
        END IF;
        v_status := CASE WHEN v_slot IS NULL THEN 'queued' ELSE 'pending' END;
    END IF;

    INSERT INTO analysis_jobs (
        job_id, user_id, run_id, idempotency_key, request_digest, status, queue_seq, slot,
        delta_of_job_id, price, create_time, promote_time, next_release_at, release_attempts,
        release_deadline, start_time, next_reconcile_at, retry_of_job_id)
    VALUES (
        p_job_id, p_user_id, p_run_id, p_idempotency_key, p_request_digest, v_status,
        nextval('analysis_jobs_queue_seq'), v_slot, v_base, p_price, v_now,
        CASE WHEN v_status <> 'queued' THEN v_now END,
        CASE WHEN v_status = 'pending' THEN v_now END,  -- due at once, for any replica's dispatcher
        0,
        CASE WHEN v_status = 'pending' THEN v_now + make_interval(secs => p_release_window_seconds) END,
        CASE WHEN v_status = 'running' THEN v_now END,
        CASE WHEN v_status = 'running' THEN v_now + make_interval(secs => p_reconcile_after_seconds) END,
        p_retry_of_job_id);
    IF p_price > 0 THEN
        -- Under the user lock nothing else lowers this balance; its CHECK (balance >= 0) is the backstop.
        UPDATE credit_accounts c SET balance = c.balance - p_price, updated_at = clock_timestamp()
         WHERE c.user_id = p_user_id;
        INSERT INTO credit_ledger (user_id, kind, amount, job_id, actor, reason)
        VALUES (p_user_id, 'charge', -p_price, p_job_id, p_actor, p_reason);
    END IF;
    RETURN QUERY SELECT 'adopted'::text, 0, false, v FROM analysis_job_views v WHERE v.job_id = p_job_id;
    RETURN QUERY SELECT 'taken_back'::text, 0, false, v
                   FROM analysis_job_views v WHERE v.job_id = ANY (v_taken_back) ORDER BY v.queue_seq;
END
$function$;

CREATE OR REPLACE FUNCTION public.queue_end_job_viewed(p_job_id uuid, p_status text, p_from_statuses text[], p_last_error text, p_expected_attempts integer, p_run_unsettled boolean, p_refund boolean, p_actor text, p_reason text, p_default_max_active integer, p_release_window_seconds double precision, p_lease_seconds double precision)
 RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_ending record;
    v_ended_refund integer;
    v_ended_unsettled boolean;
    v_promoted uuid[] := '{}';
BEGIN
    FOR v_ending IN
        SELECT * FROM queue_end_job(p_job_id, p_status, p_from_statuses, p_last_error, p_expected_attempts,
                                    p_run_unsettled, p_refund, p_actor, p_reason, p_default_max_active,
                                    p_release_window_seconds, p_lease_seconds)
    LOOP
        IF v_ending.row_kind = 'ended' THEN
            v_ended_refund := v_ending.out_refunded;
            v_ended_unsettled := v_ending.out_run_unsettled;
        ELSE
            v_promoted := v_promoted || v_ending.out_job_id;
        END IF;
    END LOOP;
    IF v_ended_refund IS NULL THEN
        RETURN;
    END IF;
    -- Each RETURN QUERY is a statement of its own: it sees the ending and the promotions.
    RETURN QUERY SELECT 'ended'::text, v_ended_refund, v_ended_unsettled, v
                   FROM analysis_job_views v WHERE v.job_id = p_job_id;
    RETURN QUERY SELECT * FROM queue_promoted_views(v_promoted);
END
$function$;

CREATE OR REPLACE FUNCTION public.queue_end_run_viewed(p_run_id uuid, p_locked_user_id text, p_status text, p_last_error text, p_refund boolean, p_actor text, p_reason text, p_default_max_active integer, p_release_window_seconds double precision, p_lease_seconds double precision)
 RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_job_id uuid;
    v_user_id text;
    v_status text;
    v_waiting_for_capacity boolean;
    v_run_unsettled boolean;
    v_reserved boolean;
BEGIN
    -- The job and the reservation in one snapshot: the admit that commits the job deletes the
    -- reservation, so one of the two is seen unless neither exists.
    SELECT j.job_id, j.user_id, j.status, j.capacity_wait_since IS NOT NULL AND j.capacity_token IS NULL,
           j.run_settle_due_at IS NOT NULL,
           EXISTS (SELECT 1 FROM run_reservations r WHERE r.run_id = p_run_id)
      INTO v_job_id, v_user_id, v_status, v_waiting_for_capacity, v_run_unsettled, v_reserved
      FROM (SELECT 1) AS one
      LEFT JOIN analysis_jobs j ON j.run_id = p_run_id;
    IF v_job_id IS NULL OR v_user_id IS DISTINCT FROM p_locked_user_id THEN
        RETURN QUERY SELECT CASE WHEN v_job_id IS NOT NULL OR v_reserved THEN 'reserved' ELSE 'unknown' END,
                            0, false, NULL::analysis_job_views;
        RETURN;
    END IF;
    IF v_status = 'running' OR (v_status = 'pending' AND NOT v_waiting_for_capacity) THEN
        -- Read under the lock, so the ending cannot be fenced out.
        RETURN QUERY SELECT * FROM queue_end_job_viewed(
            v_job_id, p_status, ARRAY['pending', 'running'], p_last_error, NULL, false, p_refund, p_actor,
            p_reason, p_default_max_active, p_release_window_seconds, p_lease_seconds);
        RETURN;
    END IF;
    RETURN QUERY SELECT 'owner'::text, 0, v_run_unsettled, v
                   FROM analysis_job_views v WHERE v.job_id = v_job_id;
END
$function$;

CREATE OR REPLACE FUNCTION public.queue_promote_viewed(p_user_id text, p_default_max_active integer, p_release_window_seconds double precision, p_lease_seconds double precision)
 RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_promoted uuid[];
BEGIN
    SELECT coalesce(array_agg(p.promoted_job_id), '{}') INTO v_promoted
      FROM queue_promote_queued_jobs(p_user_id, p_default_max_active, p_release_window_seconds, p_lease_seconds) AS p;
    RETURN QUERY SELECT * FROM queue_promoted_views(v_promoted);
END
$function$;

CREATE OR REPLACE FUNCTION public.queue_promoted_views(p_job_ids uuid[])
 RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_job_id uuid;
BEGIN
    FOREACH v_job_id IN ARRAY p_job_ids LOOP
        RETURN QUERY SELECT 'promoted'::text, 0, false, v FROM analysis_job_views v WHERE v.job_id = v_job_id;
    END LOOP;
END
$function$;

CREATE OR REPLACE FUNCTION public.queue_refund_failed_job(p_job_id uuid, p_actor text, p_reason text)
 RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_job analysis_jobs%ROWTYPE;
    v_amount integer;
BEGIN
    SELECT * INTO v_job FROM analysis_jobs a WHERE a.job_id = p_job_id AND a.status = 'failed' FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    v_amount := queue_refund_job_charge(p_job_id, p_actor, p_reason);
    IF v_amount > 0 THEN
        PERFORM analysis_jobs_announce(v_job, v_job.status);
    END IF;
    RETURN QUERY SELECT 'refunded'::text, v_amount, false, v FROM analysis_job_views v WHERE v.job_id = p_job_id;
END
$function$;

CREATE OR REPLACE FUNCTION public.queue_settle_job_run(p_job_id uuid, p_user_id text, p_default_max_active integer, p_release_window_seconds double precision, p_lease_seconds double precision)
 RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
 LANGUAGE plpgsql
AS $function$
BEGIN
    UPDATE analysis_jobs a
       SET run_settle_due_at = NULL
     WHERE a.job_id = p_job_id AND a.user_id = p_user_id AND a.run_settle_due_at IS NOT NULL;
    IF FOUND THEN
        RETURN QUERY SELECT 'settled'::text, 0, false, v FROM analysis_job_views v WHERE v.job_id = p_job_id;
    END IF;
    RETURN QUERY SELECT * FROM queue_promote_viewed(p_user_id, p_default_max_active, p_release_window_seconds, p_lease_seconds);
END
$function$;

CREATE TRIGGER analysis_jobs_announce_delete AFTER DELETE ON analysis_jobs FOR EACH ROW EXECUTE FUNCTION analysis_jobs_announce_change();
CREATE TRIGGER analysis_jobs_announce_insert AFTER INSERT ON analysis_jobs FOR EACH ROW EXECUTE FUNCTION analysis_jobs_announce_change();
CREATE TRIGGER analysis_jobs_announce_update AFTER UPDATE ON analysis_jobs FOR EACH ROW WHEN (old.status IS DISTINCT FROM new.status OR old.last_error IS DISTINCT FROM new.last_error OR old.release_attempts IS DISTINCT FROM new.release_attempts OR old.capacity_token IS DISTINCT FROM new.capacity_token OR old.capacity_wait_since IS DISTINCT FROM new.capacity_wait_since) EXECUTE FUNCTION analysis_jobs_announce_change();
CREATE TRIGGER analysis_jobs_keep_search_keys AFTER INSERT ON analysis_jobs FOR EACH ROW WHEN (new.sources IS NOT NULL OR new.document_title IS NOT NULL OR new.document_uri IS NOT NULL) EXECUTE FUNCTION analysis_jobs_keep_search_keys();
CREATE TRIGGER analysis_jobs_retry_lineage_insert BEFORE INSERT ON analysis_jobs FOR EACH ROW WHEN (new.idempotency_key ~~ 'retry:%'::text) EXECUTE FUNCTION analysis_jobs_retry_lineage();
CREATE TRIGGER analysis_jobs_trim_search_keys AFTER UPDATE OF sources ON analysis_jobs FOR EACH ROW WHEN (old.sources IS NOT NULL AND new.sources IS NULL) EXECUTE FUNCTION analysis_jobs_trim_search_keys();
CREATE TRIGGER analysis_jobs_wait_for_capacity BEFORE INSERT OR UPDATE OF status ON analysis_jobs FOR EACH ROW WHEN (new.status = 'pending'::text) EXECUTE FUNCTION analysis_jobs_wait_for_capacity();
