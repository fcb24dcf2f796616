use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: u16 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(5);
    let urls: Vec<String> = (7611..7611 + n).map(|p| format!("redis://127.0.0.1:{p}/")).collect();
    let rl = redlock::Redlock::builder().nodes(&urls).ttl(Duration::from_secs(30))
        .retry(redlock::RetryPolicy::deadline(Duration::from_secs(30))).build().unwrap();
    rl.connect().await;
    let l = rl.acquire("probe:warm").await.unwrap(); rl.release(l).await.unwrap();
    let ev: Arc<Mutex<Vec<(Instant, u8, usize)>>> = Arc::new(Mutex::new(Vec::with_capacity(100000)));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..8).map(|id| {
        let (rl, ev, stop) = (rl.clone(), ev.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let l = rl.acquire("probe:hot").await.unwrap();
                ev.lock().unwrap().push((Instant::now(), 0, id)); // won
                tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_millis(1))).await.unwrap();
                ev.lock().unwrap().push((Instant::now(), 1, id)); // hold over, release starts
                rl.release(l).await.unwrap();
                ev.lock().unwrap().push((Instant::now(), 2, id)); // release done
            }
        })
    }).collect();
    tokio::time::sleep(Duration::from_secs(10)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks { let _ = t.await; }
    let secs = t0.elapsed().as_secs_f64();
    let ev = ev.lock().unwrap();
    let wins = ev.iter().filter(|e| e.1 == 0).count();
    println!("wins {wins} rate {:.0}/s", wins as f64 / secs);
    // gaps: release start -> next win; win -> hold over; release start -> release done
    let mut handoff = vec![]; let mut hold = vec![]; let mut rel = vec![];
    let mut last_rel: Option<Instant> = None; let mut last_win: Option<Instant> = None;
    let mut rel_start = std::collections::HashMap::new();
    for e in ev.iter() {
        match e.1 {
            0 => { if let Some(r) = last_rel.take() { handoff.push(e.0 - r) } last_win = Some(e.0) }
            1 => { if let Some(w) = last_win.take() { hold.push(e.0 - w) } last_rel = Some(e.0); rel_start.insert(e.2, e.0); }
            _ => { if let Some(s) = rel_start.remove(&e.2) { rel.push(e.0 - s) } }
        }
    }
    for (name, mut v) in [("handoff", handoff), ("hold", hold), ("release", rel)] {
        v.sort();
        let p = |q: f64| v[((v.len() as f64 - 1.0) * q) as usize].as_micros();
        let mean = v.iter().map(|d| d.as_micros()).sum::<u128>() / v.len() as u128;
        println!("{name}: n {} mean {mean} p10 {} p50 {} p90 {} p99 {} max {}", v.len(), p(0.1), p(0.5), p(0.9), p(0.99), p(1.0));
    }
}
