//! Node faults on real `redis-server` processes of a testkit [`Cluster`].

use std::sync::Arc;

use futures_util::future::BoxFuture;
use redlock_testkit::{Cluster, DataOnRestart, RedisNode};

use crate::nemesis::{Fault, Faults, Kind};

/// Injects node faults into a proxied testkit cluster.
#[derive(Debug)]
pub struct RealFaults {
    cluster: Arc<Cluster>,
}

impl RealFaults {
    /// Faults for `cluster` (built with `proxied(true)`).
    pub fn new(cluster: Arc<Cluster>) -> Self {
        Self { cluster }
    }

    fn nodes<'a>(&'a self, fault: &'a Fault) -> impl Iterator<Item = &'a RedisNode> + 'a {
        fault.nodes.iter().map(|&i| self.cluster.node(i))
    }
}

fn proxy_of(node: &RedisNode) -> Result<&redlock_testkit::FaultProxy, String> {
    node.proxy()
        .ok_or_else(|| format!("node {} has no fault proxy", node.port()))
}

impl Faults for RealFaults {
    fn inject<'a>(&'a self, fault: &'a Fault) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            for node in self.nodes(fault) {
                match fault.kind {
                    Kind::NodePause => node.pause(),
                    Kind::Kill | Kind::KillAof => node.kill(),
                    Kind::Delay => proxy_of(node)?.set_delay(fault.amount, fault.jitter),
                    Kind::Drop => proxy_of(node)?.blackhole(),
                    Kind::Partition => proxy_of(node)?.partition(),
                    other => return Err(format!("{other} is not supported on real nodes yet")),
                }
            }
            Ok(())
        })
    }

    fn heal<'a>(&'a self, fault: &'a Fault) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            for node in self.nodes(fault) {
                match fault.kind {
                    Kind::NodePause => node.resume(),
                    Kind::Kill => node
                        .restart(DataOnRestart::Wipe)
                        .await
                        .map_err(|e| e.to_string())?,
                    Kind::KillAof => node
                        .restart(DataOnRestart::AsOnDisk)
                        .await
                        .map_err(|e| e.to_string())?,
                    Kind::Delay | Kind::Drop | Kind::Partition => proxy_of(node)?.heal(),
                    _ => {}
                }
            }
            Ok(())
        })
    }
}
