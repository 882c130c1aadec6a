//! Storage: one code path for SQLite and Postgres through sqlx's `Any` driver.
//!
//! Only portable SQL: `TEXT`/`BIGINT` columns, `$n` placeholders (sqlx's SQLite driver accepts
//! them too), times as epoch milliseconds. Migrations live in `control-plane/migrations/` and are
//! embedded; they run at start under sqlx's migration lock (a Postgres advisory lock), so several
//! replicas may start at once. Secret values arrive here already encrypted.

use std::borrow::Cow;
use std::path::Path;
use std::str::FromStr;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions, AnyRow};
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{AnyPool, Row};

use crate::model::{Session, Status};

/// A storage failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("unique constraint violated")]
    Conflict,
    #[error("stored row is corrupt: {0}")]
    Corrupt(String),
}

fn map_unique(e: sqlx::Error) -> StoreError {
    if let sqlx::Error::Database(db) = &e {
        if db.is_unique_violation() {
            return StoreError::Conflict;
        }
    }
    StoreError::Db(e)
}

/// The embedded migrations.
fn migrator() -> Migrator {
    let migrations = vec![
        Migration::new(
            1,
            Cow::Borrowed("init"),
            MigrationType::Simple,
            Cow::Borrowed(include_str!("../migrations/0001_init.sql")),
            false,
        ),
        Migration::new(
            2,
            Cow::Borrowed("leases"),
            MigrationType::Simple,
            Cow::Borrowed(include_str!("../migrations/0002_leases.sql")),
            false,
        ),
        Migration::new(
            3,
            Cow::Borrowed("sandbox isolation"),
            MigrationType::Simple,
            Cow::Borrowed(include_str!("../migrations/0003_sandbox_isolation.sql")),
            false,
        ),
        Migration::new(
            4,
            Cow::Borrowed("console sessions"),
            MigrationType::Simple,
            Cow::Borrowed(include_str!("../migrations/0004_console_sessions.sql")),
            false,
        ),
        Migration::new(
            5,
            Cow::Borrowed("audit"),
            MigrationType::Simple,
            Cow::Borrowed(include_str!("../migrations/0005_audit.sql")),
            false,
        ),
    ];
    Migrator {
        migrations: Cow::Owned(migrations),
        ..Migrator::DEFAULT
    }
}

/// One stored audit event (`audit_events`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRow {
    pub id: String,
    /// Epoch ms.
    pub time: i64,
    pub kind: String,
    pub actor: String,
    pub session_id: Option<String>,
    pub agent_id: Option<String>,
    /// `,A,B,`: the secret names involved.
    pub secrets: String,
    /// JSON: the sidecar's event for an interception; what changed for an admin action.
    pub detail: String,
}

/// `GET /api/v1/audit` filters; `kind` matches exactly or as a prefix (`agent` → `agent.*`).
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub session_id: Option<String>,
    pub agent_id: Option<String>,
    pub secret: Option<String>,
    pub kind: Option<String>,
}

/// An agent row: spec JSON and encrypted env vars, as stored.
#[derive(Debug, Clone)]
pub struct AgentRow {
    pub id: String,
    pub name: String,
    pub spec: String,
    pub env_vars_enc: String,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A registry secret row, value encrypted.
#[derive(Debug, Clone)]
pub struct SecretRow {
    pub name: String,
    pub value_enc: String,
    pub hosts: String,
    pub locations: String,
    pub created_at: i64,
    pub updated_at: i64,
}

/// The database.
#[derive(Debug, Clone)]
pub struct Store {
    pool: AnyPool,
}

/// The default SQLite URL for a data directory.
pub fn sqlite_url(data_dir: &Path) -> String {
    format!("sqlite://{}?mode=rwc", data_dir.join("lap.db").display())
}

impl Store {
    /// Connect and run migrations.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        sqlx::any::install_default_drivers();
        let opts = AnyConnectOptions::from_str(url)?;
        let is_sqlite = url.starts_with("sqlite:");
        let pool = AnyPoolOptions::new()
            .max_connections(if is_sqlite { 1 } else { 10 })
            .connect_with(opts)
            .await?;
        migrator().run(&pool).await?;
        Ok(Self { pool })
    }

    // ---- agents ----

    pub async fn insert_agent(&self, row: &AgentRow) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO agents (id, name, spec, env_vars_enc, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&row.id)
        .bind(&row.name)
        .bind(&row.spec)
        .bind(&row.env_vars_enc)
        .bind(row.created_at)
        .bind(row.updated_at)
        .execute(&self.pool)
        .await
        .map_err(map_unique)?;
        Ok(())
    }

    pub async fn update_agent(&self, row: &AgentRow) -> Result<bool, StoreError> {
        let r = sqlx::query("UPDATE agents SET name = $2, spec = $3, env_vars_enc = $4, updated_at = $5 WHERE id = $1")
            .bind(&row.id)
            .bind(&row.name)
            .bind(&row.spec)
            .bind(&row.env_vars_enc)
            .bind(row.updated_at)
            .execute(&self.pool)
            .await
            .map_err(map_unique)?;
        Ok(r.rows_affected() > 0)
    }

    pub async fn get_agent(&self, id: &str) -> Result<Option<AgentRow>, StoreError> {
        let row = sqlx::query("SELECT id, name, spec, env_vars_enc, created_at, updated_at FROM agents WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| agent_row(&r)).transpose()
    }

    pub async fn list_agents(&self, limit: i64, offset: i64) -> Result<(Vec<AgentRow>, i64), StoreError> {
        let rows = sqlx::query(
            "SELECT id, name, spec, env_vars_enc, created_at, updated_at FROM agents \
             ORDER BY created_at, id LIMIT $1 OFFSET $2",
        )
        .bind(limit)
        .bind(offset)
        .fetch_all(&self.pool)
        .await?;
        let total: i64 = sqlx::query("SELECT COUNT(*) FROM agents")
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?;
        Ok((rows.iter().map(agent_row).collect::<Result<_, _>>()?, total))
    }

    pub async fn delete_agent(&self, id: &str) -> Result<bool, StoreError> {
        let r = sqlx::query("DELETE FROM agents WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected() > 0)
    }

    // ---- secrets registry ----

    /// Insert, or with `replace` overwrite, a registry secret. Returns false on a duplicate
    /// insert.
    pub async fn put_secret(&self, row: &SecretRow, replace: bool) -> Result<(), StoreError> {
        if replace {
            let r = sqlx::query(
                "UPDATE secrets SET value_enc = $2, hosts = $3, locations = $4, updated_at = $5 WHERE name = $1",
            )
            .bind(&row.name)
            .bind(&row.value_enc)
            .bind(&row.hosts)
            .bind(&row.locations)
            .bind(row.updated_at)
            .execute(&self.pool)
            .await?;
            if r.rows_affected() > 0 {
                return Ok(());
            }
        }
        sqlx::query(
            "INSERT INTO secrets (name, value_enc, hosts, locations, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&row.name)
        .bind(&row.value_enc)
        .bind(&row.hosts)
        .bind(&row.locations)
        .bind(row.created_at)
        .bind(row.updated_at)
        .execute(&self.pool)
        .await
        .map_err(map_unique)?;
        Ok(())
    }

    pub async fn get_secret(&self, name: &str) -> Result<Option<SecretRow>, StoreError> {
        let row = sqlx::query(
            "SELECT name, value_enc, hosts, locations, created_at, updated_at FROM secrets WHERE name = $1",
        )
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| secret_row(&r)).transpose()
    }

    pub async fn list_secrets(&self, limit: i64, offset: i64) -> Result<(Vec<SecretRow>, i64), StoreError> {
        let rows = sqlx::query(
            "SELECT name, value_enc, hosts, locations, created_at, updated_at FROM secrets \
             ORDER BY name LIMIT $1 OFFSET $2",
        )
        .bind(limit)
        .bind(offset)
        .fetch_all(&self.pool)
        .await?;
        let total: i64 = sqlx::query("SELECT COUNT(*) FROM secrets")
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?;
        Ok((rows.iter().map(secret_row).collect::<Result<_, _>>()?, total))
    }

    pub async fn delete_secret(&self, name: &str) -> Result<bool, StoreError> {
        let r = sqlx::query("DELETE FROM secrets WHERE name = $1")
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected() > 0)
    }

    // ---- sessions ----

    pub async fn insert_session(&self, s: &Session) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO sessions (id, agent_id, title, status, phase, failure_reason, tty_token, sandbox_enc, \
             created_at, last_seen_at, stopped_at, idle_timeout_ms, isolation) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
        )
        .bind(&s.id)
        .bind(&s.agent_id)
        .bind(s.title.clone())
        .bind(s.status.as_str())
        .bind(&s.phase)
        .bind(s.failure_reason.clone())
        .bind(&s.tty_token_hash)
        .bind(s.sandbox.clone())
        .bind(s.created_at)
        .bind(s.last_seen_at)
        .bind(s.stopped_at)
        .bind(s.idle_timeout_ms)
        .bind(s.isolation.clone())
        .execute(&self.pool)
        .await
        .map_err(map_unique)?;
        Ok(())
    }

    pub async fn get_session(&self, id: &str) -> Result<Option<Session>, StoreError> {
        let row = sqlx::query(&format!("{SESSION_COLUMNS} WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| session_row(&r)).transpose()
    }

    pub async fn list_sessions(
        &self,
        agent_id: Option<&str>,
        limit: i64,
        offset: i64,
    ) -> Result<(Vec<Session>, i64), StoreError> {
        let (rows, total) = match agent_id {
            Some(a) => {
                let rows = sqlx::query(&format!(
                    "{SESSION_COLUMNS} WHERE agent_id = $1 ORDER BY created_at, id LIMIT $2 OFFSET $3"
                ))
                .bind(a)
                .bind(limit)
                .bind(offset)
                .fetch_all(&self.pool)
                .await?;
                let total: i64 = sqlx::query("SELECT COUNT(*) FROM sessions WHERE agent_id = $1")
                    .bind(a)
                    .fetch_one(&self.pool)
                    .await?
                    .try_get(0)?;
                (rows, total)
            }
            None => {
                let rows = sqlx::query(&format!("{SESSION_COLUMNS} ORDER BY created_at, id LIMIT $1 OFFSET $2"))
                    .bind(limit)
                    .bind(offset)
                    .fetch_all(&self.pool)
                    .await?;
                let total: i64 = sqlx::query("SELECT COUNT(*) FROM sessions")
                    .fetch_one(&self.pool)
                    .await?
                    .try_get(0)?;
                (rows, total)
            }
        };
        Ok((rows.iter().map(session_row).collect::<Result<_, _>>()?, total))
    }

    /// Sessions in one of these statuses (for the reconciler and rotation).
    pub async fn sessions_with_status(&self, statuses: &[Status]) -> Result<Vec<Session>, StoreError> {
        let mut out = Vec::new();
        for s in statuses {
            let rows = sqlx::query(&format!("{SESSION_COLUMNS} WHERE status = $1"))
                .bind(s.as_str())
                .fetch_all(&self.pool)
                .await?;
            for r in &rows {
                out.push(session_row(r)?);
            }
        }
        Ok(out)
    }

    /// Compare-and-set a session's status: only if it is currently `from`. Returns whether this
    /// caller won (the claim that makes reconciling safe across replicas).
    pub async fn transition(
        &self,
        id: &str,
        from: Status,
        to: Status,
        failure_reason: Option<&str>,
        sandbox_enc: Option<&str>,
    ) -> Result<bool, StoreError> {
        let now = crate::model::now_ms();
        let stopped_at = to.is_terminal().then_some(now);
        let r = sqlx::query(
            "UPDATE sessions SET status = $3, phase = $4, \
             failure_reason = COALESCE($5, failure_reason), sandbox_enc = COALESCE($6, sandbox_enc), \
             stopped_at = COALESCE($7, stopped_at), last_seen_at = $8 WHERE id = $1 AND status = $2",
        )
        .bind(id)
        .bind(from.as_str())
        .bind(to.as_str())
        .bind(to.as_str())
        .bind(failure_reason.map(str::to_owned))
        .bind(sandbox_enc.map(str::to_owned))
        .bind(stopped_at)
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() > 0)
    }

    /// Record the sandbox handle of a session still `creating`.
    pub async fn set_phase(&self, id: &str, phase: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE sessions SET phase = $2 WHERE id = $1 AND status = 'creating'")
            .bind(id)
            .bind(phase)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Mark activity (resets the idle timeout).
    pub async fn touch_session(&self, id: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE sessions SET last_seen_at = $2 WHERE id = $1")
            .bind(id)
            .bind(crate::model::now_ms())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// `(status, count)` for every status present.
    pub async fn count_sessions_by_status(&self) -> Result<Vec<(String, i64)>, StoreError> {
        let rows = sqlx::query("SELECT status, COUNT(*) FROM sessions GROUP BY status")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect()
    }

    // ---- leases (several replicas) ----

    /// Take or renew the lease `name` for `holder` until `now_ms + ttl_ms`: succeeds when nobody
    /// holds it, `holder` already does, or the current hold expired. One atomic upsert, so two
    /// replicas racing for a free lease cannot both win (the row's primary key decides).
    pub async fn try_lease(&self, name: &str, holder: &str, now_ms: i64, ttl_ms: i64) -> Result<bool, StoreError> {
        let r = sqlx::query(
            "INSERT INTO leases (name, holder, expires_at) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at \
             WHERE leases.holder = excluded.holder OR leases.expires_at < $4",
        )
        .bind(name)
        .bind(holder)
        .bind(now_ms.saturating_add(ttl_ms))
        .bind(now_ms)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() > 0)
    }

    /// Who holds the lease `name` at `now_ms`, if anyone.
    pub async fn lease_holder(&self, name: &str, now_ms: i64) -> Result<Option<String>, StoreError> {
        let row = sqlx::query("SELECT holder FROM leases WHERE name = $1 AND expires_at >= $2")
            .bind(name)
            .bind(now_ms)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.try_get(0)).transpose()?)
    }

    /// Give the lease up (only if `holder` holds it).
    pub async fn release_lease(&self, name: &str, holder: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM leases WHERE name = $1 AND holder = $2")
            .bind(name)
            .bind(holder)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    // ---- the durable audit ----

    /// Store `e` unless an event with its id is already stored (pulling twice stores once).
    pub async fn insert_audit(&self, e: &AuditRow) -> Result<bool, StoreError> {
        let r = sqlx::query(
            "INSERT INTO audit_events (id, time, kind, actor, session_id, agent_id, secrets, detail) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (id) DO NOTHING",
        )
        .bind(&e.id)
        .bind(e.time)
        .bind(&e.kind)
        .bind(&e.actor)
        .bind(e.session_id.clone())
        .bind(e.agent_id.clone())
        .bind(&e.secrets)
        .bind(&e.detail)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() > 0)
    }

    /// Audit events matching `f`, oldest first, and how many match in all.
    pub async fn list_audit(
        &self,
        f: &AuditFilter,
        limit: i64,
        offset: i64,
    ) -> Result<(Vec<AuditRow>, i64), StoreError> {
        // Every filter is optional: `$n IS NULL OR column = $n` keeps one statement.
        let clause = "WHERE ($1 IS NULL OR session_id = $1) AND ($2 IS NULL OR agent_id = $2) \
                      AND ($3 IS NULL OR secrets LIKE $3 ESCAPE '\\') AND ($4 IS NULL OR kind = $4 OR kind LIKE $5 ESCAPE '\\')";
        // `_` is LIKE's one-character wildcard, and names are made of letters, digits and `_`.
        let like_secret = f.secret.as_ref().map(|s| format!("%,{},%", s.replace('_', "\\_")));
        let like_kind = f.kind.as_ref().map(|k| format!("{}.%", k.replace('_', "\\_")));
        let rows = sqlx::query(&format!(
            "SELECT id, time, kind, actor, session_id, agent_id, secrets, detail FROM audit_events {clause} \
             ORDER BY time, id LIMIT $6 OFFSET $7"
        ))
        .bind(f.session_id.clone())
        .bind(f.agent_id.clone())
        .bind(like_secret.clone())
        .bind(f.kind.clone())
        .bind(like_kind.clone())
        .bind(limit)
        .bind(offset)
        .fetch_all(&self.pool)
        .await?;
        let total: i64 = sqlx::query(&format!("SELECT COUNT(*) FROM audit_events {clause}"))
            .bind(f.session_id.clone())
            .bind(f.agent_id.clone())
            .bind(like_secret)
            .bind(f.kind.clone())
            .bind(like_kind)
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?;
        let rows = rows
            .iter()
            .map(|r| {
                Ok(AuditRow {
                    id: r.try_get(0)?,
                    time: r.try_get(1)?,
                    kind: r.try_get(2)?,
                    actor: r.try_get(3)?,
                    session_id: r.try_get(4)?,
                    agent_id: r.try_get(5)?,
                    secrets: r.try_get(6)?,
                    detail: r.try_get(7)?,
                })
            })
            .collect::<Result<_, StoreError>>()?;
        Ok((rows, total))
    }

    /// Delete audit events older than `before_ms`; returns how many.
    pub async fn prune_audit(&self, before_ms: i64) -> Result<u64, StoreError> {
        let r = sqlx::query("DELETE FROM audit_events WHERE time < $1")
            .bind(before_ms)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected())
    }

    /// How far a session's interceptions have been pulled (`<run>:<seq>`).
    pub async fn audit_cursor(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        let row = sqlx::query("SELECT audit_cursor FROM sessions WHERE id = $1")
            .bind(session_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.try_get(0)).transpose()?.flatten())
    }

    pub async fn set_audit_cursor(&self, session_id: &str, cursor: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE sessions SET audit_cursor = $2 WHERE id = $1")
            .bind(session_id)
            .bind(cursor)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn prune_leases(&self, before_ms: i64) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM leases WHERE expires_at < $1")
            .bind(before_ms)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    // ---- web console sign-ins (keyed by the hash of the cookie value) ----

    pub async fn insert_console_session(&self, id_hash: &str, now_ms: i64) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO console_sessions (id_hash, created_at, last_seen_at) VALUES ($1, $2, $2)")
            .bind(id_hash)
            .bind(now_ms)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// `(created_at, last_seen_at)` of a sign-in.
    pub async fn get_console_session(&self, id_hash: &str) -> Result<Option<(i64, i64)>, StoreError> {
        let row = sqlx::query("SELECT created_at, last_seen_at FROM console_sessions WHERE id_hash = $1")
            .bind(id_hash)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).transpose()
    }

    pub async fn touch_console_session(&self, id_hash: &str, now_ms: i64) -> Result<(), StoreError> {
        sqlx::query("UPDATE console_sessions SET last_seen_at = $2 WHERE id_hash = $1")
            .bind(id_hash)
            .bind(now_ms)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn delete_console_session(&self, id_hash: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM console_sessions WHERE id_hash = $1")
            .bind(id_hash)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Forget sign-ins last seen before `seen_before_ms` or created before `created_before_ms`.
    pub async fn prune_console_sessions(&self, seen_before_ms: i64, created_before_ms: i64) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM console_sessions WHERE last_seen_at < $1 OR created_at < $2")
            .bind(seen_before_ms)
            .bind(created_before_ms)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Whether the database answers.
    /// Rows written before tokens were hashed hold a token in clear: replace each with the
    /// hash of `token_of(session id)` (the derived token). Returns how many were rewritten.
    pub async fn hash_clear_tty_tokens(&self, token_of: impl Fn(&str) -> String) -> Result<u64, StoreError> {
        let rows = sqlx::query("SELECT id FROM sessions WHERE tty_token NOT LIKE 'sha256:%'")
            .fetch_all(&self.pool)
            .await?;
        let mut n = 0;
        for r in rows {
            let id: String = r.try_get(0)?;
            let hash = crate::crypto::token_hash(&token_of(&id));
            n += sqlx::query("UPDATE sessions SET tty_token = $1 WHERE id = $2")
                .bind(hash)
                .bind(&id)
                .execute(&self.pool)
                .await?
                .rows_affected();
        }
        Ok(n)
    }

    pub async fn ping(&self) -> bool {
        sqlx::query("SELECT 1").fetch_one(&self.pool).await.is_ok()
    }
}

const SESSION_COLUMNS: &str = "SELECT id, agent_id, title, status, phase, failure_reason, tty_token, sandbox_enc, \
                               created_at, last_seen_at, stopped_at, idle_timeout_ms, isolation FROM sessions";

fn agent_row(r: &AnyRow) -> Result<AgentRow, StoreError> {
    Ok(AgentRow {
        id: r.try_get(0)?,
        name: r.try_get(1)?,
        spec: r.try_get(2)?,
        env_vars_enc: r.try_get(3)?,
        created_at: r.try_get(4)?,
        updated_at: r.try_get(5)?,
    })
}

fn secret_row(r: &AnyRow) -> Result<SecretRow, StoreError> {
    Ok(SecretRow {
        name: r.try_get(0)?,
        value_enc: r.try_get(1)?,
        hosts: r.try_get(2)?,
        locations: r.try_get(3)?,
        created_at: r.try_get(4)?,
        updated_at: r.try_get(5)?,
    })
}

fn session_row(r: &AnyRow) -> Result<Session, StoreError> {
    let status: String = r.try_get(3)?;
    Ok(Session {
        id: r.try_get(0)?,
        agent_id: r.try_get(1)?,
        title: r.try_get(2)?,
        status: Status::parse(&status).ok_or_else(|| StoreError::Corrupt(format!("status `{status}`")))?,
        phase: r.try_get(4)?,
        failure_reason: r.try_get(5)?,
        tty_token_hash: r.try_get(6)?,
        sandbox: r.try_get(7)?,
        created_at: r.try_get(8)?,
        last_seen_at: r.try_get(9)?,
        stopped_at: r.try_get(10)?,
        idle_timeout_ms: r.try_get(11)?,
        isolation: r.try_get(12)?,
    })
}
