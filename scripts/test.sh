#!/usr/bin/env bash
# Sets up a Debian machine (as root) and runs every Ployz test: formatting, lints, unit,
# property, crash and end-to-end tests against real processes. `.ci/run` calls this.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
ployz_ensure_dockerd

# A clean checkout gains nothing from incremental state and it costs gigabytes of disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "==> cargo test (with the tests a plain \`cargo test\` skips: dockerd, pebble, sshd, root)"
cargo test --workspace --locked --no-fail-fast -- --include-ignored
