-- One live reservation per admit key: concurrent repeats of one admit make one run at the core.
--
-- Eight concurrent admits with one idempotency key each reserved a run and each sent CreateRun
-- with the full sources (up to 1 MiB); the locked admit kept one job and the others' runs were
-- created only to be canceled. A reservation now carries its admit's key, and at most one
-- reservation per (user, key) is live (not being canceled): the admit whose reservation stands is
-- the only one that calls the core, and a repeat that finds the key reserved waits for that
-- admit's outcome (its job, or its reservation dropped or claimed for a cancel, which frees the key)
-- by reading again within its own deadline (engine/admission.py). A claimed reservation leaves the
-- index, so an admit that failed, or whose replica died and the sweeper claimed, never holds the
-- key while its run is canceled.
--
-- Additive: replicas of the previous version reserve without a key (NULL, never in conflict) and
-- keep sending their own CreateRun, as before.

ALTER TABLE run_reservations ADD COLUMN idempotency_key text;

CREATE UNIQUE INDEX run_reservations_one_live_per_key
    ON run_reservations (user_id, idempotency_key)
    WHERE NOT canceling;
