//! The protected registers: in memory, in Redis, in PostgreSQL — each fenced by the matching
//! backend of the `fencing` crate, or plain when fencing is off.

use std::sync::{Arc, Mutex, PoisonError};

use fencing::{FenceError, FenceToken, MemoryFence, PgFence, RedisFence};
use futures_util::future::BoxFuture;
use redis::aio::MultiplexedConnection;
use redlock_testkit::tokio_postgres;

use crate::history::Outcome;
use crate::workload::{Register, Rmw, resource_name};

fn rejected(e: &FenceError) -> Rmw {
    let kind = if e.is_stale() {
        "Stale"
    } else if e.is_unrelated() {
        "Unrelated"
    } else {
        "FenceError"
    };
    Rmw {
        read: None,
        outcome: if e.is_rejection() {
            Outcome::Fail
        } else {
            Outcome::Unknown
        },
        error: Some(kind.to_owned()),
    }
}

/// The result of a read-modify-write whose read returned `read` and whose write ended with
/// `wrote` (the failure already classified).
fn written(read: i64, wrote: Result<(), Rmw>) -> Rmw {
    match wrote {
        Ok(()) => Rmw {
            read: Some(read),
            outcome: Outcome::Ok,
            error: None,
        },
        Err(failed) => Rmw {
            read: Some(read),
            ..failed
        },
    }
}

/// Registers in this process, fenced by a [`MemoryFence`].
#[derive(Debug, Default)]
pub struct MemoryRegister {
    fence: MemoryFence,
    values: Mutex<Vec<i64>>,
}

impl MemoryRegister {
    /// `resources` registers at zero.
    pub fn new(resources: u32) -> Self {
        Self {
            fence: MemoryFence::new(),
            values: Mutex::new(vec![0; resources as usize]),
        }
    }

    fn get(&self, r: u32) -> i64 {
        self.values.lock().unwrap_or_else(PoisonError::into_inner)[r as usize]
    }

    fn set(&self, r: u32, v: i64) {
        self.values.lock().unwrap_or_else(PoisonError::into_inner)[r as usize] = v;
    }
}

impl Register for MemoryRegister {
    fn rmw<'a>(
        &'a self,
        r: u32,
        token: Option<&'a FenceToken>,
        gap: BoxFuture<'a, ()>,
    ) -> BoxFuture<'a, Rmw> {
        Box::pin(async move {
            let name = resource_name(r);
            let read = match token {
                Some(t) => match self.fence.admit_with(&name, t, |_| self.get(r)) {
                    Ok((_, v)) => v,
                    Err(e) => return rejected(&e),
                },
                None => self.get(r),
            };
            gap.await;
            let wrote = match token {
                Some(t) => self
                    .fence
                    .admit_with(&name, t, |_| self.set(r, read + 1))
                    .map(drop),
                None => {
                    self.set(r, read + 1);
                    Ok(())
                }
            };
            written(read, wrote.map_err(|e| rejected(&e)))
        })
    }

    fn value(&self, r: u32) -> BoxFuture<'_, Result<i64, String>> {
        Box::pin(async move { Ok(self.get(r)) })
    }
}

/// Registers on a Redis server that is not one of the lock's nodes, fenced by [`RedisFence`]
/// (admission and write in one script).
#[derive(Debug)]
pub struct RedisRegister {
    fence: RedisFence,
    conn: MultiplexedConnection,
}

impl RedisRegister {
    /// Registers on the server behind `conn`.
    pub fn new(conn: MultiplexedConnection) -> Self {
        Self {
            fence: RedisFence::new(),
            conn,
        }
    }

    async fn read(&self, r: u32) -> Result<i64, FenceError> {
        let mut conn = self.conn.clone();
        let raw = self.fence.get(&mut conn, &resource_name(r)).await?;
        Ok(raw
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|s| s.parse().ok())
            .unwrap_or(0))
    }
}

impl Register for RedisRegister {
    fn rmw<'a>(
        &'a self,
        r: u32,
        token: Option<&'a FenceToken>,
        gap: BoxFuture<'a, ()>,
    ) -> BoxFuture<'a, Rmw> {
        Box::pin(async move {
            let name = resource_name(r);
            let mut conn = self.conn.clone();
            if let Some(t) = token
                && let Err(e) = self.fence.admit(&mut conn, &name, t).await
            {
                return rejected(&e);
            }
            let read = match self.read(r).await {
                Ok(v) => v,
                Err(e) => return rejected(&e),
            };
            gap.await;
            let value = (read + 1).to_string();
            let wrote = match token {
                Some(t) => self
                    .fence
                    .set_if_admitted(&mut conn, &name, t, &value)
                    .await
                    .map(drop)
                    .map_err(|e| rejected(&e)),
                // An unfenced write that failed may or may not have landed.
                None => redis::cmd("SET")
                    .arg(self.fence.register_key(&name))
                    .arg(&value)
                    .query_async::<()>(&mut conn)
                    .await
                    .map_err(|_| Rmw {
                        read: None,
                        outcome: Outcome::Unknown,
                        error: Some("redis".to_owned()),
                    }),
            };
            written(read, wrote)
        })
    }

    fn value(&self, r: u32) -> BoxFuture<'_, Result<i64, String>> {
        Box::pin(async move { self.read(r).await.map_err(|e| e.to_string()) })
    }
}

/// Registers in a PostgreSQL table, fenced by [`PgFence`]: admission, read and write in one
/// transaction (the admission's row lock serialises holders).
#[derive(Debug)]
pub struct PgRegister {
    fence: PgFence,
    client: Arc<tokio::sync::Mutex<tokio_postgres::Client>>,
}

impl PgRegister {
    /// Creates the fence's schema and a register table with `resources` rows at zero (once,
    /// before the clients start: concurrent `CREATE … IF NOT EXISTS` can collide).
    ///
    /// # Errors
    /// Any PostgreSQL error, as text.
    pub async fn create(client: &tokio_postgres::Client, resources: u32) -> Result<(), String> {
        PgFence::new()
            .create_schema(client)
            .await
            .map_err(|e| e.to_string())?;
        client
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS chaos_register (resource TEXT PRIMARY KEY, value BIGINT NOT NULL)",
            )
            .await
            .map_err(|e| format!("creating the register table: {e:?}"))?;
        for r in 0..resources {
            client
                .execute(
                    "INSERT INTO chaos_register VALUES ($1, 0) ON CONFLICT DO NOTHING",
                    &[&resource_name(r)],
                )
                .await
                .map_err(|e| format!("creating register {r}: {e:?}"))?;
        }
        Ok(())
    }

    /// Registers over `client`, in the tables [`create`](Self::create) made.
    pub fn new(client: tokio_postgres::Client) -> Self {
        Self {
            fence: PgFence::new(),
            client: Arc::new(tokio::sync::Mutex::new(client)),
        }
    }
}

impl Register for PgRegister {
    fn rmw<'a>(
        &'a self,
        r: u32,
        token: Option<&'a FenceToken>,
        gap: BoxFuture<'a, ()>,
    ) -> BoxFuture<'a, Rmw> {
        Box::pin(async move {
            let name = resource_name(r);
            let mut client = self.client.lock().await;
            let unknown = |e: tokio_postgres::Error| Rmw {
                read: None,
                outcome: Outcome::Unknown,
                error: Some(format!("Postgres {}", e.code().map_or("-", |c| c.code()))),
            };
            let tx = match client.transaction().await {
                Ok(tx) => tx,
                Err(e) => return unknown(e),
            };
            if let Some(t) = token
                && let Err(e) = self.fence.admit(&tx, &name, t).await
            {
                return rejected(&e);
            }
            let read: i64 = match tx
                .query_one(
                    "SELECT value FROM chaos_register WHERE resource = $1",
                    &[&name],
                )
                .await
            {
                Ok(row) => row.get(0),
                Err(e) => return unknown(e),
            };
            gap.await;
            let wrote = tx
                .execute(
                    "UPDATE chaos_register SET value = $2 WHERE resource = $1",
                    &[&name, &(read + 1)],
                )
                .await;
            let committed = match wrote {
                Ok(_) => tx.commit().await,
                Err(e) => Err(e),
            };
            written(read, committed.map_err(unknown))
        })
    }

    fn value(&self, r: u32) -> BoxFuture<'_, Result<i64, String>> {
        Box::pin(async move {
            let client = self.client.lock().await;
            client
                .query_one(
                    "SELECT value FROM chaos_register WHERE resource = $1",
                    &[&resource_name(r)],
                )
                .await
                .map(|row| row.get(0))
                .map_err(|e| e.to_string())
        })
    }
}
