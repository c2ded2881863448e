#!/bin/sh
# Installs every Debian package Tandem needs to build, test and benchmark.
# Idempotent: packages already present are skipped; apt-get update runs at
# most once, and only when something is missing. Run as root on Debian 12.
set -eu

# Build and runtime libraries.
PKGS="build-essential cmake pkg-config
      libuv1-dev libnng-dev libprotobuf-c-dev protobuf-c-compiler
      libcunit1-dev libxxhash-dev libyaml-dev libjansson-dev libhttp-parser-dev"
# Tools used by tests, fuzzers and benchmarks.
PKGS="$PKGS clang libclang-rt-14-dev valgrind curl procps"
# openssl: deploy/make-cluster-ca.sh (TLS certificates) and the multi-host tests.
PKGS="$PKGS openssl"
# prometheus: promtool checks deploy/observability/ and every /metrics body (test_bench_live).
# librsvg2-bin: rsvg-convert, the experiment report's PNG copies of its plots.
PKGS="$PKGS prometheus librsvg2-bin"
# chromium: headless browser test of the router's /dashboard page (test_dashboard).
PKGS="$PKGS chromium"
# Benchmarks only: OpenBLAS is loaded at run time by bench_decode for the sgemm comparison;
# wrk drives the router throughput benchmark (bench/router/).
# nginx-light: the reference bench/router/vs_nginx.sh measures the router against (issue 18: at
# least half its req/s). The script runs its own nginx on loopback ports; the package's
# service is not needed (stop and disable it if the package started it).
PKGS="$PKGS libopenblas0-pthread wrk nginx-light"

missing=""
for p in $PKGS; do
	if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
		:
	else
		missing="$missing $p"
	fi
done

if [ -z "$missing" ]; then
	echo "install-deps: all $(echo $PKGS | wc -w) packages already installed"
	exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
	echo "install-deps: missing:$missing" >&2
	echo "install-deps: run as root (or with sudo) to install them" >&2
	exit 1
fi

echo "install-deps: installing:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >/dev/null
echo "install-deps: done"
