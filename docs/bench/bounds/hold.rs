// Run as an example of the redlock-bench crate (copied to benches/examples/ for the run, then
// moved here): cargo build --release -p redlock-bench --example hold; output: hold.txt.
use std::time::{Duration, Instant};
#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    for mode in 0..2 {
        let mut v = vec![];
        for _ in 0..2000 {
            let t = Instant::now();
            if mode == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            } else {
                tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_millis(1)))
                    .await
                    .unwrap();
            }
            v.push(t.elapsed().as_micros());
        }
        v.sort();
        let avg: u128 = v.iter().sum::<u128>() / v.len() as u128;
        println!(
            "mode {mode} sleep(1ms): avg {avg} µs p50 {} p10 {} p90 {} p99 {}",
            v[1000], v[200], v[1800], v[1980]
        );
    }
}
