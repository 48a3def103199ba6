//! Runs the paper 003 experiments (section IV) and prints them as Markdown tables.
//!
//! ```text
//! cargo run --release -p tidings-bench --example sched_bench -- [rate|scaling|shares|shares-sim|shares-long|all] [--quick]
//! ```
//!
//! `--quick` shortens every experiment (fewer configurations, shorter points) for a smoke run.

fn main() -> Result<(), tidings_bench::sched::BenchError> {
    bench::main()
}

mod bench {
    use tidings_bench::sched::{
        capacity, rate_delay, scaling, share_error, share_error_simulated, BenchError,
        RateDelayConfig, ScalingConfig, ShareErrorConfig, ShareErrorResult, SpinWork,
    };
    use tidings_sched::TaskSetKind;

    pub(crate) fn main() -> Result<(), BenchError> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let quick = args.iter().any(|a| a == "--quick");
        let which = args
            .iter()
            .find(|a| !a.starts_with("--"))
            .map_or("all", String::as_str);
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        println!(
            "# tidings-sched benchmarks ({cores} cores{})\n",
            if quick { ", quick" } else { "" }
        );
        if matches!(which, "rate" | "all") {
            run_rate(quick)?;
        }
        if matches!(which, "scaling" | "all") {
            run_scaling(quick)?;
        }
        if matches!(which, "shares-sim" | "all") {
            run_shares_simulated(quick)?;
        }
        if matches!(which, "shares" | "all") {
            run_shares(quick)?;
        }
        // Not in "all": 500 configurations of 400 ms take about 3.5 minutes.
        if which == "shares-long" {
            run_shares_long(quick)?;
        }
        Ok(())
    }

    fn run_rate(quick: bool) -> Result<(), BenchError> {
        let work = SpinWork::calibrate(500);
        let capacity_per_s = capacity(1, 1, work, TaskSetKind::LockFree, 300)?;
        println!("## Fig. 5: throughput and delay against offered rate\n");
        println!(
            "One topic, one worker thread, one publisher thread pacing events; handler work ~500 ns. \
             Closed-loop capacity: {capacity_per_s:.0} events/s. Delay: push to handler start; \
             lag: scheduled send time to handler start (both sampled 1/16).\n"
        );
        let fractions: &[f64] = if quick {
            &[0.1, 0.5, 0.9, 1.25]
        } else {
            &[0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 1.0, 1.1, 1.25]
        };
        let config = RateDelayConfig {
            offered_per_s: fractions.iter().map(|f| f * capacity_per_s).collect(),
            duration_ms: if quick { 150 } else { 400 },
            worker_threads: 1,
            work,
            task_queue_capacity: 1024,
        };
        println!(
            "| offered (ev/s) | delivered (ev/s) | delay mean (µs) | p50 (µs) | p99 (µs) | \
             lag from schedule, mean (µs) |"
        );
        println!("|---:|---:|---:|---:|---:|---:|");
        for p in rate_delay(&config)? {
            println!(
                "| {:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} |",
                p.offered_per_s,
                p.delivered_per_s,
                p.delay_us_mean,
                p.delay_us_p50,
                p.delay_us_p99,
                p.lag_us_mean
            );
        }
        println!();
        Ok(())
    }

    fn run_scaling(quick: bool) -> Result<(), BenchError> {
        println!("## Figs. 6-7: throughput against topics and threads, lock-free vs mutex\n");
        println!(
            "Closed loop: every topic always has events (4 in flight, each handler re-queues its \
             event). Events/s, all topics together: median of 5 runs of 100 ms, the lock-free and \
             mutex runs interleaved; [min-max] of the runs for 2 threads.\n"
        );
        for work_ns in [0u64, 1_000] {
            let config = ScalingConfig {
                topics: if quick {
                    vec![1, 8]
                } else {
                    vec![1, 2, 4, 8, 16, 64, 256]
                },
                worker_threads: vec![1, 2],
                task_sets: vec![TaskSetKind::LockFree, TaskSetKind::Mutex],
                in_flight_per_topic: 4,
                work: SpinWork::calibrate(work_ns),
                duration_ms: if quick { 50 } else { 100 },
                repetitions: if quick { 1 } else { 5 },
            };
            let points = scaling(&config)?;
            println!("Handler work ~{work_ns} ns:\n");
            println!(
                "| topics | lock-free 1 thr | mutex 1 thr | lock-free 2 thr [range] | \
                 mutex 2 thr [range] | lock-free/mutex (2 thr) |"
            );
            println!("|---:|---:|---:|---:|---:|---:|");
            for &topics in &config.topics {
                let get = |threads: usize, set: TaskSetKind| {
                    points
                        .iter()
                        .find(|p| {
                            p.topics == topics && p.worker_threads == threads && p.task_set == set
                        })
                        .map_or((0.0, (0.0, 0.0)), |p| {
                            (p.events_per_s, p.events_per_s_range)
                        })
                };
                let (lf1, mx1) = (
                    get(1, TaskSetKind::LockFree).0,
                    get(1, TaskSetKind::Mutex).0,
                );
                let (lf2, lf2r) = get(2, TaskSetKind::LockFree);
                let (mx2, mx2r) = get(2, TaskSetKind::Mutex);
                println!(
                    "| {topics} | {lf1:.0} | {mx1:.0} | {lf2:.0} [{:.0}-{:.0}] | {mx2:.0} [{:.0}-{:.0}] | {:.2} |",
                    lf2r.0,
                    lf2r.1,
                    mx2r.0,
                    mx2r.1,
                    if mx2 > 0.0 { lf2 / mx2 } else { 0.0 }
                );
            }
            println!();
        }
        Ok(())
    }

    fn share_config(
        quick: bool,
        threads: usize,
        load_factor: f64,
        work: SpinWork,
    ) -> ShareErrorConfig {
        ShareErrorConfig {
            configurations: if quick { 40 } else { 500 },
            topics: 10,
            worker_threads: threads,
            load_factor,
            share_poisson_mean: 4.0,
            offered_poisson_mean: 8.0,
            warmup_ms: 15,
            measure_ms: 100,
            work,
            seed: 0x7d1_2024,
            capacity_per_s: None,
        }
    }

    fn print_ccdf(label: &str, result: &ShareErrorResult) {
        let thresholds = [0.01, 0.02, 0.05, 0.10, 0.20, 0.50];
        let cells: Vec<String> = thresholds
            .iter()
            .map(|&t| format!("{:.3}", result.ccdf(t)))
            .collect();
        let median = result
            .errors
            .get(result.errors.len() / 2)
            .copied()
            .unwrap_or(0.0);
        println!(
            "| {label} | {:.0} | {} | {:.1}% | {:.2}% |",
            result.capacity_per_s,
            cells.join(" | "),
            100.0 * result.fraction_within(0.10),
            100.0 * median
        );
    }

    fn ccdf_header() {
        println!("| setting | R_max (ev/s) | P(err>1%) | P(err>2%) | P(err>5%) | P(err>10%) | P(err>20%) | P(err>50%) | within 10% | median err |");
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    }

    fn run_shares_simulated(quick: bool) -> Result<(), BenchError> {
        println!("## Fig. 8 (virtual time): share error CCDF, algorithm only\n");
        println!(
            "10 topics, shares 1+Poisson(4) and offered fractions 1+Poisson(8), normalised; one \
             `run_once` worker on a manual clock, event cost uniform 50-150 µs; 100 ms warm-up, 1 s \
             measured per configuration.\n"
        );
        ccdf_header();
        for (label, load) in [("saturation (2x R_max)", 2.0), ("below (0.6x R_max)", 0.6)] {
            let mut config = share_config(quick, 1, load, SpinWork { iterations: 0 });
            config.warmup_ms = 100;
            config.measure_ms = 1_000;
            print_ccdf(label, &share_error_simulated(&config)?);
        }
        println!();
        Ok(())
    }

    fn run_shares(quick: bool) -> Result<(), BenchError> {
        println!("## Fig. 8 (real threads): share error CCDF\n");
        println!(
            "10 topics, same random configurations; handler work ~2 µs; the calling thread \
             generates the load (a full queue drops the excess, as a blocked publisher would \
             not send it); 15 ms warm-up, then 100 ms measured between two credit resets. \
             R_max: closed-loop capacity measured first; the model is evaluated at the rate \
             actually achieved in each run, as in the paper.\n"
        );
        let work = SpinWork::calibrate(2_000);
        ccdf_header();
        for threads in [1usize, 2] {
            // One R_max per thread count, shared by both loads.
            let capacity_per_s = capacity(threads, 10, work, TaskSetKind::LockFree, 300)?;
            for (label, load) in [("saturation (2x R_max)", 2.0), ("below (0.6x R_max)", 0.6)] {
                let mut config = share_config(quick, threads, load, work);
                config.capacity_per_s = Some(capacity_per_s);
                let result = share_error(&config)?;
                print_ccdf(&format!("{threads} thread(s), {label}"), &result);
            }
        }
        println!();
        Ok(())
    }

    fn run_shares_long(quick: bool) -> Result<(), BenchError> {
        println!("## Fig. 8 (real threads, long window): share error CCDF at saturation\n");
        println!(
            "As above, one worker thread at saturation, but 400 ms measured per configuration \
             (the paper ran each configuration until its average settled).\n"
        );
        let work = SpinWork::calibrate(2_000);
        ccdf_header();
        let mut config = share_config(quick, 1, 2.0, work);
        config.measure_ms = 400;
        let result = share_error(&config)?;
        print_ccdf("1 thread(s), saturation (2x R_max), 400 ms", &result);
        println!();
        Ok(())
    }
}
