//! Within one client, acquirers of the same resource are served in FIFO order: a task that
//! releases and at once acquires again queues behind the client's other tasks already waiting
//! for the resource, instead of reaching the nodes first while they retry.

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redlock_testkit::Cluster;

/// Tasks of one client contending for the key.
const TASKS: usize = 4;
/// Acquisitions in all; the run ends after this many, whoever won them.
const WINS: usize = 40;
/// How long each win is held.
const HOLD: Duration = Duration::from_millis(1);

#[derive(Default)]
struct Record {
    /// Tasks inside `acquire` right now.
    waiting: BTreeSet<usize>,
    /// The previous winner, and the other tasks that were already waiting when it released.
    last: Option<(usize, BTreeSet<usize>)>,
    /// Winners in order.
    wins: Vec<usize>,
    /// Wins by the task that won the previous round too, although others were waiting then.
    barged: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_releasing_task_queues_behind_its_clients_waiters() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = common::client(cluster.urls(), Duration::from_secs(10));
    let record = Arc::new(Mutex::new(Record::default()));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (rl, record) = (rl.clone(), Arc::clone(&record));
        tasks.push(tokio::spawn(async move {
            loop {
                record.lock().unwrap().waiting.insert(t);
                let lock = rl.acquire("fifo").await.expect("acquire");
                {
                    let mut r = record.lock().unwrap();
                    r.waiting.remove(&t);
                    if let Some((prev, others)) = &r.last
                        && *prev == t
                        && !others.is_empty()
                    {
                        r.barged += 1;
                    }
                    r.wins.push(t);
                }
                tokio::time::sleep(HOLD).await;
                let done = {
                    let mut r = record.lock().unwrap();
                    let others = r.waiting.clone();
                    r.last = Some((t, others));
                    r.wins.len() >= WINS
                };
                rl.release(lock).await.expect("release");
                if done {
                    return;
                }
            }
        }));
    }
    // The run ends with the WINS-th acquisition; the tasks still waiting then are stopped.
    let ended = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if record.lock().unwrap().wins.len() >= WINS {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    for task in &tasks {
        task.abort();
    }
    let r = record.lock().unwrap();
    println!("winners: {:?}; barged: {}", r.wins, r.barged);
    assert!(
        ended.is_ok(),
        "only {} wins in 60 s: {:?}",
        r.wins.len(),
        r.wins
    );
    // A task that re-enters `acquire` after others already waited should never win first. A
    // waiting task preempted between announcing itself and queueing can look barged past on a
    // loaded machine, so a few are tolerated; a barging client repeats most wins.
    assert!(
        r.barged <= WINS / 10,
        "{} of {} wins went to the task that had just released while others of the client \
         waited: {:?}",
        r.barged,
        r.wins.len(),
        r.wins
    );
}

/// `try_acquire` makes its one attempt at once, even while another task of the client is queued
/// for the same resource behind the holder: it neither joins nor waits for the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_does_not_wait_for_the_queue() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = common::client(cluster.urls(), Duration::from_secs(10));
    let held = rl.acquire("fifo").await.expect("holder acquires");
    let waiter = {
        let rl = rl.clone();
        tokio::spawn(async move { rl.acquire("fifo").await })
    };
    // Give the waiter time to queue (it passes if it has not: the assertion needs no timing).
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The holder keeps the lock until this returns: waiting for the queue would never end.
    let tried = tokio::time::timeout(Duration::from_secs(10), rl.try_acquire("fifo"))
        .await
        .expect("try_acquire does not wait behind the queued acquirer");
    assert!(tried.expect_err("the lock is held").is_busy());
    rl.release(held).await.expect("holder releases");
    let lock = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the waiter gets the lock")
        .unwrap()
        .expect("waiter acquires");
    rl.release(lock).await.expect("waiter releases");
}

/// A task of the client waiting for a lock the client itself releases is woken when the
/// release is sent, not when its quorum is confirmed: its acquire travels on the same
/// connections right behind the deletes, so it cannot overtake them, and the hand-off saves the
/// release's round trip. Measured through proxies that delay every message by 300 ms each way:
/// woken at once, the waiter's key lands about one delay after the release is sent; woken by
/// the confirmed release or by the node's notification, three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_waiter_is_woken_when_the_release_is_sent() {
    const DELAY: Duration = Duration::from_millis(300);
    let cluster = Cluster::builder()
        .nodes(3)
        .proxied(true)
        .start()
        .await
        .unwrap();
    let rl = redlock::Redlock::builder()
        .nodes(cluster.urls())
        .ttl(Duration::from_secs(30))
        .node_timeout(Duration::from_secs(3))
        // Retries only when woken (the first pause outlasts the test's checks).
        .retry(
            redlock::RetryPolicy::deadline(Duration::from_secs(20))
                .with_delay(Duration::from_secs(10), Duration::ZERO),
        )
        .build()
        .expect("valid config");
    let held = rl.acquire("early").await.expect("holder acquires");
    let waiter = {
        let rl = rl.clone();
        tokio::spawn(async move { rl.acquire("early").await })
    };
    // The waiter queues, is refused, subscribes, is refused again and waits for a release.
    let channel = format!("{}release:early", redlock::DEFAULT_KEY_PREFIX);
    assert!(
        common::eventually(Duration::from_secs(10), || async {
            common::subscribed_nodes(&cluster, &channel).await == 3
        })
        .await,
        "the waiter subscribed"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    for node in cluster.nodes() {
        node.proxy()
            .expect("proxied")
            .set_delay(DELAY, Duration::ZERO);
    }
    let token = held.token().expose().to_owned();
    let key = format!("{}lock:early", redlock::DEFAULT_KEY_PREFIX);
    let sent = std::time::Instant::now();
    let release = {
        let rl = rl.clone();
        tokio::spawn(async move { rl.release(held).await })
    };
    let mut landed = None;
    while sent.elapsed() < DELAY * 5 {
        let mut seen = false;
        for i in 0..3 {
            if let Some(v) = common::get(&cluster, i, &key).await
                && v != token
            {
                seen = true;
            }
        }
        if seen {
            landed = Some(sent.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let landed = landed.expect("the waiter's key landed on a node");
    assert!(
        landed < DELAY * 2,
        "the waiter's key landed {landed:?} after the release was sent (one-way delay {DELAY:?})"
    );
    release.await.unwrap().expect("released");
    let lock = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter returns")
        .unwrap()
        .expect("the waiter acquires");
    for node in cluster.nodes() {
        node.proxy().expect("proxied").heal();
    }
    rl.release(lock).await.expect("waiter releases");
}

/// A client's tasks hand the lock to one another without the stagger only a few times in a
/// row; then a release is open to every client's waiters alike — the releasing client's own
/// waiter hears of it no sooner than the others do. Two clients of four tasks each take 200
/// turns on one key: neither may take (nearly) all of them, and the turns change hands often.
///
/// With fair races every fifth release (one race, then four hand-offs to the winner's own
/// waiters), the turns change hands at about half of some 40 races or more: about 20 times
/// (standard deviation about 3), so fewer than 11 changes (12 runs of one client's wins) is
/// some three deviations out. A releasing client that hears of its release first wins most
/// races, and the runs are few and long (on Valkey, when the native release sent its wake-up a
/// round trip after the delete: 4–11 changes in 10 runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_hand_offs_leave_other_clients_their_share() {
    const TURNS: usize = 200;
    let cluster = Cluster::start(3).await.unwrap();
    let wins = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for c in 0..2 {
        let rl = woken_only_client(&cluster);
        for _ in 0..TASKS {
            let (rl, wins) = (rl.clone(), Arc::clone(&wins));
            tasks.push(tokio::spawn(take_turns(rl, "shared", c, wins, TURNS)));
        }
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("the turns end")
            .unwrap();
    }
    let wins = wins.lock().unwrap().clone();
    let second = wins.iter().filter(|&&c| c == 1).count();
    let runs: Vec<usize> = wins.chunk_by(|a, b| a == b).map(<[usize]>::len).collect();
    println!(
        "client 1 won {second} of {}; {} runs, longest {}",
        wins.len(),
        runs.len(),
        runs.iter().max().unwrap_or(&0)
    );
    assert!(
        second * 5 >= wins.len() && (wins.len() - second) * 5 >= wins.len(),
        "one client took nearly every turn: client 1 won {second} of {}",
        wins.len()
    );
    assert!(
        runs.len() >= 12,
        "the turns changed hands {} times in {} turns: the releasing client wins the races",
        runs.len() - 1,
        wins.len()
    );
}

/// A client with the default retry delay: a waiter that is not woken does not get in by polling.
fn woken_only_client(cluster: &Cluster) -> redlock::Redlock {
    woken_only_client_of(cluster.urls())
}

/// [`woken_only_client`] over the nodes at `urls`.
fn woken_only_client_of(urls: Vec<String>) -> redlock::Redlock {
    redlock::Redlock::builder()
        .nodes(urls)
        .ttl(Duration::from_secs(10))
        .retry(redlock::RetryPolicy::deadline(Duration::from_secs(30)))
        .build()
        .expect("valid config")
}

/// Takes turns on `resource` as contender `c`: acquires, records the win, holds for [`HOLD`],
/// releases — until `turns` wins were recorded in all.
async fn take_turns(
    rl: redlock::Redlock,
    resource: &'static str,
    c: usize,
    wins: Arc<Mutex<Vec<usize>>>,
    turns: usize,
) {
    loop {
        let lock = rl.acquire(resource).await.expect("acquire");
        let done = {
            let mut w = wins.lock().unwrap();
            w.push(c);
            w.len() >= turns
        };
        tokio::time::sleep(HOLD).await;
        rl.release(lock).await.expect("release");
        if done || wins.lock().unwrap().len() >= turns {
            return;
        }
    }
}

/// A client with a 2 s retry delay: every attempt is one a wake-up or a turn caused.
fn slow_retry_client(cluster: &Cluster) -> redlock::Redlock {
    redlock::Redlock::builder()
        .nodes(cluster.urls())
        .ttl(Duration::from_secs(10))
        .node_timeout(common::NODE_TIMEOUT)
        .retry(
            redlock::RetryPolicy::deadline(Duration::from_secs(20))
                .with_delay(Duration::from_secs(2), Duration::ZERO),
        )
        .build()
        .expect("valid config")
}

/// A waiter that waits for its own client's holder must still notice when that lock is released
/// through another client (a lock value can be handed to any client of the same nodes): that
/// release is heard as another client's message, and ends the wait.
#[tokio::test]
async fn a_waiter_hears_its_clients_lock_released_by_another_client() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = slow_retry_client(&cluster);
    let other = slow_retry_client(&cluster);
    // B takes the lock as a waiter (handed over by A), so the client knows it holds it.
    let a = rl.acquire("handed-away").await.expect("free");
    let b = {
        let rl = rl.clone();
        tokio::spawn(async move { rl.acquire("handed-away").await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    rl.release(a).await.expect("A releases");
    let b = b.await.unwrap().expect("B is handed the lock");
    // C waits for B's release; B's lock is released by the other client.
    let c = {
        let rl = rl.clone();
        tokio::spawn(async move { rl.acquire("handed-away").await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = std::time::Instant::now();
    other
        .release(b)
        .await
        .expect("the other client releases B's lock");
    let c = tokio::time::timeout(Duration::from_secs(5), c)
        .await
        .expect("C gets the lock well before the lock's TTL or its 20 s deadline")
        .unwrap()
        .expect("C acquires");
    assert!(
        released.elapsed() < Duration::from_secs(1),
        "C waited {:?} after the release, not woken by it",
        released.elapsed()
    );
    rl.release(c).await.expect("C releases");
}

/// A release reaches the nodes at different times (the releasing client's link to one of them
/// is slower). A waiter woken by the first node's message must not race the release to the
/// node its attempt asks first: it waits for that node's own message. Before, its attempt was
/// refused there, and since the other nodes' messages of a release wake nobody, it slept out its
/// 2 s retry delay with the lock free (`a_waiter_hears_its_clients_lock_released_by_another_client`
/// failed that way about once in 15 runs, when the releasing client's connections opened at
/// different speeds; here a proxy delays one node by 35 ms each way for the releasing client:
/// without the wait, 5 of 6 runs failed).
#[tokio::test]
async fn a_waiter_waits_for_the_release_to_reach_the_node_it_asks_first() {
    const RESOURCE: &str = "late-node";
    let cluster = Cluster::start(3).await.unwrap();
    let names: Vec<String> = (0..3).map(|i| format!("n{i}")).collect();
    let first = common::racing_first_node_of(&cluster, RESOURCE).await;
    let proxy = redlock_testkit::FaultProxy::start(
        format!("127.0.0.1:{}", cluster.node(first).port())
            .parse()
            .unwrap(),
    )
    .await
    .unwrap();
    let client = |late: bool| {
        let mut b = redlock::Redlock::builder();
        for (i, name) in names.iter().enumerate() {
            let url = if late && i == first {
                proxy.url()
            } else {
                cluster.node(i).url()
            };
            b = b.named_node(name.clone(), url);
        }
        b.ttl(Duration::from_secs(10))
            .node_timeout(common::NODE_TIMEOUT)
            .retry(
                redlock::RetryPolicy::deadline(Duration::from_secs(20))
                    .with_delay(Duration::from_secs(2), Duration::ZERO),
            )
            .build()
            .expect("valid config")
    };
    let rl = client(false);
    let other = client(true);
    other.connect().await;
    proxy.set_delay(Duration::from_millis(35), Duration::ZERO);

    // The lock is handed to the other client (the same token, re-acquired there), which
    // releases it; this client's waiter hears that release from the nodes.
    let held = rl.acquire(RESOURCE).await.expect("free");
    let handed = other
        .try_acquire_with_token([RESOURCE], held.token())
        .await
        .expect("the same token re-acquires the lock");
    let waiter = {
        let rl = rl.clone();
        tokio::spawn(async move { rl.acquire(RESOURCE).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = std::time::Instant::now();
    other
        .release(handed)
        .await
        .expect("the other client releases it");
    drop(held);
    let lock = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter gets the lock")
        .unwrap()
        .expect("the waiter acquires");
    assert!(
        released.elapsed() < Duration::from_secs(1),
        "the waiter took {:?} after the release: refused by the first node, it slept out its retry delay",
        released.elapsed()
    );
    rl.release(lock).await.expect("released");
}

/// While another task of the same client holds the lock, a waiter of that client has nothing to
/// gain from asking the nodes: it waits for the holder's release (which wakes it directly) and
/// then makes one attempt. It used to make one first, refused on every node, on each turn.
#[tokio::test]
async fn a_waiter_does_not_attempt_while_its_own_client_holds_the_lock() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = slow_retry_client(&cluster);
    // Open connections first: a first attempt that timed out opening them would be counted.
    rl.connect().await;
    let hold = Duration::from_millis(200);
    let attempts = common::attempts_during(async {
        // Round 1: A holds; B waits for it (refused, subscribes, refused again) and is handed
        // the lock when A releases.
        let a = rl.acquire("own-holder").await.expect("free");
        let b = {
            let rl = rl.clone();
            tokio::spawn(async move { rl.acquire("own-holder").await })
        };
        tokio::time::sleep(hold).await;
        rl.release(a).await.expect("A releases");
        let b = b.await.unwrap().expect("B is handed the lock");
        // Round 2: B holds; A, acquiring again, waits for B's release without an attempt.
        let a = {
            let rl = rl.clone();
            tokio::spawn(async move { rl.acquire("own-holder").await })
        };
        tokio::time::sleep(hold).await;
        rl.release(b).await.expect("B releases");
        let a = a.await.unwrap().expect("A is handed the lock");
        rl.release(a).await.expect("A releases");
    })
    .await;
    // A's first acquire: 1; B's: 3; A's second: 1 (2 with the refused attempt first).
    assert_eq!(attempts, vec![1.0, 1.0, 3.0]);
}

/// A client whose only task releases a hot lock and at once acquires it again heard of the
/// release before any other client's waiter (they learn of it from the nodes' messages, then
/// stagger): unless it staggers too, it wins the lock back nearly every time. Two clients of
/// one task each, both listening on the lock's channel (each waited for the other once), take
/// 100 turns: the previous winner may win the next turn too, but not nearly always.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_releasing_client_does_not_win_its_lock_back_ahead_of_another_clients_waiter() {
    const TURNS: usize = 100;
    let cluster = Cluster::start(3).await.unwrap();
    let wins = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<redlock::Redlock> = (0..2).map(|_| woken_only_client(&cluster)).collect();
    // Each client waits for the other once, so both listen on the channel.
    for (holder, waiter) in [(0, 1), (1, 0)] {
        wait_for_each_other(&clients[holder], &clients[waiter], "bounce").await;
    }
    let mut tasks = Vec::new();
    for (c, rl) in clients.into_iter().enumerate() {
        let wins = Arc::clone(&wins);
        tasks.push(tokio::spawn(take_turns(rl, "bounce", c, wins, TURNS)));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("the turns end")
            .unwrap();
    }
    let wins = wins.lock().unwrap().clone();
    // The first turns are not counted.
    let counted = &wins[10..];
    let repeats = counted.windows(2).filter(|w| w[0] == w[1]).count();
    let longest = counted.chunk_by(|a, b| a == b).map(<[usize]>::len).max();
    println!(
        "the previous winner won again {repeats} of {} times; longest run {longest:?}",
        counted.len() - 1
    );
    assert!(
        repeats * 4 <= (counted.len() - 1) * 3,
        "the releasing client won its lock back {repeats} of {} times",
        counted.len() - 1
    );
}

/// The stagger of a client that acquires the lock it just released is for the other clients'
/// waiters; with nobody else listening on the lock's channel it only delays the acquire. Client
/// A waits for B once (so A listens on the channel), then re-acquires its lock in a row: no
/// other client listens, and none of those acquires may stagger. Then B waits for A once (B
/// listens too), and A's re-acquires stagger again.
#[tokio::test]
async fn a_client_alone_on_a_once_contended_lock_does_not_stagger() {
    const ROUNDS: usize = 20;
    let cluster = Cluster::start(3).await.unwrap();
    let (a, b) = (woken_only_client(&cluster), woken_only_client(&cluster));
    wait_for_each_other(&b, &a, "alone").await;
    let alone = common::metric_during("redlock_staggers_total", rounds(&a, "alone", ROUNDS)).await;
    wait_for_each_other(&a, &b, "alone").await;
    let watched =
        common::metric_during("redlock_staggers_total", rounds(&a, "alone", ROUNDS)).await;
    println!("staggers: {alone:?} alone, {watched:?} with another client listening");
    assert!(
        alone.iter().sum::<f64>() == 0.0,
        "a client alone on the lock staggered {alone:?} times in {ROUNDS} re-acquires"
    );
    assert!(
        watched.iter().sum::<f64>() >= 1.0,
        "with another client listening, the releasing client never staggered"
    );
}

/// Two clients taking turns on a lock, each in a process of its own (here: a thread with its
/// own runtime): after each release the other client's waiter and the releasing client coming
/// back for the lock race for it. Both are races of their clients, and each client wins about
/// half of them; with the races after its own releases (the ones it loses) left out, a
/// client's share looks larger than a fair share of two, and its staggers are held back by
/// more ranges for it. The pauses added for winning more than a fair share stay small here:
/// a mean of 0.00–0.01 ranges on a quiet machine, 0.01–0.33 beside four busy loops,
/// 0.41–0.50 once in CI (test binaries side by side), 1.04 once in local lanes and 1.14 once in
/// a fresh-clone CI run (6f0fd8c: 1.38 and 0.92 for the two clients, with 102 and 99 turns);
/// with those races left out, 2.45–2.76, and 1.61–2.06 beside four busy loops. The bound is
/// 1.5, between the two (it was 1.0, which CI load crossed).
#[test]
fn two_clients_taking_turns_are_not_held_back_for_winning() {
    const TURNS: usize = 200;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cluster = rt.block_on(Cluster::start(3)).unwrap();
    let urls = cluster.urls();
    let wins = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..2)
        .map(|c| {
            let (urls, wins) = (urls.clone(), Arc::clone(&wins));
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(common::metric_during("redlock_stagger_holdback", async {
                    let rl = woken_only_client_of(urls);
                    tokio::time::timeout(
                        Duration::from_secs(60),
                        take_turns(rl, "pair", c, wins, TURNS),
                    )
                    .await
                    .expect("the turns end");
                }))
            })
        })
        .collect();
    let holdbacks: Vec<Vec<f64>> = clients.into_iter().map(|t| t.join().unwrap()).collect();
    let wins = wins.lock().unwrap().clone();
    for (c, h) in holdbacks.iter().enumerate() {
        let mean = h.iter().sum::<f64>() / h.len().max(1) as f64;
        println!(
            "client {c}: {} turns, {} staggers, mean hold-back {mean:.2} ranges",
            wins.iter().filter(|&&w| w == c).count(),
            h.len()
        );
    }
    let all: Vec<f64> = holdbacks.concat();
    let mean = all.iter().sum::<f64>() / all.len().max(1) as f64;
    assert!(
        all.len() >= TURNS / 2,
        "the two clients raced for the lock: {} staggers in {} turns",
        all.len(),
        wins.len()
    );
    assert!(
        mean <= 1.5,
        "two clients sharing the lock were held back by {mean:.2} stagger ranges on average"
    );
}

/// A client that never waited for a lock does not listen on its channel. When another client's
/// waiter listens, it hears of the holder's release later than the holder itself, and staggers;
/// the holder coming back for the lock must stagger too, or it wins the lock back every time.
/// A holds, B waits; A releases and at once acquires again: that acquire draws a stagger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_waited_staggers_after_a_release_another_client_heard() {
    let cluster = Cluster::start(3).await.unwrap();
    let (a, b) = (woken_only_client(&cluster), woken_only_client(&cluster));
    let lock = a.acquire("never").await.expect("free");
    let waiting = tokio::spawn(async move {
        let lock = b.acquire("never").await.expect("handed over");
        b.release(lock).await.expect("release");
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Only this thread's metrics are seen: A's calls, not B's task.
    let staggers = common::metric_during("redlock_staggers_total", async {
        a.release(lock).await.expect("release");
        let lock = a.acquire("never").await.expect("acquire again");
        a.release(lock).await.expect("release");
    })
    .await;
    waiting.await.unwrap();
    println!("staggers of the releasing client: {staggers:?}");
    assert!(
        staggers.iter().sum::<f64>() >= 1.0,
        "a client that never waited re-acquired at once after a release another client heard"
    );
}

/// Every fifth release by a client with local waiters is open to every client's waiters
/// (`LOCAL_STREAK`), and its own waiters then stagger like the others'. With no other client
/// listening on the lock's channel, that stagger races nobody: four tasks of one client taking
/// 60 turns draw none.
#[tokio::test]
async fn tasks_of_a_client_alone_on_a_lock_take_turns_without_staggers() {
    const TURNS: usize = 60;
    let cluster = Cluster::start(3).await.unwrap();
    let rl = woken_only_client(&cluster);
    let wins = Arc::new(Mutex::new(Vec::new()));
    let staggers = common::metric_during("redlock_staggers_total", async {
        let tasks: Vec<_> = (0..TASKS)
            .map(|c| tokio::spawn(take_turns(rl.clone(), "own", c, Arc::clone(&wins), TURNS)))
            .collect();
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .expect("the turns end")
                .unwrap();
        }
    })
    .await;
    let wins = wins.lock().unwrap().clone();
    let winners: BTreeSet<usize> = wins.iter().copied().collect();
    println!(
        "{} turns won by {winners:?}; staggers {staggers:?}",
        wins.len()
    );
    assert_eq!(winners.len(), TASKS, "every task won turns");
    assert!(
        staggers.iter().sum::<f64>() == 0.0,
        "tasks of a client alone on the lock staggered {staggers:?} times in {} turns",
        wins.len()
    );
}

/// `holder` takes `resource`, `waiter` waits for it (and so listens on its channel), `holder`
/// releases, and `waiter` releases what it was handed.
async fn wait_for_each_other(holder: &redlock::Redlock, waiter: &redlock::Redlock, resource: &str) {
    let lock = holder.acquire(resource).await.expect("free");
    let waiting = {
        let (rl, resource) = (waiter.clone(), resource.to_owned());
        tokio::spawn(async move { rl.acquire(&resource).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.release(lock).await.expect("release");
    let lock = waiting.await.unwrap().expect("handed over");
    waiter.release(lock).await.expect("release");
}

/// Acquires and releases `resource` `n` times in a row.
async fn rounds(rl: &redlock::Redlock, resource: &str, n: usize) {
    for _ in 0..n {
        let lock = rl.acquire(resource).await.expect("free");
        rl.release(lock).await.expect("release");
    }
}

/// Eight clients of one task each on one node take turns on a hot key for 3 s. A node sends a
/// release's message to its subscribers one after another in the order they subscribed, so the
/// same clients hear every release first; with a stagger of only two round trips (about 0.2 ms
/// on one local node) that head start decided most turns (the fewest wins of one client were
/// 85–97 of about 1,800 in three runs). Every client must get at least half a fair share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_hear_releases_later_still_get_their_share() {
    const CLIENTS: usize = 8;
    let cluster = Cluster::start(1).await.unwrap();
    let wins = Arc::new(Mutex::new(vec![0usize; CLIENTS]));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let rl = woken_only_client(&cluster);
        let (wins, stop) = (Arc::clone(&wins), Arc::clone(&stop));
        tasks.push(tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let lock = rl.acquire("fair").await.expect("acquire");
                wins.lock().unwrap()[c] += 1;
                tokio::task::spawn_blocking(|| std::thread::sleep(HOLD))
                    .await
                    .unwrap();
                rl.release(lock).await.expect("release");
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("the turns end")
            .unwrap();
    }
    let wins = wins.lock().unwrap().clone();
    let total: usize = wins.iter().sum();
    let fewest = *wins.iter().min().unwrap();
    println!("wins per client: {wins:?}");
    assert!(
        fewest * CLIENTS * 2 >= total,
        "a client won {fewest} of {total} turns (a fair share is {}): {wins:?}",
        total / CLIENTS
    );
}

/// Every client's waiter hears a release and, after its stagger, races the others for the lock.
/// Sent to every node at once, each racer's attempt costs every node a request, and two attempts
/// made within a round trip of each other can each win some nodes and neither a quorum (a split
/// vote: both clean up and try again). Six clients of one task each take 150 turns on 5 nodes,
/// on two threads; their races go through one node first, where a loser is refused before it
/// asks any other node. Counted on the nodes: the `SET`s the acquire script runs per turn (one
/// per node asked, refused or not, plus the claim stamp's per grant) and the split votes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_clients_ask_one_node_first() {
    const CLIENTS: usize = 6;
    const TURNS: usize = 150;
    let cluster = Cluster::start(5).await.unwrap();
    let wins = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<redlock::Redlock> =
        (0..CLIENTS).map(|_| woken_only_client(&cluster)).collect();
    // Every client waits once, so that all of them listen on the lock's channel.
    for c in 1..CLIENTS {
        wait_for_each_other(&clients[0], &clients[c], "race").await;
    }
    let sets_before = sets(&cluster).await;
    let mut tasks = Vec::new();
    for (c, rl) in clients.into_iter().enumerate() {
        tasks.push(tokio::spawn(take_turns(
            rl,
            "race",
            c,
            Arc::clone(&wins),
            TURNS,
        )));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("the turns end")
            .unwrap();
    }
    let turns = wins.lock().unwrap().len();
    let sets = sets(&cluster).await - sets_before;
    #[allow(clippy::cast_precision_loss)]
    let per_turn = sets as f64 / turns as f64;
    println!("{sets} SETs in {turns} turns: {per_turn:.1} per turn");
    // A winner: 5 nodes, 5 stamps. Each other racer: 1 node here, 5 if it asked every node.
    assert!(
        per_turn < 20.0,
        "{per_turn:.1} SETs per turn: the racers asked every node"
    );
}

/// `SET` calls on every node of `cluster` so far (the acquire script's, among others).
async fn sets(cluster: &Cluster) -> u64 {
    let mut n = 0;
    for node in cluster.nodes() {
        n += node.command_calls("set").await;
    }
    n
}

/// A task waiting for a lock that a guard of its own client holds waits for the guard's
/// release for as long as the renewals keep the lock: the client knew the lock as held only
/// until the validity it had when it was taken, and once that passed the waiter attempted at
/// every retry delay, refused each time, while the guard still held the lock. (The TTL is 1 s,
/// the guard held for three: a 300 ms TTL left a busy machine too little room to renew it on
/// this test's one thread.)
#[tokio::test(flavor = "current_thread")]
async fn a_waiter_behind_its_clients_renewed_guard_waits_for_the_release() {
    const TTL: Duration = Duration::from_secs(1);
    const HELD: Duration = Duration::from_secs(3);
    let cluster = Cluster::start(3).await.expect("cluster");
    let rl = redlock::Redlock::builder()
        .nodes(cluster.urls())
        .ttl(TTL)
        .node_timeout(common::NODE_TIMEOUT)
        .retry(
            redlock::RetryPolicy::deadline(Duration::from_secs(10))
                .with_delay(Duration::from_millis(50), Duration::ZERO),
        )
        .build()
        .expect("valid config");
    let guard = rl.lock("renewed-here").guard().await.expect("free");
    let attempts = common::attempts_during(async {
        let waiter = rl.clone();
        let w = tokio::spawn(async move { waiter.acquire("renewed-here").await });
        tokio::time::sleep(HELD).await;
        assert!(!w.is_finished(), "the guard still holds the lock");
        guard.release().await.expect("release");
        let won = w
            .await
            .expect("waiter task")
            .expect("the waiter wins after the release");
        rl.release(won).await.expect("release");
    })
    .await;
    assert_eq!(attempts.len(), 1, "one acquire: {attempts:?}");
    // The first attempt, made before anything was known, and the one after the release.
    assert!(
        attempts[0] <= 2.0,
        "the waiter made {} attempts while its client's guard held the lock for {HELD:?}, \
         renewed past its first validity of {TTL:?}",
        attempts[0]
    );
}

/// Waiting for its own client's guard ends where the retry policy ends it, however long the
/// guard's renewals hold the lock: the call gives up `Busy` (a task that awaits the lock its
/// own guard holds must not hang for as long as the guard lives), after waiting for the guard
/// rather than attempting, and says so (`GaveUp::LocalHolder`). The guard's TTL is 1 s: the
/// default policy's 2 s still outlast two of them.
#[tokio::test(flavor = "current_thread")]
async fn a_wait_behind_its_clients_guard_ends_with_the_policy() {
    let cluster = Cluster::start(3).await.expect("cluster");
    let rl = redlock::Redlock::builder()
        .nodes(cluster.urls())
        .ttl(Duration::from_secs(1))
        .node_timeout(common::NODE_TIMEOUT)
        .build()
        .expect("valid config");
    let guard = rl.lock("held-here").guard().await.expect("free");
    let gave_up = |e: &redlock::Error| e.retries().map(|r| (r.gave_up, r.attempts));
    for wait in [Duration::from_millis(700), Duration::ZERO] {
        let started = std::time::Instant::now();
        let e = rl
            .lock("held-here")
            .wait(wait)
            .acquire()
            .await
            .expect_err("the guard holds the lock");
        let took = started.elapsed();
        assert!(e.is_busy(), "{e}");
        assert!(
            took >= wait && took < wait + Duration::from_millis(600),
            "a wait of {wait:?} gave up after {took:?}: {e}"
        );
        if !wait.is_zero() {
            assert!(
                matches!(gave_up(&e), Some((redlock::GaveUp::LocalHolder, 1..=2))),
                "{:?}: {e}",
                gave_up(&e)
            );
        }
    }
    // The default policy: ten attempts, 100 ms ± 50 ms apart, with a 50 ms node timeout
    // each, 2 s at most — spent waiting for the guard's release, then one attempt. (It took
    // its ten attempts on top of the wait, 2.7–3.1 s, while the guard was looked up but the
    // wait did not end the call; without the lookup it made them, refused, about 1 s.)
    let started = std::time::Instant::now();
    let e = rl
        .acquire("held-here")
        .await
        .expect_err("the guard holds the lock");
    let took = started.elapsed();
    println!("the default policy gave up after {took:?}: {e}");
    assert!(e.is_busy(), "{e}");
    assert!(
        matches!(gave_up(&e), Some((redlock::GaveUp::LocalHolder, 1..=2))),
        "{:?}: {e}",
        gave_up(&e)
    );
    assert!(
        took >= Duration::from_millis(1_900) && took < Duration::from_millis(2_600),
        "the default policy gave up after {took:?}"
    );
    assert!(!guard.is_lost(), "renewed all along");
    guard.release().await.expect("release");
}

/// A wait that ends at its deadline without this client holding the lock gives up for the
/// deadline, not `GaveUp::LocalHolder`: a refusal that came back just before the deadline left
/// a wait of a few microseconds for a local holder (there was none), which the call counted
/// as a whole wait behind its own holder (3 of 300 such waits here; one in CI on Valkey, in
/// `errors::busy_names_the_resource_and_keeps_its_retries`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_another_clients_lock_gives_up_for_its_deadline() {
    let cluster = Cluster::start(3).await.expect("cluster");
    let holder = redlock::Redlock::builder()
        .nodes(cluster.urls())
        .build()
        .expect("valid config");
    let waiter = redlock::Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(common::NODE_TIMEOUT)
        .retry(
            redlock::RetryPolicy::deadline(Duration::from_secs(1))
                .with_delay(Duration::from_millis(1), Duration::ZERO),
        )
        .build()
        .expect("valid config");
    let lock = holder.acquire("held-elsewhere").await.expect("free");
    let mut reasons = std::collections::BTreeMap::new();
    // Waits of 3.0 to 14 ms, so that some refusal comes back just before a deadline.
    for i in 0..300u64 {
        let e = waiter
            .lock("held-elsewhere")
            .wait(Duration::from_micros(3_000 + i * 37))
            .acquire()
            .await
            .expect_err("held by the other client");
        let reason = e.retries().expect("a Busy keeps its retries").gave_up;
        *reasons.entry(format!("{reason:?}")).or_insert(0) += 1;
    }
    holder.release(lock).await.expect("release");
    assert_eq!(
        reasons.keys().collect::<Vec<_>>(),
        ["Deadline"],
        "{reasons:?}"
    );
}
