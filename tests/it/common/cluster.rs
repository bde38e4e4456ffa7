//! A private Redis Cluster for tests: three masters on free ports (each a [`RedisServer`] in a
//! temporary directory), joined with `redis-cli --cluster create`; killed and removed on drop.
//! Moves one slot from its owner to another node, key by key, as `redis-cli --cluster
//! reshard` does. Never touches the shared Redis.

use std::process::Command;
use std::time::Duration;

use super::redis_server::RedisServer;
use super::wait_until;

/// Three masters, no replicas.
pub struct Cluster {
    pub nodes: Vec<RedisServer>,
}

impl Cluster {
    /// Starts three nodes and creates the cluster; returns once every node says `ok`.
    pub async fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .arg("--cluster-yes")
            .output()
            .expect("redis-cli runs");
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Cluster { nodes };
        let c = &cluster;
        wait_until(
            "every node says cluster_state:ok and knows the others",
            Duration::from_secs(60),
            || async move {
                for i in 0..c.nodes.len() {
                    let Ok(info) = c.node_cmd::<String>(i, &["CLUSTER", "INFO"]).await else {
                        return false;
                    };
                    if !info.contains("cluster_state:ok") || !info.contains("cluster_known_nodes:3")
                    {
                        return false;
                    }
                }
                true
            },
        )
        .await;
        cluster
    }

    /// `redis+cluster://127.0.0.1:<p1>,127.0.0.1:<p2>,127.0.0.1:<p3>`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// A command on node `i` alone.
    pub async fn node_cmd<T: redis::FromRedisValue>(
        &self,
        i: usize,
        args: &[&str],
    ) -> redis::RedisResult<T> {
        let mut con = redis::Client::open(self.nodes[i].url())?
            .get_multiplexed_async_connection()
            .await?;
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query_async(&mut con).await
    }

    /// A cluster connection (routes by slot, follows redirections).
    pub async fn con(&self) -> redis::cluster_async::ClusterConnection {
        let seeds: Vec<String> = self.nodes.iter().map(|n| n.url()).collect();
        redis::cluster::ClusterClient::new(seeds)
            .unwrap()
            .get_async_connection()
            .await
            .expect("cluster reachable")
    }

    /// The slot of `key`.
    pub async fn slot_of(&self, key: &str) -> u16 {
        self.node_cmd(0, &["CLUSTER", "KEYSLOT", key])
            .await
            .unwrap()
    }

    /// The node id of node `i`.
    pub async fn id_of(&self, i: usize) -> String {
        let id: String = self.node_cmd(i, &["CLUSTER", "MYID"]).await.unwrap();
        id
    }

    /// The index of the node that owns `slot`.
    pub async fn owner_of(&self, slot: u16) -> usize {
        let slots: Vec<redis::Value> = self.node_cmd(0, &["CLUSTER", "SLOTS"]).await.unwrap();
        for range in slots {
            let parts: Vec<redis::Value> = redis::from_redis_value(&range).unwrap();
            let lo: u16 = redis::from_redis_value(&parts[0]).unwrap();
            let hi: u16 = redis::from_redis_value(&parts[1]).unwrap();
            if (lo..=hi).contains(&slot) {
                let master: Vec<redis::Value> = redis::from_redis_value(&parts[2]).unwrap();
                let port: u16 = redis::from_redis_value(&master[1]).unwrap();
                return self.nodes.iter().position(|n| n.port == port).unwrap();
            }
        }
        panic!("slot {slot} has no owner");
    }

    /// Moves `slot` from node `from` to node `to` as `redis-cli --cluster reshard` does:
    /// IMPORTING on the target, MIGRATING on the source, the keys moved `batch` at a time with
    /// MIGRATE (pausing `pause` between batches), then the slot assigned to the target on
    /// every node. Returns how many keys moved.
    pub async fn migrate_slot(
        &self,
        slot: u16,
        from: usize,
        to: usize,
        batch: usize,
        pause: Duration,
    ) -> usize {
        self.begin_migration(slot, from, to).await;
        let n = batch.to_string();
        let mut moved = 0;
        loop {
            let keys: Vec<String> = self
                .node_cmd(from, &["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), &n])
                .await
                .unwrap();
            if keys.is_empty() {
                break;
            }
            self.migrate_keys(from, to, &keys).await;
            moved += keys.len();
            super::hold_for(pause, "a reshard's pace between batches").await;
        }
        self.end_migration(slot, from, to).await;
        moved
    }

    /// The start of a move of `slot` from node `from` to node `to`: IMPORTING on the target,
    /// MIGRATING on the source.
    pub async fn begin_migration(&self, slot: u16, from: usize, to: usize) {
        let (from_id, to_id) = (self.id_of(from).await, self.id_of(to).await);
        let s = slot.to_string();
        let _: () = self
            .node_cmd(to, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &from_id])
            .await
            .unwrap();
        let _: () = self
            .node_cmd(from, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &to_id])
            .await
            .unwrap();
    }

    /// MIGRATEs `keys` from node `from` to node `to`.
    pub async fn migrate_keys(&self, from: usize, to: usize, keys: &[String]) {
        let port = self.nodes[to].port.to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        args.extend(keys.iter().map(String::as_str));
        let _: () = self.node_cmd(from, &args).await.unwrap();
    }

    /// The end of a move: `slot` assigned to node `to` on every node.
    pub async fn end_migration(&self, slot: u16, from: usize, to: usize) {
        let to_id = self.id_of(to).await;
        let s = slot.to_string();
        for i in [to, from]
            .into_iter()
            .chain((0..self.nodes.len()).filter(|i| *i != to && *i != from))
        {
            let _: () = self
                .node_cmd(i, &["CLUSTER", "SETSLOT", &s, "NODE", &to_id])
                .await
                .unwrap();
        }
    }
}
