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

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/rls /usr/local/bin/rls
COPY config/ /config/
USER nonroot:nonroot
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/rls", "serve", "--config-dir", "/config"]
