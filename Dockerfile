# rls: a static binary on distroless, running as a non-root user.
#   docker build -t rls .
#   docker run --rm -p 8081:8081 -p 8080:8080 rls            # serves /config (config/example.yaml)
#   docker run --rm -v "$PWD/config:/config:ro" rls --store redis --redis-url redis://redis:6379

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w" -o /out/rls ./cmd/rls
# /bin/ratelimit is the upstream image's entrypoint: run under that name, rls
# reads envoyproxy/ratelimit's environment (docs/MIGRATING.md). A directory
# copy keeps the link a link.
RUN mkdir -p /out/bin && ln -s /usr/local/bin/rls /out/bin/ratelimit

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/rls /usr/local/bin/rls
COPY --from=build /out/bin/ /bin/
COPY config/ /config/
USER nonroot:nonroot
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/rls", "serve", "--config-dir", "/config"]
