// Run as an example of the redlock-bench crate (copied to benches/examples/ for the run, then
// moved here): cargo build --release -p redlock-bench --example scripts; output: scripts.txt.
use redis::{AsyncConnectionConfig, Client, IntoConnectionInfo};
use std::time::Instant;

const STAMP: &str = r"
local t = redis.call('TIME')
local stamp = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(redis.call('SET', KEYS[2], string.format('%.0f', stamp), 'GET') or '0') or 0
if stamp <= last then
  stamp = last + 1
  redis.call('SET', KEYS[2], string.format('%.0f', stamp))
end
return stamp
";
fn pct(mut v: Vec<u128>) -> (u128, u128) {
    v.sort();
    (v[v.len() / 2], v[v.len() * 99 / 100])
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url = std::env::args().nth(1).unwrap();
    let info = url
        .as_str()
        .into_connection_info()
        .unwrap()
        .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
    let config = AsyncConnectionConfig::new().set_response_timeout(None);
    let mut c = Client::open(info)
        .unwrap()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("id")
        .arg("X")
        .query_async(&mut c)
        .await
        .unwrap();
    let frel = "if redis.call('GET',KEYS[1])==ARGV[1] then return redis.call('DEL',KEYS[1]) else return 0 end";
    let relpub = "if redis.call('GET',KEYS[1])==ARGV[1] then redis.call('DEL',KEYS[1]) redis.pcall('PUBLISH', ARGV[2], '') return 1 else return 0 end";
    let a1 = "local r = redis.call('SET',KEYS[3],ARGV[1],'NX','PX',ARGV[2]) if r then return 1 end return 0";
    let a2 = format!("if redis.call('GET', KEYS[1]) ~= ARGV[3] then return -2 end\n{a1}");
    let a3 = format!(
        "if not redis.call('SET',KEYS[3],ARGV[1],'NX','PX',ARGV[2]) then return 0 end\n{STAMP}"
    );
    let a4 = format!(
        "if redis.call('GET', KEYS[1]) ~= ARGV[3] then return -2 end\nif not redis.call('SET',KEYS[3],ARGV[1],'NX','PX',ARGV[2]) then return 0 end\n{STAMP}"
    );
    let a5 = "return 1".to_string();
    let scripts: Vec<(&str, String)> = vec![
        ("frel", frel.into()),
        ("relpub", relpub.into()),
        ("a1-lua-set", a1.into()),
        ("a2-+id", a2),
        ("a3-+stamp", a3),
        ("a4-id+stamp", a4),
        ("a5-empty", a5),
    ];
    let mut shas = std::collections::HashMap::new();
    for (n, s) in &scripts {
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(s)
            .query_async(&mut c)
            .await
            .unwrap();
        shas.insert(*n, sha);
    }
    let acqs = [
        "set",
        "a1-lua-set",
        "a2-+id",
        "a3-+stamp",
        "a4-id+stamp",
        "a5-empty",
    ];
    let rels = ["frel", "relpub"];
    let mut res: std::collections::BTreeMap<String, Vec<u128>> = Default::default();
    for i in 0..30000usize {
        let tok = format!("{:032x}", i as u128 * 7919);
        let combo = i % (acqs.len() + 1);
        let (acq, rel) = if combo < acqs.len() {
            (acqs[combo], "frel")
        } else {
            ("set", "relpub")
        };
        let t = Instant::now();
        if acq == "set" {
            let _: Option<String> = redis::cmd("SET")
                .arg("k")
                .arg(&tok)
                .arg("NX")
                .arg("PX")
                .arg(30000)
                .query_async(&mut c)
                .await
                .unwrap();
        } else {
            let _: redis::Value = redis::cmd("EVALSHA")
                .arg(&shas[acq])
                .arg(3)
                .arg("id")
                .arg("st")
                .arg("k")
                .arg(&tok)
                .arg(30000)
                .arg("X")
                .query_async(&mut c)
                .await
                .unwrap();
        }
        let _: redis::Value = redis::cmd("EVALSHA")
            .arg(&shas[rel])
            .arg(1)
            .arg("k")
            .arg(&tok)
            .arg("chan")
            .query_async(&mut c)
            .await
            .unwrap();
        let e = t.elapsed().as_micros();
        if acq == "a5-empty" {
            let _: () = redis::cmd("DEL")
                .arg("k")
                .query_async(&mut c)
                .await
                .unwrap();
        }
        res.entry(format!("{acq}+{rel}")).or_default().push(e);
    }
    for (k, v) in res {
        let (a, b) = pct(v);
        println!("{k:24} p50 {a} p99 {b}");
    }
}
