#!/usr/bin/env bash
# The demo: build in release mode, list the devices, and check every op on every device.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --locked -p rgml-cli
./target/release/rgml devices
./target/release/rgml test-ops
