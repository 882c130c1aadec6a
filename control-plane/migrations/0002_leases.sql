-- Several lap-server replicas over one database (SPEC §3.1): a lease is a named claim held by one
-- replica until expires_at (epoch ms), taken and renewed with one compare-and-set upsert.
-- `reconciler`: which replica runs reconcile passes; `bringup:<session id>`: which replica is
-- bringing that session up (so another replica does not fail it as abandoned).
CREATE TABLE leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at BIGINT NOT NULL
);
