#!/usr/bin/env bash
# Packs, on this machine, all that a lent GPU machine needs for the GPU suite (make test-gpu) and the NER/QA
# benchmark: onnxruntime-gpu and the serving wheels (from ../shared/tools/gpu_prep.sh), grpcio and protobuf as new
# as service/frontend/grpc needs (the machine's own may be older), fastapi-offline, ../shared/data and the three
# MiniLM checkpoints. That is ~357 MB; every run sends the working tree too (tracked files and untracked ones git
# does not ignore) and may carry at most 64 MiB with it. So it all goes as one tar in pieces sized from the tree,
# one piece per run, and the last run (tests/gpu/device_run.sh, copied next to the last piece) unpacks and tests.
#
#   bash tests/gpu/device_pack.sh    # in the project root or a worktree; writes .gpu/q/q0..qN, prints the runs
#
# Environment: BERTSERVE_SHARED (default ../shared); GPU_PREP, a gpu_prep.sh output folder to reuse (default
# .gpu/prep, written on the first run; remove it for a fresh download); LIMIT and HEADROOM in bytes (64 MiB, 2 MiB);
# BASE_REV, a commit whose checkout (git archive, ~6 MB) goes in the tar, for device_run.sh to measure first in
# every benchmark (--base-source), as issue 37's tables are: BASE_REV=c2fa199 bash tests/gpu/device_pack.sh
set -euo pipefail
top=$(git rev-parse --show-toplevel)
cd "$top"
shared=${BERTSERVE_SHARED:-$top/../shared}
shared=$(cd "$shared" && pwd)
limit=${LIMIT:-67108864}
headroom=${HEADROOM:-2097152}
prep=${GPU_PREP:-.gpu/prep}
# What grpc/*_pb2*.py need (pyproject.toml: grpcio==1.85.3, protobuf>=6.33.5), the servers' /docs assets, gRPC's
# health service, orjson (the answers' JSON) and the tracing SDK with its OTLP exporters (service imports them; the
# machine has none of them).
# Versions as constraints.txt pins them; opentelemetry-api comes from gpu_prep.sh.
extra="grpcio==1.85.3 protobuf==6.33.6 fastapi-offline==1.7.7 grpcio-health-checking==1.81.1 orjson==3.13.0
  opentelemetry-sdk==1.45.2 opentelemetry-semantic-conventions==0.66b2 opentelemetry-proto==1.45.2
  opentelemetry-exporter-otlp-proto-grpc==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2
  opentelemetry-exporter-otlp-proto-common==1.45.2 opentelemetry-exporter-otlp-common==0.66b2
  opentelemetry-exporter-http-transport==0.66b2 googleapis-common-protos==1.76.0"

exclude=$(git rev-parse --git-common-dir)/info/exclude  # a worktree's .git is a file
grep -qx '/.gpu/' "$exclude" 2>/dev/null || { mkdir -p "$(dirname "$exclude")"; echo '/.gpu/' >> "$exclude"; }

# The tree every run sends, as the device tool sees it: tracked files and untracked ones git does not ignore.
tree=$( { git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null || true; } |
  awk '{s += $1} END {print s + 0}')
piece=$(( limit - headroom - tree ))
[ "$piece" -gt 4000000 ] || { echo "the tree ($tree bytes) leaves no room under $limit bytes" >&2; exit 1; }
echo "tree $tree bytes: pieces of $piece bytes (limit $limit, headroom $headroom)"

# 1. onnxruntime-gpu and the serving wheels. gpu_prep.sh wipes .gpu/ and writes .git/info/exclude in the root of the
# checkout it runs in (a worktree has no .git folder): run it in a scratch repository holding only pyproject.toml.
if [ -d "$prep/p0" ] && [ -d "$prep/wheels" ]; then
  echo "reusing gpu_prep.sh's output in $prep"
else
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  git init -q "$scratch"
  cp pyproject.toml "$scratch/"
  (cd "$scratch" && PIECE=$piece bash "$shared/tools/gpu_prep.sh" > "$scratch/prep.log")
  mkdir -p "$(dirname "$prep")"
  rm -rf "$prep"
  mv "$scratch/.gpu" "$prep"
  echo "gpu_prep.sh: $(ls -d "$prep"/p* | wc -l) onnxruntime-gpu pieces, wheels $(du -sh "$prep/wheels" | cut -f1)"
fi

# 2. and 3. One staging folder, tarred and split.
stage=.gpu/stage
rm -rf "$stage" .gpu/q
mkdir -p "$stage/wheels" "$stage/shared/models" .gpu/q
i=0
while [ -d "$prep/p$i" ]; do cat "$prep/p$i"/ort.tar.xz.*; i=$((i + 1)); done > "$stage/ort.tar.xz"
cp "$prep"/wheels/*.whl "$stage/wheels/"
# shellcheck disable=SC2086  # $extra is a list of requirements
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$stage/wheels" $extra
cp -r "$shared/data" "$stage/shared/"
for m in minilm-bert-sst2 minilm-bert-conll03 minilm-bert-squad; do cp -r "$shared/models/$m" "$stage/shared/models/"; done
if [ -n "${BASE_REV:-}" ]; then
  git archive "$BASE_REV" | gzip -9 > "$stage/base.tgz"
  echo "$BASE_REV ($(git rev-parse --short "$BASE_REV")) goes in the tar as base.tgz"
fi
tar cf - -C "$stage" . | split -b "$piece" -d -a 2 - .gpu/q/part.
rm -rf "$stage"
n=0
for p in .gpu/q/part.*; do
  size=$(stat -c %s "$p")
  [ $(( size + tree )) -lt "$limit" ] || { echo "$p ($size bytes) and the tree are over $limit bytes" >&2; exit 1; }
  mkdir -p ".gpu/q/q$n"
  mv "$p" ".gpu/q/q$n/"
  n=$((n + 1))
done
last=.gpu/q/q$((n - 1))
(cd .gpu/q && for d in q*; do (cd "$d" && sha256sum part.*); done) > "$last/parts.sha256"
cp tests/gpu/device_run.sh "$last/"
echo "wrote $n pieces, $(du -cb .gpu/q/q*/part.* | tail -1 | cut -f1) bytes in all:"
du -sb .gpu/q/q* | sed 's/^/  /'

echo "On the GPU machine, one run per line, back to back (it goes back after 30 s idle), each carrying the path named;"
echo "a fresh machine needs them all again:"
for i in $(seq 0 $((n - 2))); do
  echo "  $((i + 1)). carry [\".gpu/q/q$i\"]  mkdir -p /tmp/q && cp .gpu/q/q$i/part.* /tmp/q/"
done
if [ -n "${BASE_REV:-}" ]; then  # the suite, then NER/QA and SST-2, each against the base (device_run.sh's header)
  echo "  $n. carry [\"$last\"], timeout_s 600  SUITE_S=150 TOTAL_S=580 SST2_S=140 bash $last/device_run.sh"
else
  echo "  $n. carry [\"$last\"], timeout_s 600  SUITE_S=330 TOTAL_S=570 bash $last/device_run.sh"
fi
echo "It writes \$OUT/gpu_suite.log, \$OUT/gpu_bench.log and \$OUT/gpu_benchmark.json."
