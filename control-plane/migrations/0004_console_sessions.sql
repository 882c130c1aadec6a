-- Web console sign-ins (docs/console.md): one row per signed-in browser. `id_hash` is the SHA-256
-- (hex) of the random value in the browser's cookie, which itself is never stored. A sign-in ends
-- idle_ms after last_seen_at or max_ms after created_at (the server's constants), or at sign-out.
-- In the database, not in memory, so every replica knows every sign-in.
CREATE TABLE console_sessions (
    id_hash TEXT PRIMARY KEY,
    created_at BIGINT NOT NULL,
    last_seen_at BIGINT NOT NULL
);
