# rls: a static binary on distroless, running as a non-root user.
#   docker build -t rls .
#   docker run --rm -v "$PWD/config:/config:ro" -p 8081:8081 -p 8080:8080 rls
#   docker run --rm -v "$PWD/config:/config:ro" rls --store redis --redis-url redis://redis:6379
#
# The image carries no descriptor config of its own: /config is empty, and rls
# refuses to start on an empty --config-dir (unless --allow-empty-config), so a
# config mounted at another path fails loudly instead of limiting nothing.
#
# Multi-arch (make release prints this): the build stage runs on the builder's
# platform and cross-compiles for each target (no cgo), e.g.
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg VERSION=v0.1.0 --build-arg COMMIT=$(git rev-parse HEAD) \
#     --build-arg DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ) -t registry/rls:v0.1.0 --push .

FROM --platform=$BUILDPLATFORM golang:1.26 AS build
ARG TARGETOS=linux
ARG TARGETARCH=amd64
ARG VERSION=dev
ARG COMMIT=
ARG DATE=
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath \
      -ldflags="-s -w -X github.com/rls-project/rls/pkg/buildinfo.Version=$VERSION -X github.com/rls-project/rls/pkg/buildinfo.Commit=$COMMIT -X github.com/rls-project/rls/pkg/buildinfo.Date=$DATE" \
      -o /out/rls ./cmd/rls && mkdir -p /out/config
# /bin/ratelimit is the upstream image's entrypoint: run under that name, rls
# reads envoyproxy/ratelimit's environment (docs/MIGRATING.md). A directory
# copy keeps the link a link.
RUN mkdir -p /out/bin && ln -s /usr/local/bin/rls /out/bin/ratelimit

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/rls /usr/local/bin/rls
COPY --from=build /out/bin/ /bin/
COPY --from=build /out/config /config
USER nonroot:nonroot
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/rls", "serve", "--config-dir", "/config"]
