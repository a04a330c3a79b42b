-- Carries functions/queue_end_run_viewed.sql's change (no table changes): a CompleteRun for the
-- run of a PENDING job waiting for the fleet's capacity ends nothing, as for a QUEUED job (the run
-- was never released since the job began to wait). Shipped with this migration so that replicas
-- of the previous version, should they migrate on start during the deploy, meet a migration they
-- do not know and leave the newer text alone. Additive for them: their completions of such a run
-- find the job not active and answer it unchanged.
SELECT 1;
