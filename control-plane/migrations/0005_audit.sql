-- The durable audit (issue 15): the vault sidecars' interception events, pulled while each session
-- runs, and the platform's admin actions, kept for LAP_AUDIT_RETENTION.
-- `id`: `<session>:<sidecar run>:<seq>` for an interception (so pulling twice stores it once),
-- a random `aud_…` for an admin action. `kind`: `interception` or `<resource>.<verb>`
-- (`agent.create`, `session.attach`, …). `secrets`: the secret names involved, as `,A,B,`.
CREATE TABLE audit_events (
    id TEXT PRIMARY KEY,
    time BIGINT NOT NULL,
    kind TEXT NOT NULL,
    actor TEXT NOT NULL,
    session_id TEXT,
    agent_id TEXT,
    secrets TEXT NOT NULL,
    detail TEXT NOT NULL
);

CREATE INDEX audit_events_time ON audit_events (time);
CREATE INDEX audit_events_session ON audit_events (session_id);

-- How far each session's interceptions have been pulled: `<sidecar run>:<seq>`.
ALTER TABLE sessions ADD COLUMN audit_cursor TEXT;
