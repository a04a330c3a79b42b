-- The baseline: the schema the numbered migrations in migrations/ leave (sequences, tables with
-- their constraints and indexes, and any rows they insert), dumped from PostgreSQL's catalog of a
-- database that replayed them. A fresh database installs this file, records those migrations as
-- applied, applies any later one, then the files in functions/: every function, trigger and view
-- is there, none here (store/migrations.py). An existing database upgrades through the
-- migrations instead. Read this file to know the tables; change one through a new migration,
-- then regenerate this file with `python -m tests.integration.schema_tool` (tests/integration/test_schema.py
-- fails while it is stale). The runner's own tables, queue_schema_migrations and
-- queue_schema_functions, it creates itself. In the order it applies in: extensions, types,
-- sequences, tables (with their indexes), rows; each sorted by name.
-- Stands for migrations 0001-0042.
-- Dumped on PostgreSQL 18.

CREATE SEQUENCE analysis_jobs_queue_seq AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1;

CREATE TABLE analysis_job_feed (
    xid             xid8 DEFAULT pg_current_xact_id() NOT NULL,
    change_id       bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    change_time     timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    job_id          uuid NOT NULL,
    user_id         text NOT NULL,
    status          text NOT NULL,
    old_status      text,
    release_claimed boolean NOT NULL
) WITH (autovacuum_vacuum_scale_factor=0, autovacuum_vacuum_threshold=20000, autovacuum_vacuum_insert_scale_factor=0, autovacuum_vacuum_insert_threshold=20000);
CREATE INDEX analysis_job_feed_by_xid ON analysis_job_feed USING btree (xid);

CREATE TABLE analysis_job_search_keys (
    job_id             uuid NOT NULL,
    document_uri       text,
    source_dois        text[] NOT NULL,
    title_words        tsvector NOT NULL,
    source_doi_buckets integer[] DEFAULT '{}'::integer[] NOT NULL,
    CONSTRAINT analysis_job_search_keys_pkey PRIMARY KEY (job_id)
);
CREATE INDEX analysis_job_search_keys_by_document_uri ON analysis_job_search_keys USING btree (document_uri COLLATE "C");
CREATE INDEX analysis_job_search_keys_by_source_doi_bucket ON analysis_job_search_keys USING gin (source_doi_buckets);
CREATE INDEX analysis_job_search_keys_by_title_words ON analysis_job_search_keys USING gin (title_words);

CREATE TABLE analysis_jobs (
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
CREATE INDEX analysis_jobs_active_deltas ON analysis_jobs USING btree (user_id) WHERE ((status = ANY (ARRAY['pending'::text, 'running'::text])) AND (delta_of_job_id IS NOT NULL));
CREATE INDEX analysis_jobs_cancels_newest_first ON analysis_jobs USING btree (COALESCE(cancel_requested_at, end_time), job_id) WHERE (canceled_by IS NOT NULL);
CREATE INDEX analysis_jobs_capacity_turn_order ON analysis_jobs USING btree (capacity_turn_key, capacity_wait_since, queue_seq) WHERE ((status = 'pending'::text) AND (capacity_wait_since IS NOT NULL) AND (capacity_token IS NULL));
CREATE INDEX analysis_jobs_delta_base ON analysis_jobs USING btree (delta_of_job_id) WHERE (delta_of_job_id IS NOT NULL);
CREATE INDEX analysis_jobs_deltas_taking_capacity ON analysis_jobs USING btree (user_id) WHERE (((status = ANY (ARRAY['pending'::text, 'running'::text])) OR (run_settle_due_at IS NOT NULL)) AND (delta_of_job_id IS NOT NULL) AND ((capacity_wait_since IS NULL) OR (capacity_token IS NOT NULL)));
CREATE INDEX analysis_jobs_deltas_waiting_turn_order ON analysis_jobs USING btree (capacity_turn_key, capacity_wait_since, queue_seq) WHERE ((status = 'pending'::text) AND (capacity_wait_since IS NOT NULL) AND (capacity_token IS NULL) AND (delta_of_job_id IS NOT NULL));
CREATE INDEX analysis_jobs_ended_holding_sources ON analysis_jobs USING btree (end_time) WHERE ((end_time IS NOT NULL) AND (sources IS NOT NULL));
CREATE INDEX analysis_jobs_ended_status_newest_admitted ON analysis_jobs USING btree (status, create_time, job_id) WHERE (status = ANY (ARRAY['succeeded'::text, 'failed'::text, 'canceled'::text]));
CREATE INDEX analysis_jobs_first_pass_taking_capacity ON analysis_jobs USING btree (user_id) WHERE (((status = ANY (ARRAY['pending'::text, 'running'::text])) OR (run_settle_due_at IS NOT NULL)) AND (delta_of_job_id IS NULL) AND (slot IS NOT NULL) AND ((capacity_wait_since IS NULL) OR (capacity_token IS NOT NULL)));
CREATE INDEX analysis_jobs_newest_admitted ON analysis_jobs USING btree (create_time, job_id);
CREATE UNIQUE INDEX analysis_jobs_one_holder_per_capacity_token ON analysis_jobs USING btree (capacity_token) WHERE ((capacity_token IS NOT NULL) AND ((status = ANY (ARRAY['pending'::text, 'running'::text])) OR (run_settle_due_at IS NOT NULL)));
CREATE UNIQUE INDEX analysis_jobs_one_holder_per_slot ON analysis_jobs USING btree (user_id, slot) WHERE (((status = ANY (ARRAY['pending'::text, 'running'::text])) OR (run_settle_due_at IS NOT NULL)) AND (delta_of_job_id IS NULL));
CREATE INDEX analysis_jobs_queued_in_order ON analysis_jobs USING btree (user_id, queue_seq) WHERE (status = 'queued'::text);
CREATE INDEX analysis_jobs_recent_first_pass_durations ON analysis_jobs USING btree (end_time) WHERE ((status = 'succeeded'::text) AND (delta_of_job_id IS NULL));
CREATE INDEX analysis_jobs_recently_ended ON analysis_jobs USING btree (end_time) WHERE (end_time IS NOT NULL);
CREATE INDEX analysis_jobs_reconcile_due ON analysis_jobs USING btree (next_reconcile_at) WHERE (status = 'running'::text);
CREATE INDEX analysis_jobs_release_due ON analysis_jobs USING btree (next_release_at) WHERE (status = 'pending'::text);
CREATE INDEX analysis_jobs_retries ON analysis_jobs USING btree (retry_of_job_id, create_time) WHERE (retry_of_job_id IS NOT NULL);
CREATE INDEX analysis_jobs_retries_newest_first ON analysis_jobs USING btree (create_time, job_id) WHERE (retry_of_job_id IS NOT NULL);
CREATE INDEX analysis_jobs_run_settle_due ON analysis_jobs USING btree (run_settle_due_at) WHERE (run_settle_due_at IS NOT NULL);
CREATE INDEX analysis_jobs_running_deltas ON analysis_jobs USING btree (user_id) WHERE ((status = 'running'::text) AND (delta_of_job_id IS NOT NULL));
CREATE INDEX analysis_jobs_user_newest_admitted ON analysis_jobs USING btree (user_id, create_time, job_id);
CREATE INDEX analysis_jobs_user_newest_first ON analysis_jobs USING btree (user_id, queue_seq);
CREATE INDEX analysis_jobs_waiting_for_capacity ON analysis_jobs USING btree (capacity_wait_since) WHERE ((status = 'pending'::text) AND (capacity_wait_since IS NOT NULL) AND (capacity_token IS NULL));

CREATE TABLE core_reconciled_histories (
    system_identifier text NOT NULL,
    timeline_id       integer NOT NULL,
    reconciled_at     timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT core_reconciled_histories_pkey PRIMARY KEY (system_identifier, timeline_id)
);

CREATE TABLE core_runs_lost (
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
CREATE INDEX core_runs_lost_newest_first ON core_runs_lost USING btree (recorded_at);

CREATE TABLE credit_accounts (
    user_id    text NOT NULL,
    balance    bigint NOT NULL,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT credit_accounts_balance_check CHECK (balance >= 0),
    CONSTRAINT credit_accounts_pkey PRIMARY KEY (user_id)
);

CREATE TABLE credit_ledger (
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
CREATE INDEX credit_ledger_actor_newest_first ON credit_ledger USING btree (actor, entry_id);
CREATE UNIQUE INDEX credit_ledger_grant_idempotency ON credit_ledger USING btree (user_id, idempotency_key) WHERE (kind = 'grant'::text);
CREATE INDEX credit_ledger_grants_newest_first ON credit_ledger USING btree (create_time, entry_id) WHERE (kind = 'grant'::text);
CREATE INDEX credit_ledger_user_newest_first ON credit_ledger USING btree (user_id, entry_id);

CREATE TABLE queue_capacity (
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

CREATE TABLE queue_operator_actions (
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
CREATE INDEX queue_operator_actions_actor ON queue_operator_actions USING btree (actor, create_time);
CREATE INDEX queue_operator_actions_newest_first ON queue_operator_actions USING btree (create_time, action_id);
CREATE INDEX queue_operator_actions_user ON queue_operator_actions USING btree (user_id, create_time);

CREATE TABLE queue_release_pauses (
    user_id   text NOT NULL,
    paused_by text NOT NULL,
    note      text DEFAULT ''::text NOT NULL,
    paused_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT queue_release_pauses_note_check CHECK (char_length(note) <= 512),
    CONSTRAINT queue_release_pauses_pkey PRIMARY KEY (user_id)
);

CREATE TABLE queue_replicas (
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
CREATE INDEX queue_replicas_by_heartbeat ON queue_replicas USING btree (heartbeat_time);

CREATE TABLE queue_setting_changes (
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
CREATE INDEX queue_setting_changes_newest_first ON queue_setting_changes USING btree (create_time, change_id);

CREATE TABLE run_reservations (
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
CREATE INDEX run_reservations_cancel_due ON run_reservations USING btree (cancel_after);
CREATE UNIQUE INDEX run_reservations_one_live_per_key ON run_reservations USING btree (user_id, idempotency_key) WHERE (NOT canceling);
CREATE INDEX run_reservations_settled ON run_reservations USING btree (settled_at) WHERE (settled_at IS NOT NULL);

CREATE TABLE user_capacity_turns (
    user_id      text NOT NULL,
    last_turn_at timestamp with time zone NOT NULL,
    CONSTRAINT user_capacity_turns_pkey PRIMARY KEY (user_id)
);

CREATE TABLE user_queue_limits (
    user_id    text NOT NULL,
    max_active integer NOT NULL,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT user_queue_limits_max_active_check CHECK (max_active >= 1 AND max_active <= 1000),
    CONSTRAINT user_queue_limits_pkey PRIMARY KEY (user_id)
);
