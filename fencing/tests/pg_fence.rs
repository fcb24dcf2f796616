//! `PgFence` and `PgSequence` against a real PostgreSQL server started by the testkit.

use std::sync::Arc;

use fencing::{Admission, FenceError, FenceToken, HighWater, PgFence, PgSequence, ScalarToken};
use rand::Rng;
use rand::seq::SliceRandom;
use redlock_testkit::PgServer;

async fn server() -> PgServer {
    PgServer::start()
        .await
        .expect("these tests need PostgreSQL: could not start a throwaway server")
}

fn token(s: &str) -> FenceToken {
    s.parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_rule_in_a_transaction() {
    let pg = server().await;
    let mut client = pg.connect().await.unwrap();
    let fence = PgFence::new();
    fence.create_schema(&client).await.unwrap();
    fence.create_schema(&client).await.unwrap(); // idempotent

    let old = token("f1,a=10,b=10,c=10");
    let new = token("f1,b=20,c=20,d=20");

    let tx = client.transaction().await.unwrap();
    assert_eq!(
        fence.admit(&tx, "r", &new).await.unwrap(),
        Admission::Advanced
    );
    tx.commit().await.unwrap();

    let tx = client.transaction().await.unwrap();
    assert_eq!(
        fence.admit(&tx, "r", &new).await.unwrap(),
        Admission::Repeated
    );
    match fence.admit(&tx, "r", &old).await {
        Err(FenceError::Stale {
            offered,
            high_water,
        }) => {
            assert_eq!(offered, old.clone().into());
            assert_eq!(high_water, HighWater::from(&new));
        }
        other => panic!("expected Stale, got {other:?}"),
    }
    // A rejection leaves the transaction usable.
    tx.execute("SELECT 1", &[]).await.unwrap();
    let err = fence
        .admit(&tx, "r", &token("f1,x=1,y=1"))
        .await
        .unwrap_err();
    assert!(err.is_unrelated(), "{err}");
    let err = fence.admit(&tx, "r", ScalarToken(99)).await.unwrap_err();
    assert!(err.is_unrelated(), "scalar on a claims resource: {err}");
    tx.commit().await.unwrap();

    assert_eq!(
        fence.high_water(&client, "r").await.unwrap(),
        HighWater::from(&new)
    );
    assert!(fence.high_water(&client, "other").await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_undoes_the_admission_with_the_write() {
    let pg = server().await;
    let mut client = pg.connect().await.unwrap();
    let fence = PgFence::with_table("public.fence_hw").unwrap();
    fence.create_schema(&client).await.unwrap();
    client
        .batch_execute("CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL); INSERT INTO accounts VALUES (1, 0)")
        .await
        .unwrap();

    let t1 = token("f1,a=1,b=1");
    let t2 = token("f1,a=2,b=2");
    let tx = client.transaction().await.unwrap();
    fence.admit(&tx, "acct:1", &t2).await.unwrap();
    tx.execute("UPDATE accounts SET balance = 50 WHERE id = 1", &[])
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    // Neither the write nor the advance happened: the older t1 is still admissible.
    assert!(
        fence
            .high_water(&client, "acct:1")
            .await
            .unwrap()
            .is_empty()
    );
    let tx = client.transaction().await.unwrap();
    assert_eq!(
        fence.admit(&tx, "acct:1", &t1).await.unwrap(),
        Admission::Advanced
    );
    tx.execute("UPDATE accounts SET balance = 10 WHERE id = 1", &[])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let row = client
        .query_one("SELECT balance FROM accounts WHERE id = 1", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_sql_fencing_raises_on_stale() {
    let pg = server().await;
    let client = pg.connect().await.unwrap();
    PgFence::new().create_schema(&client).await.unwrap();
    client
        .batch_execute(
            "BEGIN; SELECT fencing_high_water_admit_or_raise('r', '{a,b}', '{5,5}'); COMMIT;",
        )
        .await
        .unwrap();
    let err = client
        .batch_execute(
            "BEGIN; SELECT fencing_high_water_admit_or_raise('r', '{a,b}', '{4,9}'); COMMIT;",
        )
        .await
        .unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("FN001"), "{err}");
    client.batch_execute("ROLLBACK").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequence_scalar_tokens() {
    let pg = server().await;
    let mut client = pg.connect().await.unwrap();
    let fence = PgFence::new();
    fence.create_schema(&client).await.unwrap();
    let seq = PgSequence::new("fence_seq").unwrap();
    seq.create(&client).await.unwrap();
    seq.create(&client).await.unwrap();
    let a = seq.next(&client).await.unwrap();
    let b = seq.next(&client).await.unwrap();
    assert!(a < b);

    let tx = client.transaction().await.unwrap();
    assert_eq!(fence.admit(&tx, "s", b).await.unwrap(), Admission::Advanced);
    assert_eq!(fence.admit(&tx, "s", b).await.unwrap(), Admission::Repeated);
    let err = fence.admit(&tx, "s", a).await.unwrap_err();
    assert!(err.is_stale(), "{err}");
    assert!(err.to_string().contains(&format!("scalar {b}")), "{err}");
    let err = fence
        .admit(&tx, "s", ScalarToken(u64::MAX))
        .await
        .unwrap_err();
    assert!(matches!(err, FenceError::StampOutOfRange { .. }), "{err}");
    tx.commit().await.unwrap();
    assert_eq!(
        fence.high_water(&client, "s").await.unwrap().scalar(),
        Some(b.0)
    );
}

/// A sequence that caches values per session hands them out of order across sessions: a
/// holder drawing from one connection can get a value above the one a later holder draws from
/// another, and a stale write would be admitted. So do `CYCLE` and a negative increment. Such
/// a sequence is refused, and the value drawn is not handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_that_can_hand_out_values_out_of_order_is_refused() {
    let pg = server().await;
    let mut first = pg.connect().await.unwrap();
    let second = pg.connect().await.unwrap();
    let fence = PgFence::new();
    fence.create_schema(&first).await.unwrap();
    for (name, alter) in [
        ("cached_seq", "CACHE 10"),
        ("cycling_seq", "MAXVALUE 1000 CYCLE"),
        (
            "falling_seq",
            "INCREMENT BY -1 MINVALUE 1 MAXVALUE 1000000 START 1000000 RESTART",
        ),
    ] {
        let seq = PgSequence::new(&format!("public.{name}")).unwrap();
        seq.create(&first).await.unwrap();
        first
            .batch_execute(&format!("ALTER SEQUENCE public.{name} {alter}"))
            .await
            .unwrap();
        for client in [&first, &second] {
            let err = seq.next(client).await.unwrap_err();
            assert!(
                matches!(err, FenceError::InvalidConfig { .. }),
                "{name}: {err}"
            );
            assert!(err.to_string().contains(name), "{name}: {err}");
        }
    }

    // What the refusal prevents: with CACHE 10 the second session's first value comes before
    // the first session's second one, and is above it.
    first
        .batch_execute("CREATE SEQUENCE public.raw_cached CACHE 10")
        .await
        .unwrap();
    let one = |row: redlock_testkit::tokio_postgres::Row| row.get::<_, i64>(0);
    let a = one(first
        .query_one("SELECT nextval('public.raw_cached')", &[])
        .await
        .unwrap());
    let b = one(second
        .query_one("SELECT nextval('public.raw_cached')", &[])
        .await
        .unwrap());
    let c = one(first
        .query_one("SELECT nextval('public.raw_cached')", &[])
        .await
        .unwrap());
    assert!(a < c && c < b, "drawn in the order a, b, c: {a}, {b}, {c}");
    let tx = first.transaction().await.unwrap();
    assert_eq!(
        fence.admit(&tx, "s", ScalarToken(c as u64)).await.unwrap(),
        Admission::Advanced
    );
    assert!(
        fence.admit(&tx, "s", ScalarToken(b as u64)).await.is_ok(),
        "b, drawn before c, is admitted after it: why such a sequence must be refused"
    );
}

#[test]
fn names_are_validated_before_they_reach_sql() {
    for bad in [
        "",
        "Fence",
        "a;drop table x",
        "a.b.c",
        "1abc",
        "a b",
        &"x".repeat(49),
    ] {
        assert!(
            matches!(
                PgFence::with_table(bad),
                Err(FenceError::InvalidConfig { .. })
            ),
            "{bad:?}"
        );
        assert!(PgSequence::new(bad).is_err(), "{bad:?}");
    }
    assert!(PgFence::with_table("app.fence_2").is_ok());
    // A temporary schema would give every session a table or sequence of its own: two holders
    // drew the same value from `pg_temp.fence_seq`, and a stale token was admitted in a second
    // session through `pg_temp.fence_hw` (both were accepted).
    for temp in ["pg_temp.fence_hw", "pg_temp_3.fence_hw"] {
        assert!(
            matches!(
                PgFence::with_table(temp),
                Err(FenceError::InvalidConfig { .. })
            ),
            "{temp:?}"
        );
        assert!(
            matches!(PgSequence::new(temp), Err(FenceError::InvalidConfig { .. })),
            "{temp:?}"
        );
    }
}

/// `create_schema` run again on a deployment (docs/fencing.md, "Upgrading") keeps the stored
/// high water. With the default search path `"$user", public`, an unqualified default table
/// lands in `public`; once a schema named after the role appeared, a re-run created a second,
/// empty table and functions there, and every later session of that role admitted a stale token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerunning_create_schema_keeps_the_high_water_after_a_role_schema_appears() {
    let pg = server().await;
    let mut a = pg.connect().await.unwrap();
    let fence = PgFence::new();
    fence.create_schema(&a).await.unwrap();
    let newer = token("f1,n2=20,n3=20,n4=20");
    let older = token("f1,n1=10,n2=10,n3=10");
    let tx = a.transaction().await.unwrap();
    assert_eq!(
        fence.admit(&tx, "r", &newer).await.unwrap(),
        Admission::Advanced
    );
    tx.commit().await.unwrap();
    a.batch_execute(&format!("CREATE SCHEMA \"{}\"", pg.user()))
        .await
        .unwrap();
    let b = pg.connect().await.unwrap();
    fence.create_schema(&b).await.unwrap();
    let mut c = pg.connect().await.unwrap();
    let path: String = c.query_one("SHOW search_path", &[]).await.unwrap().get(0);
    let tx = c.transaction().await.unwrap();
    let res = fence.admit(&tx, "r", &older).await;
    let hw = fence.high_water(&tx, "r").await;
    assert!(
        res.as_ref().is_err_and(FenceError::is_stale),
        "after re-running create_schema (search_path {path}), the older token got {res:?}; \
         high water seen now {hw:?} (was {})",
        HighWater::from(&newer)
    );
}

/// A session whose search path puts another schema holding a deployment of its own first does
/// not admit through that deployment: the default fence names its schema. (The admission
/// function, named unqualified, was looked up through the session's search path.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_search_path_cannot_pick_another_high_water() {
    let pg = server().await;
    let mut a = pg.connect().await.unwrap();
    let fence = PgFence::new();
    fence.create_schema(&a).await.unwrap();
    let tx = a.transaction().await.unwrap();
    fence
        .admit(&tx, "r", &token("f1,n2=20,n3=20,n4=20"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut b = pg.connect().await.unwrap();
    b.batch_execute("CREATE SCHEMA other; SET search_path = other, public;")
        .await
        .unwrap();
    // A deployment of the same unqualified names in `other`.
    let local = PgFence::with_table("fencing_high_water").unwrap();
    local.create_schema(&b).await.unwrap();
    fence.create_schema(&b).await.unwrap();
    let tx = b.transaction().await.unwrap();
    let res = fence.admit(&tx, "r", &token("f1,n1=10,n2=10,n3=10")).await;
    assert!(
        res.as_ref().is_err_and(FenceError::is_stale),
        "session b (search_path other, public) got {res:?} for the older token"
    );
}

/// A resource name PostgreSQL text cannot hold (a NUL byte) is refused with a typed error
/// before anything is sent, and the transaction stays usable. (It used to reach the server and
/// come back as a backend error — "outcome unknown" — with the transaction aborted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_name_with_a_nul_byte_is_refused_before_it_is_sent() {
    let pg = server().await;
    let mut client = pg.connect().await.unwrap();
    let fence = PgFence::new();
    fence.create_schema(&client).await.unwrap();
    let tx = client.transaction().await.unwrap();
    let err = fence
        .admit(&tx, "orders\0x", &token("f1,a=1"))
        .await
        .unwrap_err();
    assert!(matches!(err, FenceError::InvalidResource { .. }), "{err:?}");
    assert_eq!(
        fence.admit(&tx, "orders", &token("f1,a=1")).await.unwrap(),
        Admission::Advanced,
        "the transaction is still usable"
    );
    let err = fence.high_water(&tx, "orders\0x").await.unwrap_err();
    assert!(matches!(err, FenceError::InvalidResource { .. }), "{err:?}");
}

/// A resource name longer than the table's primary-key index can hold is refused with a typed
/// error before anything is sent. It used to reach the server: an incompressible name of about
/// 2.7 kB or more failed the row's insert into the index ("index row size … exceeds btree
/// version 4 maximum 2704") at every admission, an untyped backend error ("outcome unknown")
/// with the transaction aborted, so the resource could never admit a token (review of
/// 2026-12-03: 2,700, 3,000, 8,000 and 100,000 random letters all failed, 2,000 passed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_name_too_long_for_the_index_is_refused_before_it_is_sent() {
    let pg = server().await;
    let mut client = pg.connect().await.unwrap();
    let fence = PgFence::new();
    fence.create_schema(&client).await.unwrap();
    let mut rng = rand::rng();
    let mut name = |len: usize| -> String {
        (0..len)
            .map(|_| char::from(b'a' + rng.random_range(0..26u8)))
            .collect()
    };
    let (longest, too_long) = (name(fencing::MAX_PG_RESOURCE_LEN), name(3000));
    let tx = client.transaction().await.unwrap();
    let err = fence
        .admit(&tx, &too_long, &token("f1,a=1"))
        .await
        .unwrap_err();
    assert!(matches!(err, FenceError::InvalidResource { .. }), "{err:?}");
    let err = fence.high_water(&tx, &too_long).await.unwrap_err();
    assert!(matches!(err, FenceError::InvalidResource { .. }), "{err:?}");
    assert_eq!(
        fence.admit(&tx, &longest, &token("f1,a=1")).await.unwrap(),
        Admission::Advanced,
        "the longest name is stored, and the transaction is still usable"
    );
    tx.commit().await.unwrap();
    assert_eq!(
        fence.high_water(&client, &longest).await.unwrap(),
        HighWater::from(&token("f1,a=1"))
    );
}

/// Names are quoted where they are spliced into SQL: a valid name that is a reserved word
/// (`user`, `select`) works like any other. (`with_table("user")` used to be accepted and then
/// fail in `create_schema` with a syntax error, an untyped backend error.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserved_words_are_usable_names() {
    let pg = server().await;
    let mut client = pg.connect().await.unwrap();
    client
        .batch_execute("CREATE SCHEMA \"order\"")
        .await
        .unwrap();
    for table in ["user", "order.table"] {
        let fence = PgFence::with_table(table).unwrap();
        fence.create_schema(&client).await.unwrap();
        let tx = client.transaction().await.unwrap();
        let new = token("f1,a=20,b=20");
        assert_eq!(
            fence.admit(&tx, "r", &new).await.unwrap(),
            Admission::Advanced,
            "{table}"
        );
        let err = fence
            .admit(&tx, "r", &token("f1,a=10,b=10"))
            .await
            .unwrap_err();
        assert!(err.is_stale(), "{table}: {err}");
        tx.commit().await.unwrap();
        assert_eq!(
            fence.high_water(&client, "r").await.unwrap(),
            HighWater::from_entries([("a", 20), ("b", 20)]),
            "{table}"
        );
    }
    let seq = PgSequence::new("select").unwrap();
    seq.create(&client).await.unwrap();
    let a = seq.next(&client).await.unwrap();
    assert!(seq.next(&client).await.unwrap() > a);
}

/// Every session reads and advances the same high water, whatever its search path: the
/// admission functions look their table up through a search path of their own, with
/// `pg_temp` last. Before, the table was looked up through the caller's search path, where
/// `pg_temp` comes first, and a session with a temporary table of the same name (or another
/// search path) admitted a stale token that every other session refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_search_path_does_not_change_the_high_water_it_reads() {
    let pg = server().await;
    let mut a = pg.connect().await.unwrap();
    let mut b = pg.connect().await.unwrap();
    let fence = PgFence::new();
    fence.create_schema(&a).await.unwrap();
    let old = token("f1,n1=10,n2=10,n3=10");
    let new = token("f1,n2=20,n3=20,n4=20");
    let tx = a.transaction().await.unwrap();
    fence.admit(&tx, "r", &new).await.unwrap();
    tx.commit().await.unwrap();

    // Session b: a temporary table of the same name, and a search path with another schema
    // holding one more.
    b.batch_execute(
        "CREATE TEMP TABLE fencing_high_water (LIKE public.fencing_high_water INCLUDING ALL);
         CREATE SCHEMA other;
         CREATE TABLE other.fencing_high_water (LIKE public.fencing_high_water INCLUDING ALL);
         SET search_path = other, public;",
    )
    .await
    .unwrap();
    let tx = b.transaction().await.unwrap();
    let err = fence.admit(&tx, "r", &old).await.unwrap_err();
    assert!(err.is_stale(), "a stale token admitted in session b: {err}");
    drop(tx);
    let tx = b.transaction().await.unwrap();
    let raised = tx
        .batch_execute(
            "SELECT public.fencing_high_water_admit_or_raise('r', '{n1,n2,n3}', '{10,10,10}')",
        )
        .await
        .expect_err("the plain-SQL admission refuses the stale token in session b too");
    assert_eq!(
        raised.as_db_error().map(|e| e.code().code()),
        Some("FN001"),
        "{raised}"
    );
}

/// A resource's first admission creates its row, then locks it. When the row is not there to
/// lock after the insert (an operator's reset deleted it in between; here a trigger skips the
/// insert, which leaves the same state every time), the admission read an empty high water,
/// answered `Advanced`, and its update changed nothing: no high water was kept, and an older
/// token was admitted next (found in review). It now fails as a serialization failure (40001)
/// and admits nothing; a trigger that skips the update is caught the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_whose_row_never_appears_fails_and_admits_nothing_older() {
    let pg = server().await;
    let mut client = pg.connect().await.unwrap();
    let fence = PgFence::new();
    fence.create_schema(&client).await.unwrap();
    client
        .batch_execute(
            "CREATE FUNCTION skip_row() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN RETURN NULL; END $$;
             CREATE TRIGGER skip_insert BEFORE INSERT ON public.fencing_high_water
                 FOR EACH ROW EXECUTE FUNCTION skip_row();",
        )
        .await
        .unwrap();
    let serialization_failure = |what: &str, result: Result<Admission, FenceError>| {
        let err = match result {
            Err(FenceError::Backend(e)) => e,
            other => panic!("{what}: expected a serialization failure, got {other:?}"),
        };
        let code = std::error::Error::source(&err)
            .and_then(|e| e.downcast_ref::<redlock_testkit::tokio_postgres::Error>())
            .and_then(|e| e.code().map(|c| c.code().to_owned()));
        assert_eq!(code.as_deref(), Some("40001"), "{what}: {err}");
    };
    for t in ["f1,a=20", "f1,a=10"] {
        let tx = client.transaction().await.unwrap();
        serialization_failure(t, fence.admit(&tx, "r", &token(t)).await);
    }
    assert!(fence.high_water(&client, "r").await.unwrap().is_empty());

    // The row exists; an update that a trigger skips.
    client
        .batch_execute(
            "DROP TRIGGER skip_insert ON public.fencing_high_water;
             INSERT INTO public.fencing_high_water VALUES ('r', '{a}', '{5}');
             CREATE TRIGGER skip_update BEFORE UPDATE ON public.fencing_high_water
                 FOR EACH ROW EXECUTE FUNCTION skip_row();",
        )
        .await
        .unwrap();
    let tx = client.transaction().await.unwrap();
    serialization_failure(
        "an update skipped",
        fence.admit(&tx, "r", &token("f1,a=20")).await,
    );
}

/// The admission functions of a table in a named schema look things up in that schema, as
/// docs/fencing.md says, whatever the current schema of the session that created them: they
/// were pinned to the creating session's current schema (`public` for `app.fence`; found in
/// review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_functions_of_a_table_in_a_schema_search_that_schema() {
    let pg = server().await;
    let client = pg.connect().await.unwrap();
    client.batch_execute("CREATE SCHEMA app").await.unwrap();
    let fence = PgFence::with_table("app.fence").unwrap();
    fence.create_schema(&client).await.unwrap();
    for function in ["fence_admit", "fence_admit_or_raise"] {
        let row = client
            .query_one(
                "SELECT array_to_string(p.proconfig, ';') FROM pg_proc p
                 JOIN pg_namespace n ON n.oid = p.pronamespace
                 WHERE n.nspname = 'app' AND p.proname = $1",
                &[&function],
            )
            .await
            .unwrap();
        let config: Option<String> = row.get(0);
        assert_eq!(
            config.as_deref(),
            Some("search_path=app, pg_temp"),
            "app.{function}"
        );
    }
}

/// A history of grants on 5 nodes in which every grant holds a quorum (3 nodes) and per-node
/// stamps increase in grant order: what a healthy Redlock issues.
fn grants(count: usize, rng: &mut impl Rng) -> Vec<FenceToken> {
    let nodes = ["n1", "n2", "n3", "n4", "n5"];
    let mut stamp = [0u64; 5];
    (0..count)
        .map(|_| {
            let mut idx: Vec<usize> = (0..5).collect();
            idx.shuffle(rng);
            let claims: Vec<(&str, u64)> = idx[..3]
                .iter()
                .map(|&i| {
                    stamp[i] += rng.random_range(1..1000);
                    (nodes[i], stamp[i])
                })
                .collect();
            FenceToken::new(claims).unwrap()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_tasks_keep_the_high_water_consistent() {
    const TASKS: usize = 16;
    const PER_TASK: usize = 40;
    let pg = server().await;
    let client = pg.connect().await.unwrap();
    let fence = PgFence::new();
    fence.create_schema(&client).await.unwrap();
    client
        .batch_execute("CREATE TABLE fenced_log (id bigserial PRIMARY KEY, token text NOT NULL)")
        .await
        .unwrap();
    let history = Arc::new(grants(120, &mut rand::rng()));

    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let mut client = pg.connect().await.unwrap();
        let fence = fence.clone();
        let history = Arc::clone(&history);
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0;
            let mut rejected = 0;
            for _ in 0..PER_TASK {
                // Interleaved and out of order: each task picks random grants of the history.
                let t = &history[rand::rng().random_range(0..history.len())];
                let tx = client.transaction().await.unwrap();
                match fence.admit(&tx, "hot", t).await {
                    Ok(_) => {
                        // The business write, after the admission in the same transaction.
                        tx.execute(
                            "INSERT INTO fenced_log (token) VALUES ($1)",
                            &[&t.to_string()],
                        )
                        .await
                        .unwrap();
                        tx.commit().await.unwrap();
                        admitted += 1;
                    }
                    Err(e) if e.is_stale() => {
                        tx.rollback().await.unwrap();
                        rejected += 1;
                    }
                    Err(e) => panic!("unexpected: {e}"),
                }
            }
            (admitted, rejected)
        }));
    }
    let mut admitted = 0;
    let mut rejected = 0;
    for t in tasks {
        let (a, r) = t.await.unwrap();
        admitted += a;
        rejected += r;
    }
    assert_eq!(admitted + rejected, TASKS * PER_TASK);
    assert!(
        admitted > 0 && rejected > 0,
        "{admitted} admitted, {rejected} rejected"
    );

    // The log in commit order (ids are drawn while the fence row is locked) must replay through
    // the in-memory rule without a single rejection, and end at the stored high water.
    let rows = client
        .query("SELECT token FROM fenced_log ORDER BY id", &[])
        .await
        .unwrap();
    assert_eq!(rows.len(), admitted);
    let mut replay = HighWater::new();
    let mut max_per_node = std::collections::BTreeMap::<String, u64>::new();
    for row in rows {
        let t: FenceToken = row.get::<_, String>(0).parse().unwrap();
        replay
            .admit(&t)
            .unwrap_or_else(|e| panic!("committed admissions out of order: {e}"));
        for (n, s) in t.iter() {
            let m = max_per_node.entry(n.to_owned()).or_default();
            *m = (*m).max(s);
        }
    }
    let stored = fence.high_water(&client, "hot").await.unwrap();
    assert_eq!(stored, replay);
    assert_eq!(stored, HighWater::from_entries(max_per_node));
}

// ---------------------------------------------------------------------------------------------
// The admission function called from plain SQL with raw arrays: malformed input is rejected
// with SQLSTATE FN003 and never changes the stored high water.

type PgError = redlock_testkit::tokio_postgres::Error;

/// Calls `fencing_high_water_admit(resource, nodes, stamps)` in its own transaction, with the
/// arrays given as PostgreSQL array literals (`None` = SQL NULL), and returns the verdict.
async fn admit_raw(
    client: &redlock_testkit::tokio_postgres::Client,
    resource: &str,
    nodes: Option<&str>,
    stamps: Option<&str>,
) -> Result<i16, PgError> {
    let row = client
        .query_one(
            "SELECT verdict FROM fencing_high_water_admit($1, $2::text::text[], $3::text::bigint[])",
            &[&resource, &nodes, &stamps],
        )
        .await?;
    Ok(row.get(0))
}

/// Asserts that `result` is the admission function's malformed-input error (SQLSTATE FN003),
/// and returns it.
fn expect_malformed(what: &str, result: Result<i16, PgError>) -> PgError {
    match result {
        Err(e) if e.code().map(|c| c.code()) == Some("FN003") => e,
        Err(e) => panic!("{what}: expected SQLSTATE FN003 (malformed fence token), got {e:?}"),
        Ok(v) => panic!("{what}: answered verdict {v} instead of rejecting malformed input"),
    }
}

async fn schema_with_a_at_10() -> (PgServer, redlock_testkit::tokio_postgres::Client, PgFence) {
    let pg = server().await;
    let client = pg.connect().await.unwrap();
    let fence = PgFence::new();
    fence.create_schema(&client).await.unwrap();
    assert_eq!(
        admit_raw(&client, "r", Some("{a}"), Some("{10}"))
            .await
            .unwrap(),
        1
    );
    (pg, client, fence)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_nodes_are_rejected_and_never_lower_the_high_water() {
    let (_pg, client, fence) = schema_with_a_at_10().await;
    let a10 = HighWater::from_entries([("a", 10)]);

    // The same node twice, the larger stamp first: assigning claim by claim would end at 10
    // after "admitting" 12, and {a:11} would then be admitted after a write stamped 12.
    let res = admit_raw(&client, "r", Some("{a,a}"), Some("{12,10}")).await;
    let after = fence.high_water(&client, "r").await.unwrap();
    let err = expect_malformed(&format!("{{a,a}} {{12,10}} (high water now {after})"), res);
    let message = err.as_db_error().map(|d| d.message().to_owned());
    assert_eq!(
        message.as_deref(),
        Some("malformed fence token: claim 2: node appears twice: a")
    );
    assert_eq!(after, a10);
    let err = expect_malformed(
        "{a,a} {10,12}",
        admit_raw(&client, "r", Some("{a,a}"), Some("{10,12}")).await,
    );
    // The crate maps this message to `FenceError::DuplicateNode` (unit-tested with the
    // function's other messages in `error.rs`).
    assert_eq!(
        err.as_db_error().map(|d| d.message()),
        Some("malformed fence token: claim 2: node appears twice: a")
    );
    let err = client
        .batch_execute("SELECT fencing_high_water_admit_or_raise('r', '{b,a,b}', '{1,12,2}')")
        .await
        .unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("FN003"), "{err}");
    assert_eq!(fence.high_water(&client, "r").await.unwrap(), a10);

    // The malformed calls changed nothing: a genuine later grant {a:11} is admitted, and the
    // earlier {a:10} is then stale.
    assert_eq!(
        admit_raw(&client, "r", Some("{a}"), Some("{11}"))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        admit_raw(&client, "r", Some("{a}"), Some("{10}"))
            .await
            .unwrap(),
        -1
    );
    assert_eq!(
        fence.high_water(&client, "r").await.unwrap(),
        HighWater::from_entries([("a", 11)])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn null_stamps_and_nodes_are_rejected_and_change_nothing() {
    let (_pg, client, fence) = schema_with_a_at_10().await;
    for (nodes, stamps) in [
        (Some("{a}"), Some("{NULL}")),
        (Some("{a,b}"), Some("{11,NULL}")),
        (Some("{b,a}"), Some("{NULL,10}")),
        (Some("{a,NULL}"), Some("{11,11}")),
        (Some("{NULL}"), Some("{11}")),
        (None, None),
        (Some("{a}"), None),
        (None, Some("{11}")),
    ] {
        let what = format!("nodes {nodes:?}, stamps {stamps:?}");
        let res = admit_raw(&client, "r", nodes, stamps).await;
        let row = client
            .query_one(
                "SELECT nodes::text, stamps::text FROM fencing_high_water WHERE resource = 'r'",
                &[],
            )
            .await
            .unwrap();
        let stored = format!("{} {}", row.get::<_, String>(0), row.get::<_, String>(1));
        expect_malformed(&format!("{what} (stored row now {stored})"), res);
        assert_eq!(stored, "{a} {10}", "{what}");
    }
    assert_eq!(
        fence.high_water(&client, "r").await.unwrap(),
        HighWater::from_entries([("a", 10)])
    );
    // A NULL stamp on a fresh resource is not "the first token" either.
    expect_malformed(
        "NULL stamp on a fresh resource",
        admit_raw(&client, "fresh", Some("{a}"), Some("{NULL}")).await,
    );
    assert!(fence.high_water(&client, "fresh").await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mismatched_or_misshapen_arrays_are_rejected_and_change_nothing() {
    let (_pg, client, fence) = schema_with_a_at_10().await;
    for (nodes, stamps) in [
        ("{a,b}", "{11}"),
        ("{a}", "{11,12}"),
        ("{b}", "{}"),
        ("{}", "{11}"),
        // Same number of elements, but not one-dimensional or not starting at 1: element
        // `[i]` of such an array is NULL or another claim's.
        ("{{a,b}}", "{11,12}"),
        ("{{a},{b}}", "{{11},{12}}"),
        ("[0:0]={a}", "{11}"),
        ("[2:3]={a,b}", "[2:3]={11,12}"),
        ("{a,b}", "[0:1]={11,12}"),
    ] {
        let what = format!("nodes {nodes}, stamps {stamps}");
        let res = admit_raw(&client, "r", Some(nodes), Some(stamps)).await;
        let after = fence.high_water(&client, "r").await;
        expect_malformed(&format!("{what} (high water now {after:?})"), res);
        assert_eq!(
            after.unwrap(),
            HighWater::from_entries([("a", 10)]),
            "{what}"
        );
    }
}

/// Which typed error a malformed input must map to.
type IsVariant = fn(&FenceError) -> bool;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_caps_hold_for_raw_arrays_and_map_to_typed_errors() {
    let (_pg, client, fence) = schema_with_a_at_10().await;
    let list = |items: &[String]| format!("{{{}}}", items.join(","));
    let names = |n: usize| (0..n).map(|i| format!("n{i}")).collect::<Vec<_>>();
    let stamps = |n: usize| (0..n).map(|_| "11".to_owned()).collect::<Vec<_>>();
    let with_a = |mut v: Vec<String>| {
        v[0] = "a".to_owned();
        v
    };
    let long = |bytes: usize| format!("\"{}\"", "x".repeat(bytes));
    // 'é' is two bytes in UTF-8: the cap counts bytes, as the Rust side does.
    let long_utf8 = |chars: usize| "é".repeat(chars);

    let cases: Vec<(&str, String, String, IsVariant)> = vec![
        ("no claims", "{}".into(), "{}".into(), |e| {
            matches!(e, FenceError::EmptyToken)
        }),
        (
            "33 claims",
            list(&with_a(names(33))),
            list(&stamps(33)),
            |e| matches!(e, FenceError::TooManyClaims { max: 32 }),
        ),
        (
            "129-byte name",
            list(&["a".into(), long(129)]),
            "{11,11}".into(),
            |e| matches!(e, FenceError::InvalidNodeName { .. }),
        ),
        (
            "130-byte UTF-8 name",
            list(&["a".into(), long_utf8(65)]),
            "{11,11}".into(),
            |e| matches!(e, FenceError::InvalidNodeName { .. }),
        ),
        (
            "empty name beside another claim",
            "{a,\"\"}".into(),
            "{11,11}".into(),
            |e| matches!(e, FenceError::InvalidNodeName { .. }),
        ),
        ("negative stamp", "{a,b}".into(), "{11,-1}".into(), |e| {
            matches!(e, FenceError::MalformedToken { .. })
        }),
        ("NULL stamp", "{a}".into(), "{NULL}".into(), |e| {
            matches!(e, FenceError::MalformedToken { .. })
        }),
        ("NULL node", "{a,NULL}".into(), "{11,11}".into(), |e| {
            matches!(e, FenceError::InvalidNodeName { .. })
        }),
        ("shape", "{a,b}".into(), "{11}".into(), |e| {
            matches!(e, FenceError::MalformedToken { .. })
        }),
    ];
    for (what, nodes, stamps, typed) in cases {
        let res = admit_raw(&client, "r", Some(&nodes), Some(&stamps)).await;
        let after = fence.high_water(&client, "r").await;
        let err = expect_malformed(&format!("{what} (high water now {after:?})"), res);
        assert_eq!(
            after.unwrap(),
            HighWater::from_entries([("a", 10)]),
            "{what}"
        );
        let message = err.as_db_error().map(|d| d.message()).unwrap_or_default();
        let mapped = FenceError::from_malformed_message(message);
        assert!(typed(&mapped), "{what}: mapped to {mapped:?}");
    }

    // The caps themselves are fine: 32 claims, a 128-byte name (64 two-byte characters), and
    // the empty name alone (a scalar token; unrelated to this claims resource).
    assert_eq!(
        admit_raw(
            &client,
            "r",
            Some(&list(&with_a(names(32)))),
            Some(&list(&stamps(32)))
        )
        .await
        .unwrap(),
        1
    );
    let name128 = long_utf8(64);
    assert_eq!(
        admit_raw(
            &client,
            "r",
            Some(&list(&["a".into(), name128.clone()])),
            Some("{12,1}")
        )
        .await
        .unwrap(),
        1
    );
    assert_eq!(
        admit_raw(&client, "r", Some("{\"\"}"), Some("{5}"))
            .await
            .unwrap(),
        -2
    );
    let hw = fence.high_water(&client, "r").await.unwrap();
    assert_eq!(
        (hw.len(), hw.get("a"), hw.get(&name128)),
        (33, Some(12), Some(1))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_schema_replaces_an_older_admission_function() {
    let pg = server().await;
    let client = pg.connect().await.unwrap();
    let fence = PgFence::new();
    // An existing deployment: the table with a row, and an admission function of the same
    // signature that checks nothing (as lax as the one this replaces, or laxer).
    client
        .batch_execute(
            "CREATE TABLE fencing_high_water (resource text PRIMARY KEY, nodes text[] NOT NULL,
                 stamps bigint[] NOT NULL, CHECK (cardinality(nodes) = cardinality(stamps)));
             INSERT INTO fencing_high_water VALUES ('r', '{a}', '{10}');
             CREATE FUNCTION fencing_high_water_admit(p_resource text, p_nodes text[], p_stamps bigint[])
             RETURNS TABLE (verdict smallint, hw_nodes text[], hw_stamps bigint[])
             LANGUAGE sql AS $$ SELECT 1::smallint, p_nodes, p_stamps $$;",
        )
        .await
        .unwrap();
    assert_eq!(
        admit_raw(&client, "r", Some("{a,a}"), Some("{12,10}"))
            .await
            .unwrap(),
        1,
        "the stand-in admits anything"
    );

    // Re-running create_schema installs the current function and keeps the data.
    fence.create_schema(&client).await.unwrap();
    expect_malformed(
        "after create_schema",
        admit_raw(&client, "r", Some("{a,a}"), Some("{12,10}")).await,
    );
    assert_eq!(
        admit_raw(&client, "r", Some("{a}"), Some("{9}"))
            .await
            .unwrap(),
        -1
    );
    assert_eq!(
        fence.high_water(&client, "r").await.unwrap(),
        HighWater::from_entries([("a", 10)])
    );
}

/// The query `docs/fencing.md` gives for finding rows the earlier, unchecked admission function
/// may have damaged.
fn documented_damage_query() -> &'static str {
    let doc = include_str!("../../docs/fencing.md");
    let after = doc
        .split_once("look for rows it may have damaged:")
        .expect("docs/fencing.md lost the upgrade section")
        .1;
    let block = after.split_once("```sql").unwrap().1;
    block.split_once("```").unwrap().0.trim()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documented_query_finds_rows_damaged_by_unchecked_admissions() {
    let pg = server().await;
    let client = pg.connect().await.unwrap();
    PgFence::new().create_schema(&client).await.unwrap();
    // What the earlier function could store (the table's own check only compares lengths).
    let long = "x".repeat(129);
    client
        .batch_execute(&format!(
            "INSERT INTO fencing_high_water VALUES
                 ('ok', '{{a,b}}', '{{10,20}}'),
                 ('scalar', '{{\"\"}}', '{{7}}'),
                 ('null_stamp', '{{a,b}}', '{{11,NULL}}'),
                 ('null_node', '{{a,NULL}}', '{{11,11}}'),
                 ('negative', '{{a,c}}', '{{11,-5}}'),
                 ('empty_name', '{{a,\"\"}}', '{{11,11}}'),
                 ('long_name', '{{a,{long}}}', '{{11,11}}')"
        ))
        .await
        .unwrap();
    let mut found: Vec<String> = client
        .query(documented_damage_query(), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    found.sort();
    assert_eq!(
        found,
        [
            "empty_name",
            "long_name",
            "negative",
            "null_node",
            "null_stamp"
        ]
    );
}

/// A client other than tokio-postgres (sqlx, diesel, …) gets the statement, its parameters and
/// the decoding from `PgFence` and runs them itself. Here tokio-postgres stands in for such a
/// client: a plain `query_one` on the statement text, parameter types inferred by the server as
/// with any prepared statement, and the row's three columns handed back for the verdict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_client_runs_the_admission_with_the_exposed_sql() {
    async fn admit_raw(
        tx: &redlock_testkit::tokio_postgres::Transaction<'_>,
        fence: &PgFence,
        resource: &str,
        token: &FenceToken,
    ) -> Result<Admission, FenceError> {
        let (nodes, stamps) = PgFence::admit_params(token)?;
        let row = tx
            .query_one(fence.admit_sql(), &[&resource, &nodes, &stamps])
            .await
            .map_err(|e| match e.as_db_error() {
                Some(db) if db.code().code() == "FN003" => {
                    FenceError::from_malformed_message(db.message())
                }
                _ => panic!("admission failed: {e}"),
            })?;
        fence.admission_from_row(token, row.get(0), row.get(1), row.get(2))
    }

    let pg = server().await;
    let mut client = pg.connect().await.unwrap();
    let fence = PgFence::with_table("raw_hw").unwrap();
    // What a migration tool would run.
    client.batch_execute(&fence.schema_sql()).await.unwrap();
    client
        .batch_execute(
            "CREATE TABLE doc (id int PRIMARY KEY, body text); INSERT INTO doc VALUES (1, 'v0')",
        )
        .await
        .unwrap();

    let old = token("f1,a=10,b=10,c=10");
    let new = token("f1,b=20,c=20,d=20");

    // Advanced, with the business write in the same transaction.
    let tx = client.transaction().await.unwrap();
    assert_eq!(
        admit_raw(&tx, &fence, "doc:1", &new).await.unwrap(),
        Admission::Advanced
    );
    tx.execute("UPDATE doc SET body = 'new' WHERE id = 1", &[])
        .await
        .unwrap();
    tx.commit().await.unwrap();

    // Repeated, then stale: the stale writer rolls back and its write never lands.
    let tx = client.transaction().await.unwrap();
    assert_eq!(
        admit_raw(&tx, &fence, "doc:1", &new).await.unwrap(),
        Admission::Repeated
    );
    match admit_raw(&tx, &fence, "doc:1", &old).await {
        Err(FenceError::Stale { high_water, .. }) => {
            assert_eq!(high_water, HighWater::from(&new));
        }
        other => panic!("expected Stale, got {other:?}"),
    }
    tx.execute("UPDATE doc SET body = 'stale' WHERE id = 1", &[])
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let body: String = client
        .query_one("SELECT body FROM doc WHERE id = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(body, "new");

    // Unrelated, and the same verdicts as the tokio-postgres `admit` on the same high water.
    let tx = client.transaction().await.unwrap();
    let err = admit_raw(&tx, &fence, "doc:1", &token("f1,x=1,y=1"))
        .await
        .unwrap_err();
    assert!(err.is_unrelated(), "{err}");
    for t in [&old, &new, &token("f1,x=1,y=1"), &token("f1,b=30,c=30")] {
        let raw = admit_raw(&tx, &fence, "doc:2", t).await;
        let typed = fence.admit(&tx, "doc:3", t).await;
        assert_eq!(
            format!("{raw:?}").replace("doc:2", "doc:3"),
            format!("{typed:?}"),
            "{t}"
        );
    }
    tx.rollback().await.unwrap();
    assert_eq!(
        fence.high_water(&client, "doc:1").await.unwrap(),
        HighWater::from(&new)
    );

    // Parameters for a scalar token, and a verdict the function never returns.
    let (nodes, stamps) = PgFence::admit_params(ScalarToken(7)).unwrap();
    assert_eq!((nodes, stamps), (vec![""], vec![7]));
    assert!(PgFence::admit_params(ScalarToken(u64::MAX)).is_err());
    let err = fence
        .admission_from_row(&new, 5, Vec::new(), Vec::new())
        .unwrap_err();
    assert!(matches!(err, FenceError::UnexpectedReply { .. }), "{err}");
}
