//! The SQL side of PostgreSQL admission: the schema, the admission statement, its parameters
//! and the meaning of its row. Needs no database client, so any client can run it; the
//! `postgres` feature adds the tokio-postgres calls (`pg.rs`).

use crate::error::FenceError;
use crate::high_water::{Admission, HighWater};
use crate::token::{MAX_CLAIMS, MAX_NODE_NAME_LEN, TokenRef};

// The admission function spells these caps out.
const _: () = assert!(MAX_CLAIMS == 32 && MAX_NODE_NAME_LEN == 128);

/// Default table of [`PgFence`]; its admission function is `public.fencing_high_water_admit`.
/// Schema-qualified, so that every session uses the same table and functions whatever its
/// search path (see [`PgFence::with_table`]).
pub const DEFAULT_PG_TABLE: &str = "public.fencing_high_water";

/// Longest resource name [`PgFence`] accepts, in bytes. The resource is the high-water table's
/// primary key, and a btree index entry holds at most about 2.7 kB (a third of a page, after
/// compression): a longer, incompressible name failed the row's insert at every admission, so
/// the resource could never admit a token. A fixed cap below that makes the refusal a typed
/// error that does not depend on how well the name compresses.
pub const MAX_PG_RESOURCE_LEN: usize = 2048;

/// Admission kept in PostgreSQL, for resources stored in the same database.
///
/// The admission runs inside the caller's transaction: the check, the advance and the caller's
/// business write commit or roll back together, so a write is never applied without its
/// admission, nor an admission recorded for a write that rolled back.
///
/// One row per resource (`resource`, `nodes text[]`, `stamps bigint[]`) is locked with
/// `SELECT … FOR UPDATE` by the admission function, so concurrent admissions on one resource
/// serialise and each sees the high water its predecessor committed; different resources do
/// not contend. The row lock is held until the caller's transaction ends: keep fenced
/// transactions short.
///
/// Under `REPEATABLE READ` or `SERIALIZABLE` a concurrent admission on the same resource makes
/// the later transaction fail with a serialization error (SQLSTATE 40001); retry it as usual.
///
/// With the `postgres` feature, `create_schema`, `admit` and `high_water` run it over
/// tokio-postgres. Any other client (sqlx, diesel, a connection pool of your own) runs the same
/// admission without that feature: install [`schema_sql`](Self::schema_sql) with your
/// migrations, then in your transaction run [`admit_sql`](Self::admit_sql) with
/// [`admit_params`](Self::admit_params) and hand the row to
/// [`admission_from_row`](Self::admission_from_row), which decides exactly as `admit` does.
/// With sqlx:
///
/// ```ignore
/// let fence = fencing::PgFence::new();
/// let (nodes, stamps) = fencing::PgFence::admit_params(&token)?;
/// let mut tx = pool.begin().await?;
/// let (verdict, hw_nodes, hw_stamps): (i16, Vec<String>, Vec<i64>) =
///     sqlx::query_as(fence.admit_sql())
///         .bind("orders:42")
///         .bind(&nodes)
///         .bind(&stamps)
///         .fetch_one(&mut *tx)
///         .await?;
/// // Err(Stale) / Err(Unrelated): roll back, nothing is written.
/// fence.admission_from_row(&token, verdict, hw_nodes, hw_stamps)?;
/// sqlx::query("UPDATE orders SET state = 'paid' WHERE id = 42").execute(&mut *tx).await?;
/// tx.commit().await?;
/// ```
///
/// A database error with SQLSTATE `FN003` from that statement means malformed lists, which a
/// token of this crate never is. Keep resource names within [`MAX_PG_RESOURCE_LEN`] bytes
/// (`admit` and `high_water` refuse longer ones before sending anything).
#[derive(Debug, Clone)]
pub struct PgFence {
    table: String,
    admit_sql: String,
}

impl Default for PgFence {
    fn default() -> Self {
        Self::new()
    }
}

impl PgFence {
    /// A fence on [`DEFAULT_PG_TABLE`] (`public.fencing_high_water`).
    pub fn new() -> Self {
        Self::build(DEFAULT_PG_TABLE.to_owned())
    }

    /// A fence on `table` (`name` or `schema.name`, lower-case letters, digits and `_`,
    /// at most 48 bytes per part, so that the function name `<table>_admit` is a valid
    /// identifier).
    ///
    /// Name the schema. An unqualified name is looked up through each session's search path
    /// when `create_schema` runs and at every admission: sessions with different search paths
    /// (or a schema named after the role that appears later, with the default path
    /// `"$user", public`) would use different tables, and admit a stale token.
    ///
    /// # Errors
    ///
    /// [`FenceError::InvalidConfig`] for any other name (names are spliced into SQL), and for
    /// a temporary schema (`pg_temp`, `pg_temp_<n>`), which would give every session a table
    /// of its own.
    pub fn with_table(table: &str) -> Result<Self, FenceError> {
        check_ident(table)?;
        Ok(Self::build(table.to_owned()))
    }

    fn build(table: String) -> Self {
        let admit_sql = format!(
            "SELECT verdict, hw_nodes, hw_stamps FROM {}($1, $2, $3)",
            quoted(&table, "_admit")
        );
        Self { table, admit_sql }
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The DDL that `create_schema` (feature `postgres`) runs, for your migrations: the table, the admission function
    /// `<table>_admit(resource, nodes, stamps)` returning `(verdict, hw_nodes, hw_stamps)`
    /// (verdict 1 advanced, 2 repeated, -1 stale, -2 unrelated) and
    /// `<table>_admit_or_raise(resource, nodes, stamps)`, which raises SQLSTATE `FN001`
    /// (stale) or `FN002` (unrelated) instead, for fencing from plain SQL.
    ///
    /// Both raise SQLSTATE `FN003` for malformed lists, which are never admitted and change
    /// nothing: NULL lists, lists of different lengths or not one-dimensional from index 1,
    /// no claims or more than [`MAX_CLAIMS`], a NULL node name, an empty name beside other
    /// claims (the empty name alone is a scalar token), a name longer than
    /// [`MAX_NODE_NAME_LEN`] bytes, a NULL or negative stamp, a node named twice.
    pub fn schema_sql(&self) -> String {
        SCHEMA_SQL
            .replace("{table}", &quoted(&self.table, ""))
            .replace("{admit}", &quoted(&self.table, "_admit"))
            .replace("{admit_or_raise}", &quoted(&self.table, "_admit_or_raise"))
            .replace("{schema}", &schema_of(&self.table))
    }

    /// The statement of one admission, for clients other than tokio-postgres: parameters `$1`
    /// `text` (the resource), `$2` `text[]` and `$3` `bigint[]` (the token's node names and
    /// stamps, from [`admit_params`](Self::admit_params)); it returns one row
    /// `(verdict smallint, hw_nodes text[], hw_stamps bigint[])` for
    /// [`admission_from_row`](Self::admission_from_row). Run it inside the transaction that
    /// does the protected write, before that write.
    pub fn admit_sql(&self) -> &str {
        &self.admit_sql
    }

    /// The parameters `$2` (node names, `text[]`) and `$3` (stamps, `bigint[]`) of
    /// [`admit_sql`](Self::admit_sql) for `token`, in the same order.
    ///
    /// # Errors
    ///
    /// [`FenceError::StampOutOfRange`] for a scalar token above [`MAX_STAMP`](crate::MAX_STAMP).
    pub fn admit_params<'a>(
        token: impl Into<TokenRef<'a>>,
    ) -> Result<(Vec<&'a str>, Vec<i64>), FenceError> {
        let token = token.into();
        token.validate()?;
        Ok(token
            .pairs()
            // Stamps were checked against MAX_STAMP = i64::MAX.
            .map(|(n, s)| (n, s as i64))
            .unzip())
    }

    /// What the row returned by [`admit_sql`](Self::admit_sql) for `token` means: the same
    /// decision the tokio-postgres `admit` (feature `postgres`) makes, with this function.
    ///
    /// # Errors
    ///
    /// [`FenceError::Stale`] / [`FenceError::Unrelated`] when the token was rejected (nothing was
    /// changed; roll the transaction back), counted in `fencing_rejections_total` with
    /// `backend = "postgres"`; [`FenceError::UnexpectedReply`] for a verdict or high water the
    /// function never returns (schema drift).
    pub fn admission_from_row<'a>(
        &self,
        token: impl Into<TokenRef<'a>>,
        verdict: i16,
        hw_nodes: Vec<String>,
        hw_stamps: Vec<i64>,
    ) -> Result<Admission, FenceError> {
        let token = token.into();
        let admission = match verdict {
            1 => Ok(Admission::Advanced),
            2 => Ok(Admission::Repeated),
            -1 => Err(FenceError::Stale {
                offered: token.to_token(),
                high_water: high_water_from(hw_nodes, hw_stamps)?,
            }),
            -2 => Err(FenceError::Unrelated {
                offered: token.to_token(),
                high_water: high_water_from(hw_nodes, hw_stamps)?,
            }),
            other => Err(FenceError::UnexpectedReply {
                reason: format!("admission function returned verdict {other}"),
            }),
        };
        admission.inspect_err(|e| crate::telemetry::rejected("postgres", e))
    }
}

pub(crate) fn high_water_from(
    nodes: Vec<String>,
    stamps: Vec<i64>,
) -> Result<HighWater, FenceError> {
    if nodes.len() != stamps.len() || stamps.iter().any(|&s| s < 0) {
        return Err(FenceError::UnexpectedReply {
            reason: "high-water row has mismatched or negative stamps".to_owned(),
        });
    }
    Ok(HighWater::from_entries(
        nodes.into_iter().zip(stamps.into_iter().map(|s| s as u64)),
    ))
}

/// The schema the functions of `table` live in, as an SQL expression: the table's own schema
/// when it is qualified (a string literal; names are checked lower-case identifiers, see
/// [`check_ident`]), else the session's current schema, where an unqualified table is created.
fn schema_of(table: &str) -> String {
    match table.split_once('.') {
        Some((schema, _)) => format!("'{schema}'"),
        None => "current_schema()".to_owned(),
    }
}

/// A name [`check_ident`] accepted, with `suffix` added to its last part, quoted part by part
/// for SQL (`"schema"."name_suffix"`): a reserved word (`user`, `order`) is then a name like
/// any other, and quoting changes nothing else for lower-case names.
pub(crate) fn quoted(name: &str, suffix: &str) -> String {
    match name.rsplit_once('.') {
        Some((schema, last)) => format!("\"{schema}\".\"{last}{suffix}\""),
        None => format!("\"{name}{suffix}\""),
    }
}

pub(crate) fn check_ident(name: &str) -> Result<(), FenceError> {
    let valid_part = |p: &str| {
        !p.is_empty()
            && p.len() <= 48
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            && !p.as_bytes()[0].is_ascii_digit()
    };
    let parts: Vec<&str> = name.split('.').collect();
    // Each session has a temporary schema of its own: a table or sequence there is not shared.
    let temporary = |p: &str| {
        p == "pg_temp"
            || p.strip_prefix("pg_temp_")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    if parts.len() == 2 && temporary(parts[0]) {
        Err(FenceError::InvalidConfig {
            reason: format!(
                "{name:?} is in a temporary schema: every session would have its own, unshared"
            ),
        })
    } else if parts.len() <= 2 && parts.iter().all(|p| valid_part(p)) {
        Ok(())
    } else {
        Err(FenceError::InvalidConfig {
            reason: format!(
                "{name:?} is not a plain lower-case SQL identifier (optionally schema-qualified)"
            ),
        })
    }
}

/// `{table}`, `{admit}` and `{admit_or_raise}` are replaced by the quoted names of the table
/// and its two functions (see [`quoted`]).
///
/// The functions run with a search path of their own, set at the end: the schema the DDL
/// created them in (where an unqualified table was created too), then `pg_temp`. Otherwise an
/// unqualified table name is looked up through the caller's search path, where `pg_temp`
/// comes first: a session with a temporary table of the same name, or with another search
/// path, would read and advance another high water than every other session.
///
/// The function first rejects malformed lists with SQLSTATE `FN003` and a message
/// `malformed fence token: …` that [`malformed_from_backend`] maps to a typed error; its caps
/// (32 claims, 128-byte names) are [`MAX_CLAIMS`] and [`MAX_NODE_NAME_LEN`].
///
/// The high water of a resource is one row, so that `FOR UPDATE` on it serialises concurrent
/// admissions. Before the resource's first admission the `INSERT … ON CONFLICT DO NOTHING`
/// makes the row exist (a concurrent inserter waits on the unique index until the
/// first commits), then the row lock orders everyone. Under READ COMMITTED each statement of
/// the function takes a fresh snapshot, so the locked row is the latest committed version.
const SCHEMA_SQL: &str = r"
CREATE TABLE IF NOT EXISTS {table} (
    resource text PRIMARY KEY,
    nodes    text[]   NOT NULL,
    stamps   bigint[] NOT NULL,
    CHECK (cardinality(nodes) = cardinality(stamps))
);

CREATE OR REPLACE FUNCTION {admit}(p_resource text, p_nodes text[], p_stamps bigint[])
RETURNS TABLE (verdict smallint, hw_nodes text[], hw_stamps bigint[])
LANGUAGE plpgsql AS $fn$
DECLARE
    n        int;
    h_nodes  text[];
    h_stamps bigint[];
    j        int;
    shared   boolean := false;
    same     boolean := true;
BEGIN
    -- Malformed input is rejected (SQLSTATE FN003) before the row is read or created: the
    -- token caps of the Rust side, checked in the same order as the Redis script.
    IF p_nodes IS NULL OR p_stamps IS NULL
        OR cardinality(p_nodes) <> cardinality(p_stamps)
        OR (cardinality(p_nodes) > 0 AND (
            array_ndims(p_nodes) <> 1 OR array_ndims(p_stamps) <> 1
            OR array_lower(p_nodes, 1) <> 1 OR array_lower(p_stamps, 1) <> 1)) THEN
        RAISE EXCEPTION 'malformed fence token: node and stamp lists are missing, not flat, or of different lengths'
            USING ERRCODE = 'FN003';
    END IF;
    n := cardinality(p_nodes);
    IF n = 0 THEN
        RAISE EXCEPTION 'malformed fence token: no claims' USING ERRCODE = 'FN003';
    ELSIF n > 32 THEN
        RAISE EXCEPTION 'malformed fence token: more than 32 claims' USING ERRCODE = 'FN003';
    END IF;
    FOR i IN 1 .. n LOOP
        IF p_nodes[i] IS NULL THEN
            RAISE EXCEPTION 'malformed fence token: claim %: NULL node name', i
                USING ERRCODE = 'FN003';
        ELSIF p_nodes[i] = '' AND n > 1 THEN
            -- The empty name is a scalar token's, and a scalar token has one claim.
            RAISE EXCEPTION 'malformed fence token: claim %: empty node name in a token of several claims', i
                USING ERRCODE = 'FN003';
        ELSIF octet_length(p_nodes[i]) > 128 THEN
            RAISE EXCEPTION 'malformed fence token: claim %: node name longer than 128 bytes', i
                USING ERRCODE = 'FN003';
        ELSIF p_stamps[i] IS NULL OR p_stamps[i] < 0 THEN
            RAISE EXCEPTION 'malformed fence token: claim %: stamp is not an integer from 0 to 2^63 - 1', i
                USING ERRCODE = 'FN003';
        ELSIF array_position(p_nodes, p_nodes[i]) < i THEN
            RAISE EXCEPTION 'malformed fence token: claim %: node appears twice: %', i, p_nodes[i]
                USING ERRCODE = 'FN003';
        END IF;
    END LOOP;

    -- The row, locked; created first when missing. A row that is still missing after the
    -- insert (deleted by another session between the two, or an insert a trigger skipped)
    -- must not be read as an empty high water: the verdict would be Advanced with nothing
    -- recorded, and an older token admitted next. After three tries the transaction fails
    -- as a serialization failure, for the caller to retry.
    FOR attempt IN 1 .. 3 LOOP
        SELECT t.nodes, t.stamps INTO h_nodes, h_stamps
            FROM {table} t WHERE t.resource = p_resource FOR UPDATE;
        EXIT WHEN FOUND;
        IF attempt = 3 THEN
            RAISE EXCEPTION 'the high water row of % could not be created and locked (deleted meanwhile?); retry the transaction', p_resource
                USING ERRCODE = '40001';
        END IF;
        INSERT INTO {table} (resource, nodes, stamps) VALUES (p_resource, '{}', '{}')
            ON CONFLICT (resource) DO NOTHING;
    END LOOP;

    FOR i IN 1 .. n LOOP
        j := array_position(h_nodes, p_nodes[i]);
        IF j IS NULL THEN
            same := false;
        ELSE
            shared := true;
            IF p_stamps[i] < h_stamps[j] THEN
                RETURN QUERY SELECT (-1)::smallint, h_nodes, h_stamps;
                RETURN;
            ELSIF p_stamps[i] > h_stamps[j] THEN
                same := false;
            END IF;
        END IF;
    END LOOP;

    IF NOT shared AND cardinality(h_nodes) > 0 THEN
        RETURN QUERY SELECT (-2)::smallint, h_nodes, h_stamps;
        RETURN;
    END IF;
    IF same THEN
        RETURN QUERY SELECT 2::smallint, h_nodes, h_stamps;
        RETURN;
    END IF;

    -- Marks only rise: each becomes the maximum of itself and the token's stamp.
    FOR i IN 1 .. n LOOP
        j := array_position(h_nodes, p_nodes[i]);
        IF j IS NULL THEN
            h_nodes  := h_nodes  || p_nodes[i];
            h_stamps := h_stamps || p_stamps[i];
        ELSE
            h_stamps[j] := GREATEST(h_stamps[j], p_stamps[i]);
        END IF;
    END LOOP;
    UPDATE {table} SET nodes = h_nodes, stamps = h_stamps WHERE resource = p_resource;
    IF NOT FOUND THEN
        -- The row is locked, so only a trigger that skips the update gets here.
        RAISE EXCEPTION 'the high water of % was not updated; retry the transaction', p_resource
            USING ERRCODE = '40001';
    END IF;
    RETURN QUERY SELECT 1::smallint, h_nodes, h_stamps;
END
$fn$;

CREATE OR REPLACE FUNCTION {admit_or_raise}(p_resource text, p_nodes text[], p_stamps bigint[])
RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    v smallint;
BEGIN
    SELECT a.verdict INTO v FROM {admit}(p_resource, p_nodes, p_stamps) a;
    IF v = -1 THEN
        RAISE EXCEPTION 'stale fence token for %', p_resource USING ERRCODE = 'FN001';
    ELSIF v = -2 THEN
        RAISE EXCEPTION 'unrelated fence token for %', p_resource USING ERRCODE = 'FN002';
    END IF;
END
$fn$;

DO $pin$
DECLARE
    path text := concat_ws(', ', quote_ident({schema}), 'pg_temp');
BEGIN
    EXECUTE format('ALTER FUNCTION %s(text, text[], bigint[]) SET search_path = %s', '{admit}', path);
    EXECUTE format('ALTER FUNCTION %s(text, text[], bigint[]) SET search_path = %s', '{admit_or_raise}', path);
END
$pin$;
";
