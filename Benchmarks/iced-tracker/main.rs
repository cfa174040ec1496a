// iced-tracker: the bookkeeping of iced's `Tracker::update`
// (iced_futures/src/subscription/tracker.rs) in Rust, with no crates, on the
// inputs reconcile-bench gives our reconciler (Benchmarks/reconcile-bench/
// Fixtures.swift: the same kinds, keys, parameters and churn positions).
//
// Per update, as iced does: every recipe (a boxed trait object) is hashed
// with FxHasher (iced's `Hasher`) to a u64; a fresh std `HashSet` collects
// the live hashes; a hash not in the `HashMap<u64, Execution>` is started
// (its `Execution` inserted); `retain` drops the executions not alive. What
// iced does beyond bookkeeping (a oneshot and an mpsc channel and a boxed
// future per start) is left out: a start costs one `Box` here (the stand-in
// for the execution's cancel handle), as a start costs our reconciler one
// entry.
//
// usage: iced-tracker SIZE CHURN VARIANT REPETITIONS BLOCK_MS MIN_RUNS
//   VARIANT: fresh (the sets alternate between the changed set and a copy of
//   the base built again) or same (the base set, the very one that started).
// Prints `key value` lines: median_ns (over all timed runs), range_min_ns and
// range_max_ns (the least and greatest median of one repetition), runs,
// allocations_per_update, each in this thread's CPU time.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

struct Counting;
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, size) }
    }
}
#[global_allocator]
static GLOBAL: Counting = Counting;

// FxHasher as rustc-hash 1.x has it (iced's `Hasher`).
#[derive(Default, Clone, Copy)]
struct FxHasher {
    hash: u64,
}
const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;
impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}
impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, mut bytes: &[u8]) {
        while bytes.len() >= 8 {
            self.add(u64::from_le_bytes(bytes[..8].try_into().unwrap()));
            bytes = &bytes[8..];
        }
        if bytes.len() >= 4 {
            self.add(u32::from_le_bytes(bytes[..4].try_into().unwrap()) as u64);
            bytes = &bytes[4..];
        }
        for &b in bytes {
            self.add(b as u64);
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) { self.add(i as u64) }
    #[inline]
    fn write_u16(&mut self, i: u16) { self.add(i as u64) }
    #[inline]
    fn write_u32(&mut self, i: u32) { self.add(i as u64) }
    #[inline]
    fn write_u64(&mut self, i: u64) { self.add(i) }
    #[inline]
    fn write_usize(&mut self, i: usize) { self.add(i as u64) }
    #[inline]
    fn finish(&self) -> u64 { self.hash }
}

// A recipe as iced has them: a trait object whose `hash` feeds its type and
// its identity data (here, as iced's recipes do for parameters that restart
// the stream, the parameters too: a changed parameter is a new stream).
trait Recipe {
    fn hash(&self, state: &mut FxHasher);
}

#[derive(Hash)]
struct Timer { key: i64, interval_secs: u64, leeway_ms: u64, repeats: bool }
#[derive(Hash)]
struct Watch { path: String, follow: bool }
#[derive(Hash)]
struct Signal { key: i64, signal: i32 }
#[derive(Hash)]
struct Peer { name: String, port: u16, address: String, timeout_secs: u64, retries: i64 }

macro_rules! recipe {
    ($t:ty) => {
        impl Recipe for $t {
            fn hash(&self, state: &mut FxHasher) {
                std::any::TypeId::of::<$t>().hash(state);
                Hash::hash(self, state);
            }
        }
    };
}
recipe!(Timer);
recipe!(Watch);
recipe!(Signal);
recipe!(Peer);

// Fixtures.swift's `makeSubscription` (variant 0), `isChanged` and the
// replacement offset.
// SignalSource.Signal.allCases' raw values (hangup, interrupt, user1, user2, terminate).
const SIGNALS: [i32; 5] = [1, 2, 10, 12, 15];
const REPLACEMENT_OFFSET: i64 = 1 << 24;

fn make(identity: i64) -> Box<dyn Recipe> {
    match identity % 4 {
        0 => Box::new(Timer { key: identity, interval_secs: (1 + identity % 60) as u64, leeway_ms: 1, repeats: true }),
        1 => Box::new(Watch { path: format!("/srv/reconcile/conf.d/unit-{}.conf", identity), follow: true }),
        2 => Box::new(Signal { key: identity, signal: SIGNALS[(identity % 5) as usize] }),
        _ => Box::new(Peer {
            name: format!("peer-{}", identity),
            port: 443,
            address: format!("10.{}.{}.{}:443", identity >> 16 & 255, identity >> 8 & 255, identity & 255),
            timeout_secs: 5,
            retries: 3,
        }),
    }
}

fn is_changed(i: i64, churn: i64) -> bool {
    if churn <= 0 { return false; }
    let stride = 100 / churn;
    i % stride == (i / stride) % 4 % stride
}

fn build(size: i64, churn: i64) -> Vec<Box<dyn Recipe>> {
    (0..size).map(|i| make(if is_changed(i, churn) { i + REPLACEMENT_OFFSET } else { i })).collect()
}

struct Execution {
    _cancel: Box<u64>,
}

struct Tracker {
    subscriptions: HashMap<u64, Execution>,
}

impl Tracker {
    // `Tracker::update`'s bookkeeping: returns the number of starts (iced
    // returns the futures to spawn).
    #[inline(never)]
    fn update(&mut self, recipes: &[Box<dyn Recipe>]) -> usize {
        let mut started = 0;
        let mut alive = HashSet::new();
        for recipe in recipes {
            let id = {
                let mut hasher = FxHasher::default();
                recipe.hash(&mut hasher);
                hasher.finish()
            };
            let _ = alive.insert(id);
            if self.subscriptions.contains_key(&id) {
                continue;
            }
            let _ = self.subscriptions.insert(id, Execution { _cancel: Box::new(id) });
            started += 1;
        }
        self.subscriptions.retain(|id, _| alive.contains(id));
        started
    }
}

#[repr(C)]
struct Timespec { tv_sec: i64, tv_nsec: i64 }
extern "C" {
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}
const CLOCK_MONOTONIC: i32 = 1;
const CLOCK_THREAD_CPUTIME_ID: i32 = 3;

fn now(clock: i32) -> i64 {
    let mut ts = Timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { clock_gettime(clock, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

fn median(v: &mut Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n == 0 { return f64::NAN; }
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 7 {
        eprintln!("usage: iced-tracker SIZE CHURN fresh|same REPETITIONS BLOCK_MS MIN_RUNS");
        std::process::exit(2);
    }
    let size: i64 = args[1].parse().expect("SIZE");
    let churn: i64 = args[2].parse().expect("CHURN");
    let same = match args[3].as_str() { "fresh" => false, "same" => true, _ => panic!("VARIANT: fresh or same") };
    let repetitions: usize = args[4].parse().expect("REPETITIONS");
    let block_ns: i64 = args[5].parse::<i64>().expect("BLOCK_MS") * 1_000_000;
    let min_runs: usize = args[6].parse().expect("MIN_RUNS");

    let base = build(size, 0);
    let cycle: [Vec<Box<dyn Recipe>>; 2] = if same { [build(0, 0), build(0, 0)] } else { [build(size, churn), build(size, 0)] };
    let set = |i: usize| -> &[Box<dyn Recipe>] { if same { &base } else { &cycle[i & 1] } };
    let mut tracker = Tracker { subscriptions: HashMap::new() };
    tracker.update(&base);

    // Warm-up, and runs per timed sample (a sample of at least ~20 µs: the
    // CPU clock is read by a system call).
    let mut sink = 0usize;
    let mut iteration = 0usize;
    let t0 = now(CLOCK_THREAD_CPUTIME_ID);
    let mut warm = 0usize;
    while warm < 4 || (warm < 200 && now(CLOCK_THREAD_CPUTIME_ID) - t0 < block_ns / 5) {
        sink += tracker.update(set(iteration));
        iteration += 1;
        warm += 1;
    }
    let per_run = ((now(CLOCK_THREAD_CPUTIME_ID) - t0) as f64 / warm as f64).max(1.0);
    let mut batch = ((20_000.0 / per_run).ceil() as usize).max(1);
    if batch > 1 && batch % 2 == 1 { batch += 1; }

    let mut all: Vec<f64> = Vec::new();
    let mut blocks: Vec<f64> = Vec::new();
    let allocations_before = ALLOCATIONS.load(Ordering::Relaxed);
    let mut updates = 0usize;
    let per_block = (min_runs + repetitions - 1) / repetitions.max(1);
    for _ in 0..repetitions.max(1) {
        let mut block: Vec<f64> = Vec::new();
        let start = now(CLOCK_MONOTONIC);
        while block.len() < per_block.max(1) || (block.len() < 3000 && now(CLOCK_MONOTONIC) - start < block_ns) {
            let a = now(CLOCK_THREAD_CPUTIME_ID);
            for _ in 0..batch {
                sink += tracker.update(set(iteration));
                iteration += 1;
            }
            let b = now(CLOCK_THREAD_CPUTIME_ID);
            block.push((b - a) as f64 / batch as f64);
            updates += batch;
        }
        all.extend_from_slice(&block);
        blocks.push(median(&mut block));
    }
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - allocations_before;
    let lo = blocks.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = blocks.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    println!("median_ns {:.3}", median(&mut all));
    println!("range_min_ns {:.3}", lo);
    println!("range_max_ns {:.3}", hi);
    println!("runs {}", all.len());
    println!("repetitions {}", blocks.len());
    println!("allocations_per_update {:.3}", allocations as f64 / updates.max(1) as f64);
    println!("running {}", tracker.subscriptions.len());
    if sink == usize::MAX { println!("sink {}", sink); }
}
