#!/bin/sh
# Installs dependencies, builds, and runs every test. The README's test command.
set -eu
cd "$(dirname "$0")/.."
./deploy/install-deps.sh
# shellcheck disable=SC2086
cmake -S . -B build ${TANDEM_CMAKE_FLAGS:-}
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j"$(nproc)"
