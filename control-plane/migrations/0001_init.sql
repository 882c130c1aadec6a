-- Portable across SQLite and Postgres: TEXT and BIGINT only; times are Unix epoch milliseconds;
-- JSON is TEXT; encrypted values are base64 TEXT (AES-256-GCM).
CREATE TABLE agents (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    spec TEXT NOT NULL,
    env_vars_enc TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE TABLE secrets (
    name TEXT PRIMARY KEY,
    value_enc TEXT NOT NULL,
    hosts TEXT NOT NULL,
    locations TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL,
    title TEXT,
    status TEXT NOT NULL,
    phase TEXT NOT NULL,
    failure_reason TEXT,
    tty_token TEXT NOT NULL,
    sandbox_enc TEXT,
    created_at BIGINT NOT NULL,
    last_seen_at BIGINT NOT NULL,
    stopped_at BIGINT,
    idle_timeout_ms BIGINT NOT NULL
);

CREATE INDEX sessions_agent_id ON sessions (agent_id);
CREATE INDEX sessions_status ON sessions (status);
