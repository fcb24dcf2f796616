//! PostgreSQL admission over tokio-postgres, inside the caller's transaction; and a sequence
//! as a scalar source. The SQL itself lives in `pg_sql.rs`.

use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Transaction};

use crate::error::{Backend, BackendError, FenceError, malformed_from_backend};
use crate::high_water::{Admission, HighWater};
use crate::pg_sql::{MAX_PG_RESOURCE_LEN, PgFence, check_ident, high_water_from, quoted};
use crate::token::{ScalarToken, TokenRef};

/// SQLSTATE of the admission function's malformed-input error.
const MALFORMED_SQLSTATE: &str = "FN003";

impl PgFence {
    /// Creates the table if it does not exist, and creates or replaces the functions: running
    /// it again on an existing deployment installs the current admission function.
    ///
    /// # Errors
    ///
    /// [`FenceError::Backend`].
    ///
    /// # Cancel safety
    ///
    /// The DDL runs as one implicit transaction: dropping the future leaves either all of it or
    /// none. Running it again is harmless.
    pub async fn create_schema(&self, client: &impl GenericClient) -> Result<(), FenceError> {
        client
            .batch_execute(&self.schema_sql())
            .await
            .map_err(from_pg)?;
        Ok(())
    }

    /// Checks `token` against `resource`'s high water and advances it, inside `tx`. Do the
    /// protected write in the same transaction, after this call; commit both together.
    ///
    /// ```no_run
    /// # async fn demo(client: &mut tokio_postgres::Client, token: &fencing::FenceToken)
    /// # -> Result<(), Box<dyn std::error::Error>> {
    /// let fence = fencing::PgFence::new();
    /// fence.create_schema(&*client).await?; // once, at deployment
    /// let tx = client.transaction().await?;
    /// fence.admit(&tx, "orders:42", token).await?; // Err(Stale) → drop tx, nothing is written
    /// tx.execute("UPDATE orders SET state = 'paid' WHERE id = 42", &[]).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`FenceError::Stale`] / [`FenceError::Unrelated`] when rejected: nothing was changed,
    /// the transaction is still usable, and the caller should roll it back.
    /// [`FenceError::InvalidResource`] for a resource name with a NUL byte or longer than
    /// [`MAX_PG_RESOURCE_LEN`] bytes (nothing is sent),
    /// [`FenceError::StampOutOfRange`], [`FenceError::Backend`] (the transaction is then
    /// aborted), [`FenceError::UnexpectedReply`] on schema drift. (A token from this crate is
    /// always well-formed; should the function still reject it as malformed, the error is the
    /// typed one of [`FenceError::is_malformed`] and the transaction is aborted.)
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the transaction in an unknown state; drop the transaction
    /// too (tokio-postgres rolls it back).
    pub async fn admit<'a>(
        &self,
        tx: &Transaction<'_>,
        resource: &str,
        token: impl Into<TokenRef<'a>>,
    ) -> Result<Admission, FenceError> {
        let token = token.into();
        check_resource(resource)?;
        let (nodes, stamps) = Self::admit_params(token)?;
        let row = tx
            .query_typed_one(
                self.admit_sql(),
                &[
                    (&resource, Type::TEXT),
                    (&nodes, Type::TEXT_ARRAY),
                    (&stamps, Type::INT8_ARRAY),
                ],
            )
            .await
            .map_err(from_pg)?;
        self.admission_from_row(
            token,
            row.try_get(0).map_err(from_pg)?,
            row.try_get(1).map_err(from_pg)?,
            row.try_get(2).map_err(from_pg)?,
        )
    }

    /// `resource`'s high water as committed (or as seen by `client`'s transaction).
    ///
    /// # Errors
    ///
    /// [`FenceError::InvalidResource`] for a resource name with a NUL byte or longer than
    /// [`MAX_PG_RESOURCE_LEN`] bytes, [`FenceError::Backend`], [`FenceError::UnexpectedReply`]
    /// on schema drift.
    ///
    /// # Cancel safety
    ///
    /// Safe: a read.
    pub async fn high_water(
        &self,
        client: &impl GenericClient,
        resource: &str,
    ) -> Result<HighWater, FenceError> {
        check_resource(resource)?;
        let sql = format!(
            "SELECT nodes, stamps FROM {} WHERE resource = $1",
            quoted(self.table(), "")
        );
        match client
            .query_typed_opt(&sql, &[(&resource, Type::TEXT)])
            .await
            .map_err(from_pg)?
        {
            None => Ok(HighWater::new()),
            Some(row) => high_water_from(
                row.try_get(0).map_err(from_pg)?,
                row.try_get(1).map_err(from_pg)?,
            ),
        }
    }
}

/// Refuses a resource name the high-water table cannot hold before it is sent: for a NUL byte
/// (text cannot hold one) the server would answer with an encoding error, and for a name longer
/// than [`MAX_PG_RESOURCE_LEN`] the row's insert could fail at the primary-key index; either
/// says nothing typed and aborts the caller's transaction.
fn check_resource(resource: &str) -> Result<(), FenceError> {
    if resource.contains('\0') {
        return Err(FenceError::InvalidResource {
            reason: "a PostgreSQL resource name cannot contain a NUL byte",
        });
    }
    if resource.len() > MAX_PG_RESOURCE_LEN {
        return Err(FenceError::InvalidResource {
            reason: "a PostgreSQL resource name is at most MAX_PG_RESOURCE_LEN bytes",
        });
    }
    Ok(())
}

/// A PostgreSQL error as a [`FenceError`]: [`FenceError::Backend`], except for the admission
/// function's malformed-input error (SQLSTATE `FN003`), which becomes the variant of the same
/// defect ([`FenceError::is_malformed`]).
pub(crate) fn from_pg(err: tokio_postgres::Error) -> FenceError {
    match err.as_db_error() {
        Some(db) if db.code().code() == MALFORMED_SQLSTATE => malformed_from_backend(db.message()),
        _ => FenceError::Backend(BackendError::new(Backend::Postgres, err)),
    }
}

/// An authoritative monotonic source of [`ScalarToken`]s: a PostgreSQL sequence.
///
/// `nextval` never hands one value to two callers and never goes back (unless an operator
/// resets the sequence), which is all a scalar token needs. Values skipped by rolled-back
/// transactions are harmless. That holds across sessions only for a sequence with `CACHE 1`
/// (the default), `NO CYCLE` and a positive increment: with a cache, each session draws from
/// its own block of values, so a value drawn later on one connection can be below one drawn
/// earlier on another, and a stale holder would be admitted. [`next`](Self::next) checks the
/// sequence's settings on every draw and refuses any other sequence.
///
/// A value orders lock holders only if it was drawn while the lock was held: draw it after
/// acquiring, then check that the lock is still valid (`Lock::is_valid` in `redlock`) after
/// [`next`](Self::next) returned, and write only if it is. A holder that paused past its
/// lock's validity before drawing gets a value above the next holder's, and is admitted after
/// it.
#[derive(Debug, Clone)]
pub struct PgSequence {
    name: String,
    next_sql: String,
}

impl PgSequence {
    /// A sequence called `name` (`name` or `schema.name`, lower-case letters, digits, `_`).
    /// Name the schema: an unqualified name is looked up through the caller's search path, so
    /// a session with a temporary sequence of the same name would draw from that one.
    ///
    /// # Errors
    ///
    /// [`FenceError::InvalidConfig`] for any other name, and for a temporary schema
    /// (`pg_temp`, `pg_temp_<n>`), whose sequence every session would have its own of.
    pub fn new(name: &str) -> Result<Self, FenceError> {
        check_ident(name)?;
        Ok(Self {
            name: name.to_owned(),
            // The sequence's settings come back with the value, in the same round trip: a
            // sequence altered after `create` (or made by someone else) is checked on every draw.
            next_sql: format!(
                "SELECT nextval(s.seqrelid), s.seqcache, s.seqcycle, s.seqincrement \
                 FROM pg_catalog.pg_sequence s WHERE s.seqrelid = '{}'::regclass",
                quoted(name, "")
            ),
        })
    }

    /// Creates the sequence if it does not exist.
    ///
    /// # Errors
    ///
    /// [`FenceError::Backend`].
    ///
    /// # Cancel safety
    ///
    /// Idempotent: run it again.
    pub async fn create(&self, client: &impl GenericClient) -> Result<(), FenceError> {
        client
            .batch_execute(&format!(
                "CREATE SEQUENCE IF NOT EXISTS {}",
                quoted(&self.name, "")
            ))
            .await
            .map_err(from_pg)?;
        Ok(())
    }

    /// The next token.
    ///
    /// # Errors
    ///
    /// [`FenceError::InvalidConfig`] for a sequence that can hand out values out of order
    /// (a `CACHE` above 1, `CYCLE`, or an increment that is not positive; the value drawn is
    /// not handed out), [`FenceError::Backend`] otherwise.
    ///
    /// # Cancel safety
    ///
    /// A dropped call may consume a value nobody sees; harmless.
    pub async fn next(&self, client: &impl GenericClient) -> Result<ScalarToken, FenceError> {
        let row = client
            .query_typed_one(&self.next_sql, &[])
            .await
            .map_err(from_pg)?;
        let v: i64 = row.try_get(0).map_err(from_pg)?;
        let cache: i64 = row.try_get(1).map_err(from_pg)?;
        let cycle: bool = row.try_get(2).map_err(from_pg)?;
        let increment: i64 = row.try_get(3).map_err(from_pg)?;
        if cache != 1 || cycle || increment <= 0 {
            return Err(FenceError::InvalidConfig {
                reason: format!(
                    "sequence {} can hand out values out of order (CACHE {cache}, {}, \
                     INCREMENT BY {increment}); scalar tokens need CACHE 1, NO CYCLE and a \
                     positive increment",
                    self.name,
                    if cycle { "CYCLE" } else { "NO CYCLE" },
                ),
            });
        }
        u64::try_from(v)
            .map(ScalarToken)
            .map_err(|_| FenceError::UnexpectedReply {
                reason: format!("sequence {} returned a negative value", self.name),
            })
    }
}
