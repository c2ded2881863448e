# Tandem in a container: Debian 12, built from source with deploy/install-deps.sh.
#
#   docker build -t tandem:0.1.0 .
#   docker run --rm -p 8000:8000 tandem:0.1.0                  # tandem up: router + 1P + 1D
#   docker run --rm tandem:0.1.0 tandem-router --help           # any binary
#
# The image holds tandem, tandem-router, tandem-prefill and tandem-decode in
# /usr/local/bin, the routing files in /etc/tandem/routing and the cluster files in
# /etc/tandem/clusters. deploy/kubernetes/ runs one binary per pod from it.
# (Not built on the machine this was written on: it has no container engine.)

# ---- Build: the install script, then the standard CMake flow (no tests, no benchmarks).
FROM debian:bookworm AS build
WORKDIR /src
COPY deploy/install-deps.sh deploy/install-deps.sh
RUN ./deploy/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DTANDEM_BUILD_TESTS=OFF -DTANDEM_BUILD_BENCH=OFF \
 && cmake --build build -j"$(nproc)" \
 && build/bin/tandem --version

# ---- Run: the shared libraries the binaries link (ldd build/bin/*), curl for probes by hand.
FROM debian:bookworm-slim
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends \
        libuv1 libnng1 libmbedtls14 libprotobuf-c1 libxxhash0 libyaml-0-2 libjansson4 \
        libhttp-parser2.9 curl ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/build/bin/tandem /src/build/bin/tandem-router \
     /src/build/bin/tandem-prefill /src/build/bin/tandem-decode /usr/local/bin/
COPY deploy/routing /etc/tandem/routing
COPY deploy/clusters /etc/tandem/clusters
# tandem up writes its run directory (logs) under the working directory.
RUN useradd --system --create-home --home-dir /var/lib/tandem tandem
USER tandem
WORKDIR /var/lib/tandem
# 8000: the OpenAI API; 7000: the router's announce socket; 7001/7002: a
# worker's control and KV sockets; 9100: a worker's /metrics and /health.
EXPOSE 8000 7000 7001 7002 9100
# The default: a whole local cluster in the container, the router on every
# interface so that -p 8000:8000 reaches it (docs/up.md: router.host).
CMD ["tandem", "up", "-c", "/etc/tandem/clusters/container.yaml"]
