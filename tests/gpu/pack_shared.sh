#!/usr/bin/env bash
# Packs what the GPU suite (make test-gpu) needs beyond ../shared/tools/gpu_prep.sh, for a lent GPU machine: the
# fastapi-offline wheel (the servers' /docs assets; gpu_prep.sh does not bring it), the shared data, and the three
# real MiniLM checkpoints (about 45 MiB each: one per transfer, as a transfer carries at most 64 MiB).
#
#   bash tests/gpu/pack_shared.sh        # in the project root, after gpu_prep.sh; writes .gpu/suite/s0, s1, s2
#
# Then, on the machine gpu_prep.sh's four runs prepared, back to back (it goes back after 30 s idle), each run
# taking along the path named:
#   5. [".gpu/suite/s0"]   source /tmp/gpu/env.sh && bash tests/gpu/pack_shared.sh unpack .gpu/suite/s0
#   6. [".gpu/suite/s1"]   source /tmp/gpu/env.sh && bash tests/gpu/pack_shared.sh unpack .gpu/suite/s1
#   7. [".gpu/suite/s2"]   source /tmp/gpu/env.sh && bash tests/gpu/pack_shared.sh unpack .gpu/suite/s2 && \
#                          BERTSERVE_SHARED=/tmp/shared make test-gpu GPU_PYTHON=python3
set -euo pipefail
if [ "${1:-}" = unpack ]; then
  piece=$2
  mkdir -p /tmp/shared/models /tmp/site
  for wheel in "$piece"/*.whl; do
    [ -e "$wheel" ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$wheel"
  done
  [ -d "$piece/data" ] && cp -r "$piece/data" /tmp/shared/
  cp -r "$piece"/models/* /tmp/shared/models/
  echo "unpacked $piece: $(ls /tmp/shared/models | tr '\n' ' ')"
  exit 0
fi
top=$(git rev-parse --show-toplevel)
cd "$top"
shared=${BERTSERVE_SHARED:-$top/../shared}
exclude=$(git rev-parse --git-common-dir)/info/exclude  # a worktree's .git is a file
grep -qx '/.gpu/' "$exclude" 2>/dev/null || { mkdir -p "$(dirname "$exclude")"; echo '/.gpu/' >> "$exclude"; }
rm -rf .gpu/suite && mkdir -p .gpu/suite/s0/models .gpu/suite/s1/models .gpu/suite/s2/models
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  -d .gpu/suite/s0 "fastapi-offline==1.7.7"
cp -r "$shared/data" .gpu/suite/s0/
cp -r "$shared/models/minilm-bert-sst2" .gpu/suite/s0/models/
cp -r "$shared/models/minilm-bert-conll03" .gpu/suite/s1/models/
cp -r "$shared/models/minilm-bert-squad" .gpu/suite/s2/models/
du -sh .gpu/suite/s*
