//! What the experiment benchmarks (`harness = false`, run one at a time with
//! `cargo bench --bench NAME -- ARG`) share.

/// The benchmark's first argument, skipping the `--bench` that `cargo bench` passes.
pub fn bench_arg() -> Option<String> {
    std::env::args().skip(1).find(|a| a != "--bench")
}
