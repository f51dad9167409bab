//! Benches live in `benches/`; run them with `cargo bench -p ployz-bench`.
