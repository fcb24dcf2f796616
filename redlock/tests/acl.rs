//! The least-privilege ACL recipe of docs/operations.md, run for real: a user restricted to
//! exactly those rules acquires, extends, renews, waits for a release notification (as an
//! acquirer and with `wait_released`), releases and falls back from `EVALSHA` to `EVAL` after a
//! script-cache flush; and each rule, taken away, breaks one of those steps.

mod common;

use std::time::Duration;

use futures_util::StreamExt;
use redlock::{NodeErrorKind, NodeOutcome, Redlock, RetryPolicy};
use redlock_testkit::Cluster;
use redlock_testkit::redis;

/// The rules every server needs, in the order docs/operations.md prints them.
const BASE: &[&str] = common::ACL_RECIPE;

/// Rules whose removal the scenario cannot show in a few seconds: `UNSUBSCRIBE` is sent 30 s
/// after a channel's last waiter left, `PING` only on a subscription connection that has nothing
/// to subscribe when it (re)connects.
const NOT_SHOWN: &[&str] = &["+unsubscribe", "+ping"];

const PASSWORD: &str = "acl-recipe-Pa55";

/// Creates (or replaces) ACL user `user` with exactly `rules` on every node.
async fn set_user(cluster: &Cluster, user: &str, rules: &[&str]) {
    set_user_on(cluster.nodes(), user, rules).await;
}

/// [`set_user`] on `nodes` only.
async fn set_user_on(nodes: &[redlock_testkit::RedisNode], user: &str, rules: &[&str]) {
    for node in nodes {
        let mut c = node.connection().await.unwrap();
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER")
            .arg(user)
            .arg("reset")
            .arg("on")
            .arg(format!(">{PASSWORD}"));
        for rule in rules {
            cmd.arg(*rule);
        }
        let () = cmd.query_async(&mut c).await.unwrap();
    }
}

fn urls(cluster: &Cluster, user: &str) -> Vec<String> {
    cluster
        .nodes()
        .iter()
        .map(|n| format!("redis://{user}:{PASSWORD}@127.0.0.1:{}", n.port()))
        .collect()
}

fn client(urls: Vec<String>, retry: RetryPolicy) -> Redlock {
    Redlock::builder()
        .nodes(urls)
        .ttl(Duration::from_millis(600))
        .renew_every(Duration::from_millis(60))
        .node_timeout(Duration::from_millis(250))
        .retry(retry)
        .build()
        .unwrap()
}

/// A client for the native-refusal tests, which check what a release does and not how fast:
/// a TTL and node timeout a loaded machine does not run past between the grant and the release
/// (with `client`'s 600 ms and 250 ms, a CI machine once answered the release after the key had
/// expired on one node and past the node timeout on another).
fn roomy_client(urls: Vec<String>) -> Redlock {
    Redlock::builder()
        .nodes(urls)
        .ttl(Duration::from_secs(10))
        .node_timeout(Duration::from_secs(2))
        .retry(RetryPolicy::once())
        .build()
        .unwrap()
}

/// The step of the scenario that failed, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Connect,
    Acquire,
    Extend,
    Renewal,
    Subscribe,
    Publish,
    Release,
    Waiter,
    WaitReleased,
    EvalFallback,
}

fn fail<T>(step: Step, why: impl std::fmt::Display) -> Result<T, (Step, String)> {
    Err((step, why.to_string()))
}

/// Everything the client does on a node, as user `user`; `Err` names the first step that
/// failed. Every wait is bounded.
async fn scenario(cluster: &Cluster, user: &str, resource: &str) -> Result<(), (Step, String)> {
    let a = client(urls(cluster, user), RetryPolicy::once());
    for report in a.connect().await {
        if report.outcome != NodeOutcome::Confirmed {
            return fail(
                Step::Connect,
                format!("{}: {}", report.node, report.outcome),
            );
        }
    }
    let mut lock = match a.try_acquire(resource).await {
        Ok(lock) => lock,
        Err(e) => return fail(Step::Acquire, e),
    };
    if let Err(e) = a.extend(&mut lock).await {
        return fail(Step::Extend, e);
    }

    // Renewal: the guard must keep a 600 ms lock alive well past its TTL.
    let guard = a.guard(lock).unwrap();
    let lease = guard.lease();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    if let Some(reason) = lease.reason() {
        return fail(Step::Renewal, format!("lost after 1 s: {reason:?}"));
    }

    // A waiter in another client subscribes to the release channel and is woken by the
    // release. Its retry delay (20 s) is far longer than the bound on this step (5 s), so it
    // can only get the lock in time by hearing the release.
    let channel = format!("redlock:release:{resource}");
    let b = client(
        urls(cluster, user),
        RetryPolicy::deadline(Duration::from_secs(60))
            .with_delay(Duration::from_secs(20), Duration::ZERO),
    );
    let waiter = {
        let b = b.clone();
        let resource = resource.to_owned();
        tokio::spawn(async move { b.acquire(&resource).await })
    };
    // A third client waits for the release without taking the lock.
    let c = client(urls(cluster, user), RetryPolicy::once());
    let watcher = {
        let resource = resource.to_owned();
        tokio::spawn(async move { c.wait_released(&resource, Duration::from_secs(2)).await })
    };
    let mut listening = false;
    for _ in 0..50 {
        if common::subscribed_nodes(cluster, &channel).await >= 2 {
            listening = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if !listening {
        let state = if waiter.is_finished() {
            format!("{:?}", waiter.await)
        } else {
            waiter.abort();
            "still waiting".to_owned()
        };
        return fail(
            Step::Subscribe,
            format!("the waiter subscribed on fewer than 2 nodes within 1 s ({state})"),
        );
    }
    // An observer of our own (the default user) hears whether the release script publishes.
    let observer = redis::Client::open(cluster.node(0).url()).unwrap();
    let mut pubsub = observer.get_async_pubsub().await.unwrap();
    pubsub.subscribe(&channel).await.unwrap();

    if watcher.is_finished() {
        return fail(
            Step::WaitReleased,
            format!("returned while the lock was held: {:?}", watcher.await),
        );
    }
    let report = match guard.release().await {
        Ok(report) => report,
        Err(e) => {
            waiter.abort();
            return fail(Step::Release, e);
        }
    };
    if report.released() < a.quorum() {
        waiter.abort();
        return fail(Step::Release, format!("{report:?}"));
    }
    let heard = tokio::time::timeout(Duration::from_secs(1), pubsub.on_message().next()).await;
    if !matches!(heard, Ok(Some(_))) {
        waiter.abort();
        return fail(Step::Publish, "no release notification within 1 s");
    }
    let held = match tokio::time::timeout(Duration::from_secs(5), waiter).await {
        Ok(Ok(Ok(lock))) => lock,
        Ok(Ok(Err(e))) => return fail(Step::Waiter, e),
        other => return fail(Step::Waiter, format!("not woken within 5 s: {other:?}")),
    };
    let _ = b.release(held).await;
    match tokio::time::timeout(Duration::from_secs(3), watcher).await {
        Ok(Ok(Ok(()))) => {}
        other => return fail(Step::WaitReleased, format!("{other:?}")),
    }

    // After the nodes lost their script cache, extend and release of a multi-key lock (always
    // scripts) fall back to EVAL.
    let keys = [format!("{resource}:x"), format!("{resource}:y")];
    let mut many = match a.try_acquire_many(&keys).await {
        Ok(lock) => lock,
        Err(e) => return fail(Step::Acquire, e),
    };
    for node in cluster.nodes() {
        node.script_flush().await.unwrap();
    }
    if let Err(e) = a.extend(&mut many).await {
        return fail(Step::EvalFallback, e);
    }
    match a.release(many).await {
        Ok(report) if report.released() >= a.quorum() => Ok(()),
        Ok(report) => fail(Step::EvalFallback, format!("{report:?}")),
        Err(e) => fail(Step::EvalFallback, e),
    }
}

/// What node 0 refused lately (`ACL LOG`): names the missing rule when a scenario fails.
async fn acl_log(cluster: &Cluster) -> Vec<String> {
    let mut c = cluster.node(0).connection().await.unwrap();
    let entries: Vec<redis::Value> = redis::cmd("ACL")
        .arg("LOG")
        .arg(5)
        .query_async(&mut c)
        .await
        .unwrap();
    entries.iter().map(|e| format!("{e:?}")).collect()
}

async fn acl_log_reset(cluster: &Cluster) {
    for node in cluster.nodes() {
        let mut c = node.connection().await.unwrap();
        let () = redis::cmd("ACL")
            .arg("LOG")
            .arg("RESET")
            .query_async(&mut c)
            .await
            .unwrap();
    }
}

async fn server(cluster: &Cluster) -> (String, String) {
    let v = cluster.server_version().await.unwrap();
    (v.name().to_owned(), v.version().to_owned())
}

#[test]
fn the_documented_recipe_is_the_tested_one() {
    let doc = include_str!("../../docs/operations.md");
    let line = format!("ACL SETUSER redlock on >CHANGE-ME {}", BASE.join(" "));
    assert!(
        doc.contains(&line),
        "docs/operations.md no longer shows the tested recipe:\n{line}"
    );
    let conf = format!("user redlock on >CHANGE-ME {}", BASE.join(" "));
    assert!(doc.contains(&conf), "docs/operations.md: {conf}");
    for extra in [
        "+delifeq",
        "+delex",
        "+client\\|setinfo",
        "+info",
        "+select",
    ] {
        assert!(
            doc.contains(extra),
            "docs/operations.md does not name {extra}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recipe_is_enough_and_every_rule_is_needed() {
    let cluster = Cluster::start(3).await.unwrap();
    let (name, version) = server(&cluster).await;
    let rules = common::acl_recipe(&name, &version);

    set_user(&cluster, "redlock", &rules).await;
    acl_log_reset(&cluster).await;
    if let Err((step, why)) = scenario(&cluster, "redlock", "acl:full").await {
        let log = acl_log(&cluster).await;
        panic!(
            "{name} {version}: the recipe {rules:?} failed at {step:?}: {why}; ACL LOG: {log:?}"
        );
    }
    let log = acl_log(&cluster).await;
    assert!(
        log.is_empty(),
        "{name} {version}: refusals under the recipe: {log:?}"
    );

    // One rule fewer: the scenario must fail. (Each variant is its own user and resource.)
    for (i, removed) in rules.iter().enumerate() {
        if NOT_SHOWN.contains(removed) || !removed.starts_with(['+', '&', '~']) {
            continue;
        }
        let fewer: Vec<&str> = rules.iter().copied().filter(|r| r != removed).collect();
        let user = format!("fewer{i}");
        set_user(&cluster, &user, &fewer).await;
        acl_log_reset(&cluster).await;
        let outcome = scenario(&cluster, &user, &format!("acl:fewer{i}")).await;
        println!("without {removed}: {outcome:?}");
        if ["+client|setinfo", "+delifeq", "+delex"].contains(removed) {
            // Nothing breaks; the refusals go to ACL LOG instead (the native delete's once per
            // connection, which then uses the release script).
            assert!(outcome.is_ok(), "without {removed}: {outcome:?}");
            let log = acl_log(&cluster).await;
            assert!(log.iter().any(|e| e.contains(&removed[1..])), "{log:?}");
            continue;
        }
        assert!(
            outcome.is_err(),
            "{name} {version}: the scenario passed without {removed}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_restart_quarantine_needs_info() {
    let cluster = Cluster::start(3).await.unwrap();
    let (name, version) = server(&cluster).await;
    let base = common::acl_recipe(&name, &version);
    let mut with_info = base.clone();
    with_info.push("+info");
    set_user(&cluster, "noinfo", &base).await;
    set_user(&cluster, "withinfo", &with_info).await;

    let quarantined = |user: &str| {
        Redlock::builder()
            .nodes(urls(&cluster, user))
            .restart_quarantine(Duration::from_millis(1))
            .retry(RetryPolicy::attempts(3))
            .build()
            .unwrap()
    };
    for report in quarantined("noinfo").connect().await {
        match &report.outcome {
            NodeOutcome::Failed(e) => {
                assert_eq!(e.kind(), NodeErrorKind::Auth, "{e}");
                assert!(e.message().contains("+info"), "{e}");
            }
            other => panic!("without +info the quarantine cannot read the uptime: {other}"),
        }
    }
    let rl = quarantined("withinfo");
    for report in rl.connect().await {
        assert_eq!(report.outcome, NodeOutcome::Confirmed, "{}", report.node);
    }
    let lock = rl.acquire("acl:quarantine").await.unwrap();
    rl.release(lock).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_other_than_0_needs_select() {
    let cluster = Cluster::start(3).await.unwrap();
    let (name, version) = server(&cluster).await;
    let base = common::acl_recipe(&name, &version);
    let mut with_select = base.clone();
    with_select.push("+select");
    set_user(&cluster, "noselect", &base).await;
    set_user(&cluster, "withselect", &with_select).await;

    let in_db_1 = |user: &str| {
        let urls: Vec<String> = urls(&cluster, user)
            .into_iter()
            .map(|u| format!("{u}/1"))
            .collect();
        client(urls, RetryPolicy::once())
    };
    for report in in_db_1("noselect").connect().await {
        match &report.outcome {
            NodeOutcome::Failed(e) => {
                assert!(e.message().contains("select"), "{e}");
            }
            other => panic!("without +select the database cannot be selected: {other}"),
        }
    }
    let rl = in_db_1("withselect");
    for report in rl.connect().await {
        assert_eq!(report.outcome, NodeOutcome::Confirmed, "{}", report.node);
    }
    let lock = rl.try_acquire("acl:select").await.unwrap();
    // The key is in database 1, not 0.
    let mut c = cluster.node(0).connection().await.unwrap();
    let in_db_0: i64 = redis::cmd("EXISTS")
        .arg("redlock:lock:acl:select")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(in_db_0, 0);
    rl.release(lock).await.unwrap();
}

/// Connects `rl` as user "upgraded" (holding `rules`), then takes the server's native delete
/// rule away from that user on `nodes`, as an upgrade that kept the last version's recipe
/// would: returns
/// the rule taken (`None` for a server without a native delete).
async fn connect_then_refuse_native(
    nodes: &[redlock_testkit::RedisNode],
    rl: &Redlock,
    name: &str,
    version: &str,
    rules: &[&'static str],
) -> Option<&'static str> {
    for report in rl.connect().await {
        assert!(
            matches!(report.outcome, NodeOutcome::Confirmed),
            "{report:?}"
        );
    }
    let native = common::native_delete(name, version);
    if let Some(rule) = native {
        let fewer: Vec<&str> = rules.iter().copied().filter(|r| *r != rule).collect();
        set_user_on(nodes, "upgraded", &fewer).await;
    }
    native
}

/// URLs of `cluster`'s proxies, as user "upgraded".
fn proxy_urls(cluster: &Cluster) -> Vec<String> {
    cluster
        .nodes()
        .iter()
        .map(|n| {
            let port = n.proxy().expect("proxied").addr().port();
            format!("redis://upgraded:{PASSWORD}@127.0.0.1:{port}")
        })
        .collect()
}

/// Starts `b`'s acquire of `resource` (held elsewhere) and waits until it listens for the
/// release on every node.
async fn subscribed_waiter(
    cluster: &Cluster,
    b: &Redlock,
    resource: &'static str,
) -> tokio::task::JoinHandle<Result<redlock::Lock, redlock::Error>> {
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.acquire(resource).await })
    };
    let channel = format!("redlock:release:{resource}");
    assert!(
        common::eventually(Duration::from_secs(2), || async {
            common::subscribed_nodes(cluster, &channel).await >= 3
        })
        .await,
        "the waiter did not subscribe"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    waiter
}

/// A user whose rules lose the server's native conditional delete while the client is
/// connected — the recipe of the server's last version kept through an upgrade to one that has
/// it, or the rule taken away — must still release: the release script does the same. The
/// native command's refusal was final for the connection, and every lone release on every
/// such node failed, each lock staying for its TTL (found in review). On a server without a
/// native delete (Redis 7.0) there is nothing to refuse, and this only checks the recipe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_falls_back_to_the_script_when_the_native_delete_is_refused() {
    let cluster = Cluster::start(3).await.unwrap();
    let (name, version) = server(&cluster).await;
    let rules = common::acl_recipe(&name, &version);
    set_user(&cluster, "upgraded", &rules).await;
    let rl = roomy_client(urls(&cluster, "upgraded"));
    let native = connect_then_refuse_native(cluster.nodes(), &rl, &name, &version, &rules).await;
    for round in 0..2 {
        let lock = rl.try_acquire("acl:native").await.expect("granted");
        let report = rl.release(lock).await;
        // Released once no quorum holds the key: deleted there, or never granted there (on a
        // busy machine a CI run returned with one delete, one node holding nothing and the
        // third still to answer). The refused native delete failed the node instead.
        assert!(
            report
                .as_ref()
                .is_ok_and(|r| r.released() >= 1 && r.released() + r.not_held() >= 2),
            "{name} {version}, native delete {native:?} refused, release {round}: {report:?}"
        );
    }
    assert!(common::no_lock_keys_within(&cluster, Duration::from_secs(2)).await);
}

/// The native release sends its wake-up in the same round trip as the delete. When the server
/// refused the delete, that wake-up went out before the release script deleted the key, and the
/// script's wake-up carried the same id: another client's waiter woken by the first found the
/// lock still held, and dropped the second as a repeat of a release it had heard, so it waited
/// for its next retry (20 s here) instead of taking the freed lock. The releasing client's link
/// is slowed (30 ms each way) so that the waiter's attempt always lands between the two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_hears_a_release_whose_native_delete_was_refused() {
    let cluster = common::proxied(3).await;
    let (name, version) = server(&cluster).await;
    let rules = common::acl_recipe(&name, &version);
    set_user(&cluster, "upgraded", &rules).await;
    let a = roomy_client(proxy_urls(&cluster));
    let native = connect_then_refuse_native(cluster.nodes(), &a, &name, &version, &rules).await;
    let resource = "acl:refused-wake";
    let lock = a.try_acquire(resource).await.expect("granted");

    let b = client(
        urls(&cluster, "upgraded"),
        RetryPolicy::deadline(Duration::from_secs(60))
            .with_delay(Duration::from_secs(20), Duration::ZERO),
    );
    let waiter = subscribed_waiter(&cluster, &b, resource).await;

    for node in cluster.nodes() {
        node.proxy()
            .unwrap()
            .set_delay(Duration::from_millis(30), Duration::ZERO);
    }
    let report = a.release(lock).await;
    assert!(
        report.as_ref().is_ok_and(|r| r.released() >= 2),
        "{name} {version}, native delete {native:?} refused: {report:?}"
    );
    let started = std::time::Instant::now();
    match tokio::time::timeout(Duration::from_secs(5), waiter).await {
        Ok(Ok(Ok(held))) => {
            let _ = b.release(held).await;
        }
        other => panic!(
            "{name} {version}, native delete {native:?} refused: the waiter was not woken by \
             the release ({:?} after it: {other:?})",
            started.elapsed()
        ),
    }
}

/// The same with one node refusing the native delete and the two others deleting natively,
/// slowly (the releasing client's links to them delayed 100 ms each way). The refusing node's
/// script sends the release's second wake-up while the others' deletes are still on their way.
/// Taken for a release of its own, it became the latest release: a waiter refused by the slow
/// nodes then waited for their messages of it, which never come (they publish the first id),
/// until its node timeout (a wait for its first node) or its next retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_hears_a_release_whose_native_delete_one_node_refused() {
    let cluster = common::proxied(3).await;
    let (name, version) = server(&cluster).await;
    let rules = common::acl_recipe(&name, &version);
    set_user(&cluster, "upgraded", &rules).await;
    let a = roomy_client(proxy_urls(&cluster));
    // Node 0 only: as in a rolling upgrade that gave it the last version's recipe.
    let refusing = 0;
    let native = connect_then_refuse_native(
        &cluster.nodes()[refusing..=refusing],
        &a,
        &name,
        &version,
        &rules,
    )
    .await;
    let resource = "acl:one-refused-wake";
    let lock = a.try_acquire(resource).await.expect("granted");

    // A node timeout of 1 s: a wait for a node's message that never comes ends there.
    let b = Redlock::builder()
        .nodes(urls(&cluster, "upgraded"))
        .ttl(Duration::from_secs(10))
        .node_timeout(Duration::from_secs(1))
        .retry(
            RetryPolicy::deadline(Duration::from_secs(60))
                .with_delay(Duration::from_secs(20), Duration::ZERO),
        )
        .build()
        .unwrap();
    let waiter = subscribed_waiter(&cluster, &b, resource).await;

    for (i, node) in cluster.nodes().iter().enumerate() {
        if i != refusing {
            node.proxy()
                .unwrap()
                .set_delay(Duration::from_millis(100), Duration::ZERO);
        }
    }
    let started = std::time::Instant::now();
    let report = a.release(lock).await;
    assert!(
        report.as_ref().is_ok_and(|r| r.released() >= 2),
        "{name} {version}, native delete {native:?} refused on node {refusing}: {report:?}"
    );
    match tokio::time::timeout(Duration::from_secs(5), waiter).await {
        Ok(Ok(Ok(held))) => {
            let waited = started.elapsed();
            let _ = b.release(held).await;
            // The slow nodes delete about 100 ms after the release began.
            assert!(
                waited < Duration::from_millis(600),
                "{name} {version}, native delete {native:?} refused on node {refusing}: the \
                 waiter got the lock {waited:?} after the release began"
            );
        }
        other => panic!(
            "{name} {version}, native delete {native:?} refused on node {refusing}: the waiter \
             was not woken by the release ({:?} after it began: {other:?})",
            started.elapsed()
        ),
    }
}
