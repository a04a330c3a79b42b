-- QUEUE_MAX_ACTIVE_DELTAS_PER_USER: admit counts a user's running deltas under the user lock.
CREATE INDEX analysis_jobs_running_deltas
    ON analysis_jobs (user_id)
    WHERE status = 'running' AND delta_of_job_id IS NOT NULL;
