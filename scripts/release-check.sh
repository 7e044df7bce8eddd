#!/usr/bin/env bash
# make release-check: a release dry run into $DIST, then checks of what it
# made: both binaries for their platform with the version and commit, the
# checksums, the chart's version and appVersion, and `rls version`.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
DIST=${DIST:-dist}
case $DIST in /*) ;; *) DIST=$PWD/$DIST ;; esac
VERSION=${VERSION:-v0.0.0-dryrun}
COMMIT=$(git rev-parse HEAD 2>/dev/null || echo unknown)
DIST=$DIST VERSION=$VERSION bash scripts/release.sh >/dev/null
fail() { echo "release-check: $*" >&2; exit 1; }

for arch in amd64 arm64; do
  bin="$DIST/rls_${VERSION}_linux_${arch}"
  info=$("$GO" version -m "$bin") || fail "$bin: not a Go binary"
  grep -q "GOARCH=$arch" <<<"$info" || fail "$bin: not built for $arch"
  grep -q "GOOS=linux" <<<"$info" || fail "$bin: not built for linux"
  grep -q "CGO_ENABLED=0" <<<"$info" || fail "$bin: built with cgo (not static)"
  # -trimpath keeps -ldflags out of the build info: look for the values.
  grep -aq "$VERSION" "$bin" && grep -aq "$COMMIT" "$bin" || fail "$bin: version $VERSION or commit $COMMIT not built in"
done
(cd "$DIST" && sha256sum --quiet -c SHA256SUMS) || fail "SHA256SUMS does not match"
for f in "$DIST"/rls_* "$DIST"/rls-*.tgz; do
  grep -q " $(basename "$f")\$" "$DIST/SHA256SUMS" || fail "SHA256SUMS lacks $(basename "$f")"
done
chart="$DIST/rls-${VERSION#v}.tgz"
[ -f "$chart" ] || fail "no chart $chart"
meta=$(tar -xzOf "$chart" rls/Chart.yaml)
grep -q "^version: ${VERSION#v}\$" <<<"$meta" || fail "chart version is not ${VERSION#v}: $meta"
grep -Eq "^appVersion: \"?$VERSION\"?\$" <<<"$meta" || fail "chart appVersion is not $VERSION: $meta"
files=$(tar -tzf "$chart")
grep -qx 'rls/files/example.yaml' <<<"$files" || fail "the chart lacks files/example.yaml"
grep -q "buildx build --platform linux/amd64,linux/arm64" "$DIST/IMAGE" || fail "no multi-arch image command"
if [ "$(uname -m)" = x86_64 ]; then
  out=$("$DIST/rls_${VERSION}_linux_amd64" version)
  [[ $out == "rls $VERSION commit $COMMIT built "* ]] || fail "rls version printed '$out', want version $VERSION and commit $COMMIT"
fi
echo "release-check: ok: $(ls "$DIST" | tr '\n' ' ')"
