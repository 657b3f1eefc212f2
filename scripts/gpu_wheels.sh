#!/usr/bin/env bash
# Fill DIR with what scripts/gpu_check.sh installs on a GPU machine that has no network: the tool's own
# wheel (built from this checkout), DeepSpeed's sdist for the pin (sha256-checked against the recipe), and
# binary wheels of DeepSpeed's and the tool's requirements that a GPU image typically lacks, and the pinned
# clients (requirements/clients.txt) verify's client checks run. Never torch:
# the GPU machine's own torch is the target, and a bare torch wheel is a multi-GB CUDA build.
#   scripts/gpu_wheels.sh DIR [--python-version 3.12] [--pin 0.19.5] [--python PY]
# Run on a networked machine. Exit codes: 0 done, 2 usage, 4 a download failed or the sdist's sha256 is wrong.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage_error() {
  echo "error: $1" >&2
  echo "hint: scripts/gpu_wheels.sh DIR [--python-version 3.12] [--pin 0.19.5] [--python PY]" >&2
  exit 2
}

DIR="" PYVER=3.12 PIN=0.19.5 PY=${PYTHON:-python3}
while (($#)); do
  case $1 in
    --python-version) [[ $# -ge 2 ]] || usage_error "--python-version needs a value (e.g. 3.12)"; PYVER=$2; shift 2 ;;
    --pin) [[ $# -ge 2 ]] || usage_error "--pin needs a DeepSpeed version (e.g. 0.19.5)"; PIN=$2; shift 2 ;;
    --python) [[ $# -ge 2 ]] || usage_error "--python needs an interpreter with pip"; PY=$2; shift 2 ;;
    -h|--help) sed -n '2,7p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) usage_error "unknown option $1" ;;
    *) [[ -z $DIR ]] || usage_error "one DIR only (got $DIR and $1)"; DIR=$1; shift ;;
  esac
done
[[ -n $DIR ]] || usage_error "name the directory to fill"
[[ $PYVER =~ ^3\.[0-9]+$ ]] || usage_error "--python-version must look like 3.12 (got $PYVER)"
RECIPE=recipes/deepspeed-$PIN.toml
[[ -f $RECIPE ]] || usage_error "no recipe for DeepSpeed $PIN ($RECIPE); see: ls recipes/"
command -v "$PY" >/dev/null || usage_error "no interpreter $PY; pass --python PY (one with pip)"
mkdir -p "$DIR"

fail() { echo "error: $1" >&2; echo "hint: $2" >&2; exit 4; }
PIP=("$PY" -m pip --disable-pip-version-check)

echo "gpu_wheels: the tool's own wheel (from this checkout)"
rm -f "$DIR"/mlstack_ds-*.whl
"${PIP[@]}" wheel --quiet --no-deps -w "$DIR" . || fail "building the tool's wheel failed" "run: $PY -m pip wheel --no-deps -w $DIR ."

echo "gpu_wheels: DeepSpeed $PIN sdist"
SDIST=$DIR/deepspeed-$PIN.tar.gz
WANT=$(sed -n 's/^sha256 = "\([0-9a-f]\{64\}\)"$/\1/p' "$RECIPE" | head -n1)
[[ -n $WANT ]] || fail "$RECIPE has no sdist sha256" "check its [source.sdist] table"
if [[ ! -f $SDIST ]] || [[ $(sha256sum "$SDIST" | cut -d' ' -f1) != "$WANT" ]]; then
  rm -f "$SDIST"
  "${PIP[@]}" download --quiet --no-deps --no-binary :all: -d "$DIR" "deepspeed==$PIN" \
    || fail "pip could not download deepspeed==$PIN" "check this machine's network and pip configuration"
fi
GOT=$(sha256sum "$SDIST" | cut -d' ' -f1)
[[ $GOT == "$WANT" ]] || { rm -f "$SDIST"; fail "$SDIST has sha256 $GOT, the recipe pins $WANT" "the index served another file; do not use it"; }

echo "gpu_wheels: binary wheels for CPython $PYVER, x86_64 Linux"
BINARY=("${PIP[@]}" download --quiet --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
        --platform any -d "$DIR")
"${BINARY[@]}" unidiff hjson pydantic annotated-types typing-inspection "typing-extensions>=4.16" \
  || fail "pip could not download the binary wheels" "check this machine's network and pip configuration"
# pydantic pins pydantic-core exactly: take the version its metadata names.
PYDANTIC=$(ls -t "$DIR"/pydantic-[0-9]*.whl | head -n1)
CORE=$("$PY" - "$PYDANTIC" <<'EOF'
import re, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    text = wheel.read(meta).decode()
match = re.search(r"^Requires-Dist: pydantic[-_]core\s*\(?==\s*([^\s;,)]+)", text, re.M | re.I)
print(match.group(1) if match else "")
EOF
)
[[ -n $CORE ]] || fail "$PYDANTIC names no exact pydantic-core" "download pydantic-core by hand into $DIR"
"${BINARY[@]}" "pydantic-core==$CORE" || fail "pip could not download pydantic-core==$CORE" "check the network"

echo "gpu_wheels: the clients verify's client checks run (requirements/clients.txt), without their requirements"
# Their own requirements (huggingface-hub, tokenizers, safetensors, ...) come with a GPU image's transformers;
# torch is never downloaded (accelerate requires it: gpu_check.py holds the machine's).
mapfile -t CLIENTS < <(grep -v '^#' requirements/clients.txt | grep .)
# regex: transformers needs a recent one (>= 2025.10.22 for 5.23) that an older image may lack; lightning-utilities,
# torchmetrics and pytorch-lightning: Lightning's own (gpu_check.py CLIENT_REQUIREMENT_WHEELS installs them beside
# the clients).
"${BINARY[@]}" "${CLIENTS[@]}" regex lightning-utilities torchmetrics "pytorch-lightning==$(sed -n 's/^lightning==//p' requirements/clients.txt)" \
  || fail "pip could not download ${CLIENTS[*]}" "check the network"

echo "gpu_wheels: $DIR holds"
ls -l "$DIR" | tail -n +2
echo "gpu_wheels: total $(du -sh "$DIR" | cut -f1)"
