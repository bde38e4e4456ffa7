# syntax=docker/dockerfile:1
#
# jobrelay container image: the binary and the CA certificates on Debian slim, run as a
# non-root user (uid 10001). Build and run:
#
#   docker build -t jobrelay:0.1.0 .
#   docker run --rm -p 9898:9898 -e DATABASE_URL=postgres://... -e REDIS_URL=redis://... jobrelay:0.1.0
#   docker run --rm -e DATABASE_URL=... jobrelay:0.1.0 migrate
#
# The ENTRYPOINT is the binary: Kubernetes manifests pass subcommands and flags as `args`.

# ---- build ------------------------------------------------------------------------------
FROM rust:1-bookworm AS builder
WORKDIR /src

# 1. Dependencies only, cached until Cargo.toml, Cargo.lock, build.rs or proto/ change: build a
#    dummy crate with the real manifest. Explicit [[bench]]/[[example]]/[[test]] targets are
#    dropped from the manifest for this step (their files are not copied yet); dependencies'
#    build fingerprints do not depend on them.
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto ./proto
RUN awk '/^\[/ { skip = /^\[\[(bench|example|test)\]\]/ } !skip' Cargo.toml > Cargo.deps.toml \
    && mv Cargo.deps.toml Cargo.toml \
    && mkdir src \
    && echo 'fn main() {}' > src/main.rs \
    && echo '' > src/lib.rs \
    && cargo build --release --locked \
    && rm -rf src target/release/jobrelay target/release/deps/jobrelay-* \
              target/release/deps/libjobrelay-* target/release/.fingerprint/jobrelay-*

# 2. The crate itself (src/, migrations/ which sqlx::migrate! embeds, and whatever targets the
#    real manifest names), over the cached dependencies.
COPY . .
RUN cargo build --release --locked --bin jobrelay \
    && strip --strip-debug target/release/jobrelay \
    && ./target/release/jobrelay --version

# ---- run --------------------------------------------------------------------------------
FROM debian:bookworm-slim
# CA certificates: Postgres sslmode=verify-full without sslrootcert trusts the system roots.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 jobrelay \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
               --shell /usr/sbin/nologin jobrelay
COPY --from=builder /src/target/release/jobrelay /usr/local/bin/jobrelay
# Numeric, so that Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
# /metrics, /healthz, /readyz (--http-addr, default 0.0.0.0:9898).
EXPOSE 9898
ENTRYPOINT ["jobrelay"]
