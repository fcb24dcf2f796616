//! `redlock status RESOURCE`: reads the lock key on every node directly and reports who holds
//! it. Tokens are shown by their first characters only, as the library's logs show them.

use std::collections::BTreeMap;

use futures_util::future::join_all;
use serde::Serialize;

use crate::args::StatusArgs;
use crate::direct::Node;
use crate::exit::{self, Failure};
use crate::output::{Table, human_ms, shown};
use crate::settings::Settings;

/// Characters of a token that are shown: as many as the library's `Token` `Display`.
pub(crate) const TOKEN_SHOWN: usize = 6;

/// One node's view of the lock.
#[derive(Debug, Serialize)]
struct NodeStatus {
    node: String,
    reachable: bool,
    held: bool,
    /// The first characters of the token held there.
    token_prefix: Option<String>,
    /// Milliseconds left (`PTTL`); -1 = a key without expiry.
    pttl_ms: Option<i64>,
    error: Option<String>,
}

/// The whole report.
#[derive(Debug, Serialize)]
struct Status {
    resource: String,
    key: String,
    nodes_total: usize,
    quorum: usize,
    reachable: usize,
    /// Whether one token is held on a quorum of nodes.
    held_by_quorum: bool,
    /// That token's first characters, or the most widely held one's.
    holder_token_prefix: Option<String>,
    /// Nodes holding that token.
    holder_nodes: usize,
    nodes: Vec<NodeStatus>,
}

/// The shown part of a lock value: its first characters when it looks like a token.
pub(crate) fn token_prefix(value: &str) -> String {
    if value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        value.chars().take(TOKEN_SHOWN).collect()
    } else {
        "(not a token)".to_owned()
    }
}

pub(crate) async fn run(settings: &Settings, args: &StatusArgs) -> Result<u8, Failure> {
    let rl = settings.build(settings.lockless_builder())?;
    if args.resource.is_empty() {
        return Err(Failure::usage("the resource name is empty"));
    }
    if args.resource.len() > redlock::DEFAULT_MAX_RESOURCE_LEN {
        return Err(Failure::usage(format!(
            "the resource name is {} bytes; the maximum is {}",
            args.resource.len(),
            redlock::DEFAULT_MAX_RESOURCE_LEN
        )));
    }
    let key = format!("{}lock:{}", settings.prefix(), args.resource);
    // Reads are not on the lock's hot path: allow a slow node more than the lock's timeout.
    let timeout = settings
        .timeout()
        .max(std::time::Duration::from_millis(500));
    let nodes = Node::all(settings, timeout);
    let views = join_all(nodes.iter().map(|n| read(n, &key))).await;

    // Nodes per full value (kept in memory only, never shown).
    let mut holders: BTreeMap<&str, usize> = BTreeMap::new();
    let mut shown = Vec::with_capacity(views.len());
    for (node, view) in nodes.iter().zip(&views) {
        let status = match view {
            Ok((value, pttl)) => {
                if let Some(v) = value {
                    *holders.entry(v.as_str()).or_default() += 1;
                }
                NodeStatus {
                    node: node.name.clone(),
                    reachable: true,
                    held: value.is_some(),
                    token_prefix: value.as_deref().map(token_prefix),
                    pttl_ms: value.as_ref().map(|_| *pttl),
                    error: None,
                }
            }
            Err(e) => NodeStatus {
                node: node.name.clone(),
                reachable: false,
                held: false,
                token_prefix: None,
                pttl_ms: None,
                error: Some(e.clone()),
            },
        };
        shown.push(status);
    }
    let top = holders.iter().max_by_key(|(_, n)| **n);
    let quorum = rl.quorum();
    let reachable = shown.iter().filter(|s| s.reachable).count();
    let report = Status {
        resource: args.resource.clone(),
        key,
        nodes_total: nodes.len(),
        quorum,
        reachable,
        held_by_quorum: top.is_some_and(|(_, n)| *n >= quorum),
        holder_token_prefix: top.map(|(v, _)| token_prefix(v)),
        holder_nodes: top.map_or(0, |(_, n)| *n),
        nodes: shown,
    };
    if args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| Failure::new(exit::SOFTWARE, format!("JSON: {e}")))?;
        outln!("{text}");
    } else {
        print_table(&report);
    }
    Ok(if reachable >= quorum {
        exit::OK
    } else {
        exit::UNAVAILABLE
    })
}

async fn read(node: &Node, key: &str) -> Result<(Option<String>, i64), String> {
    let mut conn = node.connect().await?;
    let mut pipe = redis::pipe();
    pipe.cmd("GET").arg(key).cmd("PTTL").arg(key);
    pipe.query_async::<(Option<String>, i64)>(&mut conn)
        .await
        .map_err(|e| node.error(&e))
}

fn print_table(r: &Status) {
    outln!(
        "lock {} ({} nodes, quorum {})",
        shown(&r.key),
        r.nodes_total,
        r.quorum
    );
    let mut table = Table::new(["NODE", "REACHABLE", "HELD", "TOKEN", "PTTL"]);
    for n in &r.nodes {
        table.row([
            n.node.clone(),
            if n.reachable {
                "yes".into()
            } else {
                format!("no: {}", shown(n.error.as_deref().unwrap_or("")))
            },
            if !n.reachable {
                "?".into()
            } else if n.held {
                "yes".into()
            } else {
                "no".into()
            },
            n.token_prefix
                .as_ref()
                .map_or("-".into(), |t| format!("{t}…")),
            n.pttl_ms.map_or("-".into(), |ms| {
                if ms < 0 {
                    "no expiry".into()
                } else {
                    human_ms(ms)
                }
            }),
        ]);
    }
    table.print();
    match (&r.holder_token_prefix, r.held_by_quorum) {
        (Some(t), true) => outln!(
            "held by a quorum: {}/{} nodes hold token {t}…",
            r.holder_nodes,
            r.nodes_total
        ),
        (Some(t), false) => outln!(
            "not held by a quorum: at most {}/{} nodes hold one token ({t}…); {} needed",
            r.holder_nodes,
            r.nodes_total,
            r.quorum
        ),
        (None, _) if r.reachable < r.quorum => outln!(
            "unknown: only {}/{} nodes answered; {} needed",
            r.reachable,
            r.nodes_total,
            r.quorum
        ),
        (None, _) => outln!("not held: no node holds the key"),
    }
}
