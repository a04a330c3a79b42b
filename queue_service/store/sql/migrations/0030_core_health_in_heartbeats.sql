-- The core's recent health in each replica's heartbeat, for the Overview's CoreHealth.
--
-- The counters of 0017 run since each replica started: a core that stopped a minute ago moved
-- them by little, and nothing said so on the Overview. Each heartbeat now also writes the
-- replica's reading of the core (`RecentCoreCalls` in core_client.py): the state at the beat
-- (healthy, degraded, unreachable, refusing, unknown), its last answer and last failure with the
-- reason, and per-minute buckets of the last five minutes (answered, refused, unknown, admits
-- answered CORE_UNAVAILABLE, latency buckets). One jsonb column, written by the heartbeat's
-- existing statement: no statement more per beat. The Overview combines the fresh rows (a
-- heartbeat within the last 15 seconds) through `heartbeat_time`'s index.
--
-- Additive: replicas of the previous version do not write the column (NULL: nothing said).

ALTER TABLE queue_replicas ADD COLUMN core_health jsonb;
