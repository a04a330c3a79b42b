-- Indexes for the operator RPCs (OperatorService) on a long history: the job search walks
-- newest admitted first by (create_time, job_id), across users, within one status or within
-- one user; the overview counts recently ended jobs and recent admits by time. Each serves a
-- bounded range of the index, so the cost follows the page or the window, not the table.

CREATE INDEX analysis_jobs_newest_admitted
    ON analysis_jobs (create_time DESC, job_id DESC);

CREATE INDEX analysis_jobs_status_newest_admitted
    ON analysis_jobs (status, create_time DESC, job_id DESC);

CREATE INDEX analysis_jobs_user_newest_admitted
    ON analysis_jobs (user_id, create_time DESC, job_id DESC);

CREATE INDEX analysis_jobs_recently_ended
    ON analysis_jobs (end_time DESC)
    WHERE end_time IS NOT NULL;
