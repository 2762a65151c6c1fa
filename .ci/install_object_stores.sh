#!/usr/bin/env bash
# Builds the object-store servers the storage tests start on loopback (MinIO for s3://,
# fake-gcs-server for gs://) from their Go modules, pinned, into the project cache; a binary that
# is already there is kept, so running this again costs nothing. Prints the bin directory.
#
# ./run_tests.sh calls this before the first test (.ci/install_test_prerequisites.sh), and the
# tests' fixtures when a binary is missing, so a clean machine needs only Go.
# First builds on 2 cores: MinIO about 8 minutes, fake-gcs-server about 2.
set -euo pipefail

# MinIO publishes no semver tags on its Go module, only pseudo-versions of its main branch; this
# is the one the Go module proxy gave as @latest on 2026-11-30. fake-gcs-server is a tagged release
# (the newest), built with one patch (see FAKE_GCS_PATCH).
MINIO_MODULE="github.com/minio/minio@v0.0.0-20260212201848-7aac2a2c5b7c"
FAKE_GCS_MODULE="github.com/fsouza/fake-gcs-server@v1.56.1"
# fake-gcs-server drops every part of a batch request that has no Content-ID header and answers an
# empty multipart body. Content-ID is optional in GCS's batch API and google-cloud-storage sends
# none, so Beam's GCS rename and delete (both batches) failed with "Bad response: not multi-part"
# against it, while real GCS answers them. The patch numbers such parts instead of dropping them.
FAKE_GCS_PATCH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/fake-gcs-server-batch-content-id.patch"

GO_BUILD_FLAGS=(-trimpath "-ldflags=-s -w")
cache="${IMAGES_TO_TFRECORDS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/images-to-tfrecords}"
log() { printf '[install_object_stores] %s\n' "$*" >&2; }

command -v go >/dev/null 2>&1 \
  || { log "error: Go is missing: the object-store tests build MinIO and fake-gcs-server with 'go install' (install Go 1.24 or newer)"; exit 2; }

# build NAME MODULE [PATCH]: builds MODULE into $cache/object-stores/<version>[-<patch>]/bin unless
# NAME is there: with go install, or, given a PATCH, from the module's source with the patch applied.
# One folder per pin (and patch), so changing either builds afresh instead of reusing an old binary.
build() {
  local name=$1 module=$2 patch=${3:-} bin tmp src
  bin="$cache/object-stores/${module##*@}${patch:+-$(sha256sum "$patch" | cut -c1-12)}/bin"
  mkdir -p "$cache/object-stores"
  # One build of NAME at a time: a test fixture (or a second ./run_tests.sh) that needs the binary
  # while another build of it runs waits here for that build instead of starting its own.
  exec {lock}>"$cache/object-stores/.build-$name.lock"
  flock "$lock"
  if [[ -x "$bin/$name" ]]; then
    exec {lock}>&-
    printf '%s\n' "$bin/$name"
    return
  fi
  tmp=$(mktemp -d "$cache/object-stores/.build-$name.XXXXXX")
  log "building $module (first run only)"
  # CGO off: a static binary that needs no C toolchain. A build into a temp folder, moved into
  # place only when complete, so an interrupted build never leaves a binary that looks finished.
  # No symbol table nor DWARF (-s -w): the tests never debug the servers, and the linker skips
  # writing them. -trimpath keeps this machine's paths out of the binary.
  if [[ -z "$patch" ]]; then
    if ! CGO_ENABLED=0 GOBIN="$tmp" go install "${GO_BUILD_FLAGS[@]}" "$module" >&2; then
      rm -rf "$tmp"
      log "error: go install $module failed (see above)"
      exit 1
    fi
  else
    # The module's own go.mod and go.sum pin its dependencies, as go install would.
    src=$(go mod download -json "$module" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [[ -d "$src" ]] || { rm -rf "$tmp"; log "error: go mod download $module gave no source folder"; exit 1; }
    cp -r "$src" "$tmp/src" && chmod -R u+w "$tmp/src"
    if ! patch -d "$tmp/src" -p1 --quiet <"$patch" \
        || ! (cd "$tmp/src" && CGO_ENABLED=0 go build "${GO_BUILD_FLAGS[@]}" -o "$tmp/$name" .) >&2; then
      rm -rf "$tmp"
      log "error: building $module with $(basename "$patch") failed (see above)"
      exit 1
    fi
  fi
  mkdir -p "$bin"
  mv -f "$tmp/$name" "$bin/$name"
  rm -rf "$tmp"
  exec {lock}>&-
  printf '%s\n' "$bin/$name"
}

case "${1:-all}" in
  minio) build minio "$MINIO_MODULE" ;;
  fake-gcs-server) build fake-gcs-server "$FAKE_GCS_MODULE" "$FAKE_GCS_PATCH" ;;
  all) build fake-gcs-server "$FAKE_GCS_MODULE" "$FAKE_GCS_PATCH"; build minio "$MINIO_MODULE" ;;
  *) log "error: unknown server '$1' (expected minio, fake-gcs-server or all)"; exit 2 ;;
esac
