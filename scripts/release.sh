#!/usr/bin/env bash
# make release: versioned linux/amd64 and linux/arm64 binaries, the packaged
# Helm chart, SHA256SUMS and the multi-arch image command, into $DIST. Offline:
# the Go toolchain and Helm's Go packages (deploy/) only; nothing is pushed.
#   VERSION  the release's version, v1.2.3 (default: git describe, else v0.0.0-dev)
#   DIST     output directory (default dist; relative to the repository, or absolute)
# A tagged final version (no -suffix) needs its entry in CHANGELOG.md; before
# the tag, its notes may still be the Unreleased entry (docs/operations.md,
# "Cutting a release").
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
DIST=${DIST:-dist}
case $DIST in /*) ;; *) DIST=$PWD/$DIST ;; esac
DIST=${DIST%/}
if [ -z "$DIST" ] || [ "$DIST" = "$PWD" ] || [ "$DIST" = "$HOME" ]; then
  echo "release: DIST=${DIST:-/} would be emptied first: give a directory of its own" >&2; exit 1
fi
VERSION=${VERSION:-$(git describe --tags --match 'v*' 2>/dev/null || echo v0.0.0-dev)}
COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
# The commit's time, not now: the same commit builds the same files.
DATE=${DATE:-$(git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null || TZ=UTC date +%Y-%m-%dT%H:%M:%SZ)}
export TZ=UTC

if [[ ! $VERSION =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
  echo "release: VERSION=$VERSION is not v<major>.<minor>.<patch>[-pre]" >&2; exit 1
fi
if [[ $VERSION != *-* ]] && ! grep -q "^## \[${VERSION#v}\]" CHANGELOG.md; then
  if git rev-parse -q --verify "refs/tags/$VERSION" >/dev/null || ! grep -q '^## \[Unreleased\]' CHANGELOG.md; then
    echo "release: CHANGELOG.md has no '## [${VERSION#v}]' entry for $VERSION" >&2; exit 1
  fi
  echo "release: $VERSION is not tagged: its notes are CHANGELOG.md's Unreleased entry; name it [${VERSION#v}] in the commit you tag" >&2
fi

rm -rf "$DIST" && mkdir -p "$DIST"
bi=github.com/rls-project/rls/pkg/buildinfo
ldflags="-s -w -X $bi.Version=$VERSION -X $bi.Commit=$COMMIT -X $bi.Date=$DATE"
for arch in amd64 arm64; do
  CGO_ENABLED=0 GOOS=linux GOARCH=$arch "$GO" build -trimpath -buildvcs=false -ldflags "$ldflags" \
    -o "$DIST/rls_${VERSION}_linux_${arch}" ./cmd/rls
done
(cd deploy && "$GO" run ./cmd/chartpkg -chart helm/rls -version "${VERSION#v}" -app-version "$VERSION" -out "$DIST") >/dev/null

cat >"$DIST/IMAGE" <<IMG
# The multi-arch image of rls $VERSION (the Dockerfile cross-compiles per TARGETARCH):
docker buildx build --platform linux/amd64,linux/arm64 \\
  --build-arg VERSION=$VERSION --build-arg COMMIT=$COMMIT --build-arg DATE=$DATE \\
  -t \${IMAGE:-ghcr.io/rls-project/rls}:$VERSION --push .
IMG
(cd "$DIST" && sha256sum rls_* rls-*.tgz IMAGE >SHA256SUMS)
echo "release $VERSION ($COMMIT, $DATE) in $DIST/:"
ls -1 "$DIST"
