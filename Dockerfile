# syntax=docker/dockerfile:1
#
# outbox-relay container image: a static binary on distroless, no shell,
# running as nonroot (uid 65532). It also carries the demo producer
# (/outbox-demo) used by docker-compose.yml.
#
#   make image      # outbox-relay:0.1.0 on the release's tag, VERSION and COMMIT from git
#   docker build -t outbox-relay:0.1.0 --build-arg COMMIT=$(git rev-parse HEAD) .
#
# internal/suites/deploytest checks the invariants of this file and runs its
# `go build` step: keep the build in one RUN line that writes to /out/.

# The Go release must be at least the go line of go.mod.
ARG GO_VERSION=1.26.8

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .
# Cross-compiles for the target platform (CGO off), so multi-arch builds
# (--platform linux/amd64,linux/arm64) need no emulation.
ARG TARGETOS TARGETARCH
# What `outbox-relay version` prints. The build context has no .git, so
# the commit comes only from COMMIT (make image passes both).
ARG VERSION=0.1.0 COMMIT=
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w -X github.com/outbox-relay/outbox-relay/internal/app/cli.Version=${VERSION} -X github.com/outbox-relay/outbox-relay/internal/app/cli.Commit=${COMMIT}" \
    -o /out/ ./cmd/outbox-relay ./cmd/outbox-demo

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/outbox-relay /out/outbox-demo /
USER nonroot:nonroot
# Admin listener: /livez, /readyz and metrics (--admin-addr, default :9090).
EXPOSE 9090
# Exec form: the image has no shell. `outbox-relay healthcheck` asks the
# admin listener's /readyz (at --admin-addr / OUTBOX_ADMIN_ADDR) and exits
# non-zero unless it answers 200. Containers that run migrate or
# outbox-demo should disable it (docker-compose.yml does).
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
    CMD ["/outbox-relay", "healthcheck"]
ENTRYPOINT ["/outbox-relay"]
CMD ["run"]
