//! `redlock doctor`: checks every node for what a Redlock deployment needs — reachable, a
//! master, no eviction, persistence or a restart quarantine, a sane clock, a round trip well
//! inside the node timeout, the ACL permissions of every command the client sends — and the
//! node list as a whole (independent servers, an odd N of at least 3).
//!
//! Every probe is harmless: writes go to a fresh key under the key prefix that expires within
//! seconds (and is deleted), and the identity and stamp records are only written inside a
//! script that deletes what it created, so nobody ever sees it.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::future::join_all;
use redis::aio::MultiplexedConnection;
use serde::Serialize;

use crate::args::DoctorArgs;
use crate::direct::{Node, info_field};
use crate::exit::{self, Failure};
use crate::output::Table;
use crate::settings::Settings;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
enum Level {
    Ok,
    Warn,
    Error,
}

impl Level {
    fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Warn => "warn",
            Self::Error => "error",
        }
    }
}

/// One line of the report.
#[derive(Debug, Serialize)]
struct Finding {
    level: Level,
    /// The node's name, or `None` for the node list as a whole.
    node: Option<String>,
    check: &'static str,
    message: String,
}

/// The whole report.
#[derive(Debug, Serialize)]
struct Report {
    nodes_total: usize,
    quorum: usize,
    reachable: usize,
    errors: usize,
    warnings: usize,
    findings: Vec<Finding>,
}

/// How many reachable nodes are past the restart quarantine `q` (by their servers' uptime),
/// and so count toward a quorum. A fresh or just restarted cluster reported "ok" while no
/// lock could be taken for up to `q` (found in review). A node that lost its data while it ran
/// (`FLUSHALL`) is quarantined by the client from its identity record's age, which this does
/// not read.
fn quarantine_finding(results: &[NodeResult], q: Duration, n: usize, quorum: usize) -> Finding {
    let past = |u: u64| Duration::from_secs(u) >= q;
    let up: Vec<u64> = results
        .iter()
        .filter(|r| r.reachable)
        .filter_map(|r| r.uptime)
        .collect();
    let voting = up.iter().filter(|&&u| past(u)).count();
    let longest = up
        .iter()
        .filter(|&&u| !past(u))
        .map(|&u| q.saturating_sub(Duration::from_secs(u)))
        .max();
    let (level, message) = match longest {
        Some(left) if voting < quorum => (
            Level::Warn,
            format!(
                "only {voting} of {n} nodes are past the restart quarantine ({}); no lock can be taken for up to {} more (quorum {quorum})",
                humantime::format_duration(q),
                humantime::format_duration(left)
            ),
        ),
        Some(left) => (
            Level::Ok,
            format!(
                "{voting} of {n} nodes vote (quorum {quorum}); {} still in the restart quarantine, for up to {} more",
                up.len() - voting,
                humantime::format_duration(left)
            ),
        ),
        None => (
            Level::Ok,
            format!(
                "{voting} of {n} nodes are past the restart quarantine ({})",
                humantime::format_duration(q)
            ),
        ),
    };
    Finding {
        level,
        node: None,
        check: "quarantine",
        message,
    }
}

/// What one node's checks found, and what the cross-node checks need from it.
#[derive(Debug, Default)]
struct NodeResult {
    findings: Vec<(Level, &'static str, String)>,
    reachable: bool,
    run_id: Option<String>,
    identity: Option<String>,
    /// The server's `uptime_in_seconds`, when `INFO` answered.
    uptime: Option<u64>,
}

impl NodeResult {
    fn add(&mut self, level: Level, check: &'static str, message: impl Into<String>) {
        self.findings.push((level, check, message.into()));
    }
}

/// What the checks need to know besides the node.
#[derive(Debug)]
struct Context {
    prefix: String,
    node_timeout: Duration,
    quarantine: Option<Duration>,
    clock_sample: Duration,
    drift_factor: f64,
    probe_id: String,
}

pub(crate) async fn run(settings: &Settings, args: &DoctorArgs) -> Result<u8, Failure> {
    let rl = settings.build(settings.lockless_builder())?;
    if !(args.drift_factor.is_finite() && (0.0..0.5).contains(&args.drift_factor)) {
        return Err(Failure::usage("--drift-factor must be in [0, 0.5)"));
    }
    let mut random = [0u8; 8];
    getrandom::fill(&mut random)
        .map_err(|e| Failure::new(exit::OS_ERROR, format!("no randomness: {e}")))?;
    let ctx = Context {
        prefix: settings.prefix().to_owned(),
        node_timeout: settings.timeout(),
        quarantine: settings.restart_quarantine.map(|(q, _)| q),
        clock_sample: args.clock_sample,
        drift_factor: args.drift_factor,
        probe_id: random.iter().map(|b| format!("{b:02x}")).collect(),
    };
    // Probes may be slower than lock requests (INFO, a pub/sub connection): allow more.
    let probe_timeout = (ctx.node_timeout * 4).max(Duration::from_secs(1));
    let nodes = Node::all(settings, probe_timeout);
    let results = join_all(nodes.iter().map(|n| check_node(n, &ctx))).await;

    let mut findings = Vec::new();
    let n = nodes.len();
    let quorum = rl.quorum();
    let reachable = results.iter().filter(|r| r.reachable).count();
    let cluster = |level, check, message: String| Finding {
        level,
        node: None,
        check,
        message,
    };
    findings.push(match n {
        _ if n < 3 => cluster(
            Level::Warn,
            "node count",
            format!("{n} node(s): no node may fail; run an odd number of at least 3 independent masters"),
        ),
        _ if n.is_multiple_of(2) => cluster(
            Level::Warn,
            "node count",
            format!(
                "{n} nodes (quorum {quorum}) tolerate {} failure(s), no more than {} nodes would; use an odd number",
                n - quorum,
                n - 1
            ),
        ),
        _ => cluster(
            Level::Ok,
            "node count",
            format!("{n} nodes, quorum {quorum}: {} may fail", n - quorum),
        ),
    });
    findings.push(if reachable >= quorum {
        cluster(
            Level::Ok,
            "quorum",
            format!("{reachable} of {n} nodes reachable (quorum {quorum})"),
        )
    } else {
        cluster(
            Level::Error,
            "quorum",
            format!("only {reachable} of {n} nodes reachable; a lock needs {quorum}"),
        )
    });
    if let Some(q) = ctx.quarantine {
        findings.push(quarantine_finding(&results, q, n, quorum));
    }
    let mut independent = true;
    for i in 0..n {
        for j in i + 1..n {
            let (a, b) = (&results[i], &results[j]);
            if a.run_id.is_some() && a.run_id == b.run_id {
                independent = false;
                findings.push(cluster(
                    Level::Error,
                    "independence",
                    format!(
                        "nodes #{i} ({}) and #{j} ({}) are the same server (same run_id): it would vote twice; the client refuses such a list",
                        nodes[i].name, nodes[j].name
                    ),
                ));
            } else if a.identity.is_some() && a.identity == b.identity {
                independent = false;
                findings.push(cluster(
                    Level::Error,
                    "independence",
                    format!(
                        "nodes #{i} ({}) and #{j} ({}) hold the same identity record (one restored from the other's data?): the client takes them for one server and refuses the list; delete the record {}node on one of them",
                        nodes[i].name, nodes[j].name, ctx.prefix
                    ),
                ));
            }
        }
    }
    if independent && reachable > 0 {
        findings.push(cluster(
            Level::Ok,
            "independence",
            "every reachable node is a different server".into(),
        ));
    }
    for (node, result) in nodes.iter().zip(results) {
        for (level, check, message) in result.findings {
            findings.push(Finding {
                level,
                node: Some(node.name.clone()),
                check,
                message: node.scrub(&message),
            });
        }
    }
    let errors = findings.iter().filter(|f| f.level == Level::Error).count();
    let warnings = findings.iter().filter(|f| f.level == Level::Warn).count();
    let report = Report {
        nodes_total: n,
        quorum,
        reachable,
        errors,
        warnings,
        findings,
    };
    if args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| Failure::new(exit::SOFTWARE, format!("JSON: {e}")))?;
        outln!("{text}");
    } else {
        let mut table = Table::new(["LEVEL", "NODE", "CHECK", "FINDING"]);
        for f in &report.findings {
            table.row([
                f.level.label().to_owned(),
                f.node.clone().unwrap_or_else(|| "(all)".into()),
                f.check.to_owned(),
                f.message.clone(),
            ]);
        }
        table.print();
        outln!("{errors} error(s), {warnings} warning(s)");
    }
    Ok(if errors > 0 {
        exit::DOCTOR_FAILED
    } else {
        exit::OK
    })
}

/// Every check of one node.
async fn check_node(node: &Node, ctx: &Context) -> NodeResult {
    let mut r = NodeResult::default();
    let mut conn = match node.connect().await {
        Ok(conn) => conn,
        Err(e) => {
            r.add(Level::Error, "reachable", format!("no: {e}"));
            return r;
        }
    };
    r.reachable = true;
    check_rtt(&mut conn, ctx, &mut r).await;
    check_info(&mut conn, node, ctx, &mut r).await;
    check_config(&mut conn, node, ctx, &mut r).await;
    check_acl(&mut conn, node, ctx, &mut r).await;
    check_clock(&mut conn, ctx, &mut r).await;
    r
}

fn is_noperm(e: &redis::RedisError) -> bool {
    e.code() == Some("NOPERM") || e.to_string().contains("NOPERM")
}

async fn check_rtt(conn: &mut MultiplexedConnection, ctx: &Context, r: &mut NodeResult) {
    let mut rtts = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        match redis::cmd("PING").query_async::<String>(conn).await {
            Ok(_) => rtts.push(t.elapsed()),
            Err(e) => {
                let level = if is_noperm(&e) {
                    Level::Warn
                } else {
                    Level::Error
                };
                r.add(level, "round trip", format!("PING failed: {e}"));
                return;
            }
        }
    }
    rtts.sort();
    let median = rtts[rtts.len() / 2];
    let (level, note) = if median >= ctx.node_timeout {
        (
            Level::Error,
            ": at or above the node timeout, every request would time out",
        )
    } else if median * 2 >= ctx.node_timeout {
        (
            Level::Warn,
            ": over half the node timeout; raise --node-timeout",
        )
    } else {
        (Level::Ok, "")
    };
    r.add(
        level,
        "round trip",
        format!(
            "median {:.2}ms of 5 PINGs (node timeout {}){note}",
            median.as_secs_f64() * 1000.0,
            humantime::format_duration(ctx.node_timeout)
        ),
    );
}

async fn check_info(
    conn: &mut MultiplexedConnection,
    node: &Node,
    ctx: &Context,
    r: &mut NodeResult,
) {
    let info = async |section: &str, conn: &mut MultiplexedConnection| {
        redis::cmd("INFO")
            .arg(section)
            .query_async::<String>(conn)
            .await
    };
    match info("server", conn).await {
        Ok(server) => {
            let (name, version) = match (
                info_field(&server, "server_name"),
                info_field(&server, "valkey_version"),
            ) {
                (Some(name), Some(v)) => (name.to_owned(), v.to_owned()),
                (Some(name), None) => (
                    name.to_owned(),
                    info_field(&server, "redis_version")
                        .unwrap_or("?")
                        .to_owned(),
                ),
                (None, _) => (
                    "redis".to_owned(),
                    info_field(&server, "redis_version")
                        .unwrap_or("?")
                        .to_owned(),
                ),
            };
            let uptime = info_field(&server, "uptime_in_seconds").unwrap_or("?");
            r.add(
                Level::Ok,
                "server",
                format!("{name} {version}, up {uptime}s"),
            );
            r.run_id = info_field(&server, "run_id").map(str::to_owned);
            // Counted on the server's wall clock: negative once stepped back past its start,
            // which the client takes for a fresh start (quarantined), and so does this.
            r.uptime = uptime
                .parse::<i64>()
                .ok()
                .map(|u| u64::try_from(u).unwrap_or(0));
        }
        Err(e) => {
            let level = if ctx.quarantine.is_some() {
                Level::Error
            } else {
                Level::Warn
            };
            let why = if ctx.quarantine.is_some() {
                "the restart quarantine reads uptime with INFO: the client cannot connect (grant +info)"
            } else {
                "server, role and duplicates not checked"
            };
            r.add(
                level,
                "server",
                format!("INFO failed ({}): {why}", node.error(&e)),
            );
            return;
        }
    }
    match info("replication", conn).await {
        Ok(repl) => match info_field(&repl, "role") {
            Some("master") => {
                let replicas = info_field(&repl, "connected_slaves")
                    .and_then(|v| v.parse::<u32>().ok())
                    .unwrap_or(0);
                if replicas > 0 {
                    r.add(
                        Level::Warn,
                        "role",
                        format!("master with {replicas} replica(s): replication is asynchronous, so a failover can lose granted locks; Redlock needs no replicas"),
                    );
                } else {
                    r.add(Level::Ok, "role", "master, no replicas");
                }
            }
            Some(role) => r.add(
                Level::Error,
                "role",
                format!("{role} (a replica): Redlock needs independent masters; writes fail here"),
            ),
            None => r.add(Level::Warn, "role", "INFO replication has no role"),
        },
        Err(e) => r.add(
            Level::Warn,
            "role",
            format!("INFO replication failed: {}", node.error(&e)),
        ),
    }
}

async fn config_get(
    conn: &mut MultiplexedConnection,
    name: &str,
) -> Result<Option<String>, redis::RedisError> {
    let pairs: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query_async(conn)
        .await?;
    Ok(pairs.get(1).cloned())
}

async fn check_config(
    conn: &mut MultiplexedConnection,
    node: &Node,
    ctx: &Context,
    r: &mut NodeResult,
) {
    let mut values = Vec::new();
    for name in [
        "maxmemory-policy",
        "maxmemory",
        "appendonly",
        "appendfsync",
        "save",
    ] {
        match config_get(conn, name).await {
            Ok(v) => values.push(v.unwrap_or_default()),
            Err(e) => {
                let why = if is_noperm(&e) {
                    "denied by ACL"
                } else {
                    "failed"
                };
                r.add(
                    Level::Warn,
                    "config",
                    format!(
                        "CONFIG GET {why} ({}): eviction policy and persistence not checked",
                        node.error(&e)
                    ),
                );
                return;
            }
        }
    }
    let [policy, maxmemory, aof, fsync, save] =
        <[String; 5]>::try_from(values).unwrap_or_else(|_| Default::default());
    match (policy.as_str(), maxmemory.as_str()) {
        ("noeviction", _) => r.add(Level::Ok, "eviction", "maxmemory-policy noeviction"),
        (p, "0") => r.add(
            Level::Warn,
            "eviction",
            format!("maxmemory-policy {p} with no maxmemory: nothing is evicted now, but under a memory limit a lock key could be, freeing a held lock; set noeviction"),
        ),
        (p, m) => r.add(
            Level::Error,
            "eviction",
            format!("maxmemory-policy {p} with maxmemory {m}: lock keys can be evicted, freeing held locks; set noeviction"),
        ),
    }
    let rdb = if save.trim().is_empty() {
        String::new()
    } else {
        format!("; RDB snapshots (save {save}) bring back older data, not the last grants")
    };
    match (aof.as_str(), fsync.as_str(), ctx.quarantine) {
        ("yes", "always", _) => r.add(
            Level::Ok,
            "persistence",
            "AOF with appendfsync always: a restart keeps every granted lock",
        ),
        (_, _, Some(q)) => r.add(
            Level::Ok,
            "persistence",
            format!(
                "appendonly {aof}, appendfsync {fsync}; restart quarantine {}: a restarted node sits out (at least the longest TTL)",
                humantime::format_duration(q)
            ),
        ),
        ("yes", f, None) => r.add(
            Level::Warn,
            "persistence",
            format!("AOF with appendfsync {f}: a crash can lose the last grants and the node may grant a held lock again; use --restart-quarantine (≥ the longest TTL) or appendfsync always{rdb}"),
        ),
        (_, _, None) => r.add(
            Level::Warn,
            "persistence",
            format!("no AOF: a restart loses this node's lock keys and it may grant a held lock again; use --restart-quarantine (≥ the longest TTL) or appendonly yes + appendfsync always{rdb}"),
        ),
    }
}

/// The probe script: runs every command the client's scripts run, each in `pcall`, and returns
/// the errors. `KEYS[1]` = a fresh probe key, `KEYS[2]` / `KEYS[3]` = the identity and stamp
/// records, `ARGV[1]` = a wake-up channel. A record the probe creates is deleted at once, in
/// the same atomic script.
const PROBE: &str = r"
local out = {}
local function try(name, ...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then out[#out + 1] = name .. ': ' .. r.err end
  return r
end
try('SET', 'SET', KEYS[1], 'probe', 'NX', 'PX', 5000)
try('GET', 'GET', KEYS[1])
try('PEXPIRE', 'PEXPIRE', KEYS[1], 5000)
try('PTTL', 'PTTL', KEYS[1])
try('TIME', 'TIME')
try('PUBLISH', 'PUBLISH', ARGV[1], '')
local del = try('DEL', 'DEL', KEYS[1])
if type(del) == 'table' and del.err then return out end
for i = 2, 3 do
  try('GET ' .. KEYS[i], 'GET', KEYS[i])
  local r = try('SET ' .. KEYS[i], 'SET', KEYS[i], 'probe', 'NX')
  if type(r) == 'table' and r.ok then redis.call('DEL', KEYS[i]) end
end
return out
";

async fn check_acl(
    conn: &mut MultiplexedConnection,
    node: &Node,
    ctx: &Context,
    r: &mut NodeResult,
) {
    let key = format!("{}doctor:{}", ctx.prefix, ctx.probe_id);
    let identity = format!("{}node", ctx.prefix);
    let stamp = format!("{}stamp", ctx.prefix);
    let channel = format!("{}release:doctor:{}", ctx.prefix, ctx.probe_id);
    let mut denied: Vec<String> = Vec::new();
    let failed = |denied: &mut Vec<String>, what: &str, e: &redis::RedisError| {
        denied.push(format!("{what}: {}", node.error(e)));
    };

    // Connection set-up: scripts preloaded, server features asked.
    let sha = match redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(PROBE)
        .query_async::<String>(conn)
        .await
    {
        Ok(sha) => Some(sha),
        Err(e) => {
            failed(&mut denied, "SCRIPT LOAD", &e);
            None
        }
    };
    if let Err(e) = redis::cmd("HELLO").query_async::<redis::Value>(conn).await
        && is_noperm(&e)
    {
        r.add(
            Level::Warn,
            "acl",
            format!(
                "HELLO denied ({}): the client uses scripts instead of native commands",
                node.error(&e)
            ),
        );
    }
    // Lock requests: the scripts by SHA (EVAL when the cache was flushed), plain SET NX PX.
    let keys = [key.as_str(), identity.as_str(), stamp.as_str()];
    let inner: Option<Vec<String>> = match &sha {
        Some(sha) => match redis::cmd("EVALSHA")
            .arg(sha)
            .arg(3)
            .arg(&keys)
            .arg(&channel)
            .query_async::<Vec<String>>(conn)
            .await
        {
            Ok(v) => Some(v),
            Err(e) => {
                failed(&mut denied, "EVALSHA", &e);
                None
            }
        },
        None => None,
    };
    let inner = match redis::cmd("EVAL")
        .arg(PROBE)
        .arg(3)
        .arg(&keys)
        .arg(&channel)
        .query_async::<Vec<String>>(conn)
        .await
    {
        Ok(v) => inner.or(Some(v)),
        Err(e) => {
            failed(&mut denied, "EVAL", &e);
            inner
        }
    };
    let mut publish_denied = false;
    for e in inner.unwrap_or_default() {
        if e.starts_with("PUBLISH") {
            publish_denied = true;
        } else {
            denied.push(format!("in a script: {}", node.scrub(&e)));
        }
    }
    let plain: redis::RedisResult<Option<String>> = redis::cmd("SET")
        .arg(&key)
        .arg("probe")
        .arg("NX")
        .arg("PX")
        .arg(5000)
        .query_async(conn)
        .await;
    if let Err(e) = plain {
        failed(&mut denied, "SET NX PX", &e);
    }
    // Native owner-checked deletes of newer servers (used for a lone release).
    for (what, cmd) in [
        ("DELEX", {
            let mut c = redis::cmd("DELEX");
            c.arg(&key).arg("IFEQ").arg("probe");
            c
        }),
        ("DELIFEQ", {
            let mut c = redis::cmd("DELIFEQ");
            c.arg(&key).arg("probe");
            c
        }),
    ] {
        if let Err(e) = cmd.query_async::<redis::Value>(conn).await
            && is_noperm(&e)
        {
            failed(&mut denied, what, &e);
        }
    }
    // Release wake-ups: PUBLISH (best effort), SUBSCRIBE for waiters.
    if let Err(e) = redis::cmd("PUBLISH")
        .arg(&channel)
        .arg("")
        .query_async::<i64>(conn)
        .await
    {
        publish_denied |= is_noperm(&e);
    }
    let subscribe = match node.pubsub().await {
        Ok(mut pubsub) => {
            match tokio::time::timeout(node.timeout, pubsub.subscribe(&channel)).await {
                Ok(Ok(())) => {
                    let _ = tokio::time::timeout(node.timeout, pubsub.unsubscribe(&channel)).await;
                    Ok(())
                }
                Ok(Err(e)) => Err(node.error(&e)),
                Err(_) => Err("no answer".to_owned()),
            }
        }
        Err(e) => Err(e),
    };
    let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(&key).query_async(conn).await;

    if identity_read(conn, &identity, r).await.is_err() {
        denied.push(format!("GET {identity}: denied"));
    }
    if denied.is_empty() {
        r.add(
            Level::Ok,
            "acl",
            format!("lock commands allowed (SCRIPT LOAD, EVALSHA, EVAL, SET, GET, PEXPIRE, DEL, TIME on {}*)", ctx.prefix),
        );
    } else {
        r.add(
            Level::Error,
            "acl",
            format!("the client cannot work: {}", denied.join("; ")),
        );
    }
    match (publish_denied, subscribe) {
        (false, Ok(())) => r.add(Level::Ok, "pub/sub", "PUBLISH and SUBSCRIBE allowed on the release channels"),
        (p, s) => r.add(
            Level::Warn,
            "pub/sub",
            format!(
                "{}: waiters are not woken by releases and retry on their own schedule (grant &{}release:*)",
                p.then(|| "PUBLISH denied".to_owned())
                    .into_iter()
                    .chain(s.err().map(|e| format!("SUBSCRIBE failed ({e})")))
                    .collect::<Vec<_>>()
                    .join("; "),
                ctx.prefix
            ),
        ),
    }
}

/// Reads the node's identity record (for duplicate detection).
async fn identity_read(
    conn: &mut MultiplexedConnection,
    identity: &str,
    r: &mut NodeResult,
) -> Result<(), ()> {
    match redis::cmd("GET")
        .arg(identity)
        .query_async::<Option<String>>(conn)
        .await
    {
        Ok(v) => {
            r.identity = v;
            Ok(())
        }
        Err(e) if is_noperm(&e) => Err(()),
        Err(_) => Ok(()),
    }
}

/// One `TIME` reading: (server time, local wall time at the midpoint, monotonic midpoint,
/// round trip).
async fn time_sample(
    conn: &mut MultiplexedConnection,
) -> redis::RedisResult<(f64, f64, Instant, Duration)> {
    let wall_before = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let before = Instant::now();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await?;
    let rtt = before.elapsed();
    let server = secs as f64 + micros as f64 / 1e6;
    let local = wall_before.as_secs_f64() + rtt.as_secs_f64() / 2.0;
    Ok((server, local, before + rtt / 2, rtt))
}

async fn check_clock(conn: &mut MultiplexedConnection, ctx: &Context, r: &mut NodeResult) {
    let first = time_sample(conn).await;
    tokio::time::sleep(ctx.clock_sample).await;
    let second = time_sample(conn).await;
    let ((s1, l1, m1, rtt1), (s2, l2, m2, rtt2)) = match (first, second) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            r.add(Level::Warn, "clock", format!("TIME failed: {e}"));
            return;
        }
    };
    let skew = ((s1 - l1) + (s2 - l2)) / 2.0;
    let local = (m2 - m1).as_secs_f64();
    let rate = (s2 - s1) / local - 1.0;
    // Each reading is uncertain by half its round trip.
    let uncertainty = (rtt1 + rtt2).as_secs_f64() / 2.0 / local;
    let off = rate.abs() - uncertainty;
    let (level, note) = if off > ctx.drift_factor {
        (
            Level::Error,
            format!(
                ": beyond the drift factor {}: keys expire faster than the client allows for",
                ctx.drift_factor
            ),
        )
    } else if off > ctx.drift_factor / 10.0 {
        (Level::Warn, " (a tenth of the drift factor or more)".into())
    } else {
        (Level::Ok, String::new())
    };
    r.add(
        level,
        "clock rate",
        format!(
            "{:+.4}% ±{:.4}% against the local clock over {}{note}",
            rate * 100.0,
            uncertainty * 100.0,
            humantime::format_duration(ctx.clock_sample)
        ),
    );
    let level = if skew.abs() > 1.0 {
        Level::Warn
    } else {
        Level::Ok
    };
    let note = if level == Level::Warn {
        ": the clocks are not synchronised; an NTP step later moves every TTL on the node"
    } else {
        ""
    };
    r.add(
        level,
        "clock skew",
        format!("{:+.1}ms from the local clock{note}", skew * 1000.0),
    );
}
