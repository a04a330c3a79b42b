-- A failed admit's run, once the core confirms it settled, is remembered for a while instead of
-- forgotten at once: the core may still report it (a delta judged at once and finished before the
-- cancel reached it, its CompleteRun retried later). A run no job and no live reservation owns is
-- otherwise taken for a job lost in a failover and adopted, which would leave a charged job behind
-- an Admit that answered an error (I5). The sweeper forgets such runs after a day.
ALTER TABLE run_reservations ADD COLUMN settled_at timestamptz;
CREATE INDEX run_reservations_settled ON run_reservations (settled_at) WHERE settled_at IS NOT NULL;
