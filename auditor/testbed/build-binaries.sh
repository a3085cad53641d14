#!/usr/bin/env bash
# Builds the test bed's control-plane binaries from the Go module proxy at pinned versions and
# caches them by version outside the repo, so only the first run on a machine pays for the build.
# Prints the bin directory on its last line. Idempotent. With KUEUE_VERSION set, also builds the
# Kueue controller into its own directory ($CACHE/bin/kueue-$KUEUE_VERSION/kueue).
set -euo pipefail
K8S=${K8S_VERSION:-1.36.3}
ETCD=${ETCD_VERSION:-3.6.16}
HELM=${HELM_VERSION:-3.21.4}
MINOR=${K8S#1.}; MINOR=${MINOR%%.*}; PATCH=${K8S##*.}
CACHE=${GPU_AUDITOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-auditor}
OUT=${K8S_OUT:-$CACHE/bin/k8s-v$K8S-etcd-v$ETCD-helm-v$HELM}
# K8S_BINS (space-separated) and K8S_ONLY=1 (no etcd, helm, kueue) build a subset: the floor's apiserver.
K8S_BINS=(${K8S_BINS:-kube-apiserver kube-controller-manager kube-scheduler kubelet})
WANT=("${K8S_BINS[@]}"); [[ -n ${K8S_ONLY:-} ]] || WANT+=(etcd helm)
KUEUE=${KUEUE_VERSION:-}; [[ -z ${K8S_ONLY:-} ]] || KUEUE=
KUEUE_OUT=$CACHE/bin/kueue-$KUEUE
missing() {
  for b in "${WANT[@]}"; do [[ -x $OUT/$b ]] || return 0; done
  [[ -z $KUEUE || -x $KUEUE_OUT/kueue ]] || return 0
  return 1
}
if ! missing; then echo "$OUT"; exit 0; fi
command -v go >/dev/null || { echo "build-binaries: 'go' not found on PATH (Go >= 1.26 is needed)" >&2; exit 1; }
export GOTOOLCHAIN=${GOTOOLCHAIN:-local} CGO_ENABLED=0 GOFLAGS="-mod=mod -modcacherw"
mkdir -p "$OUT"
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
log() { echo "[build-binaries $(date +%H:%M:%S)] $*" >&2; }
BUILD_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)

k8s_missing() { for b in "${K8S_BINS[@]}"; do [[ -x $OUT/$b ]] || return 0; done; return 1; }
if k8s_missing; then
  mkdir "$W/k8s" && cd "$W/k8s"
  go mod init local.test/k8s-testbin >/dev/null 2>&1
  go mod edit -go=1.26.0 -godebug=default=go1.26
  log "resolving k8s.io/kubernetes v$K8S"
  GOMOD=$(go mod download -json "k8s.io/kubernetes@v$K8S" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
  for m in $(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$GOMOD" | sort -u); do
    go mod edit -replace="$m=$m@v0.$MINOR.$PATCH"
  done
  go get -tool $(for b in "${K8S_BINS[@]}"; do echo "k8s.io/kubernetes/cmd/$b@v$K8S"; done) >&2
  LDF="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    LDF+=" -X $p.gitVersion=v$K8S -X $p.gitMajor=1 -X $p.gitMinor=$MINOR -X $p.gitTreeState=clean -X $p.buildDate=$BUILD_DATE"
  done
  for b in "${K8S_BINS[@]}"; do
    [[ -x $OUT/$b ]] && continue
    log "building $b v$K8S (cold: many minutes)"
    go build -p 2 -trimpath -tags=selinux,notest,grpcnotrace -ldflags="$LDF" -o "$OUT/$b.tmp" "k8s.io/kubernetes/cmd/$b"
    mv "$OUT/$b.tmp" "$OUT/$b"
  done
fi
if [[ -n ${K8S_ONLY:-} ]]; then echo "$OUT"; exit 0; fi

if [[ ! -x $OUT/etcd ]]; then
  mkdir -p "$W/etcd" && cd "$W/etcd"
  go mod init local.test/etcd-testbin >/dev/null 2>&1
  log "building etcd v$ETCD"
  go get -tool "go.etcd.io/etcd/server/v3@v$ETCD" >&2
  go build -p 2 -trimpath -ldflags="-s -w" -o "$OUT/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$OUT/etcd.tmp" "$OUT/etcd"
fi

if [[ ! -x $OUT/helm ]]; then
  mkdir -p "$W/helm" && cd "$W/helm"
  go mod init local.test/helm-testbin >/dev/null 2>&1
  log "building helm v$HELM"
  go get -tool "helm.sh/helm/v3/cmd/helm@v$HELM" >&2
  HLDF="-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM"
  for p in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    HLDF+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$MINOR"
  done
  go build -p 2 -trimpath -ldflags="$HLDF" -o "$OUT/helm.tmp" helm.sh/helm/v3/cmd/helm
  mv "$OUT/helm.tmp" "$OUT/helm"
fi

if [[ -n $KUEUE && ! -x $KUEUE_OUT/kueue ]]; then
  # Kueue's go.mod has no replace directives, so `go install pkg@version` builds it as published.
  log "building kueue $KUEUE (cold: a few minutes)"
  mkdir -p "$KUEUE_OUT" "$W/kueue-bin"
  KLDF="-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE -X sigs.k8s.io/kueue/pkg/version.BuildDate=$BUILD_DATE"
  GOBIN=$W/kueue-bin go install -p 2 -trimpath -ldflags="$KLDF" "sigs.k8s.io/kueue/cmd/kueue@$KUEUE"
  cp "$W/kueue-bin/kueue" "$KUEUE_OUT/kueue.tmp"
  mv "$KUEUE_OUT/kueue.tmp" "$KUEUE_OUT/kueue"
fi
echo "$OUT"
