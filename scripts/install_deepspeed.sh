#!/usr/bin/env bash
# One-line installer: create or reuse a venv, install mlstack-ds into it, and run
# `mlstack-ds install` there: patched DeepSpeed with ops prebuilt for this machine's GPUs.
#
#   scripts/install_deepspeed.sh [--venv DIR] [--with-torch cpu] [--with-system-deps] [--with-clients]
#                                [--offline BUNDLE] [--] [mlstack-ds install options...]
#   e.g. scripts/install_deepspeed.sh --arch gfx1100      scripts/install_deepspeed.sh -- --dry-run
#
# --venv DIR          the environment that gets DeepSpeed (default: .venv next to this repo). It is
#                     created with --system-site-packages so a system-wide ROCm PyTorch stays visible;
#                     when its own setuptools cannot build wheels (no bdist_wheel), `wheel` is added.
#                     A venv whose torch came with ROCm as Python wheels (TheRock: `rocm[libraries]`)
#                     needs `pip install "rocm[devel]==$(DIR/bin/rocm-sdk version)"` and
#                     `DIR/bin/rocm-sdk init` first (README, "ROCm as Python wheels"); it need not be
#                     activated.
# --with-torch cpu    also install the pinned CPU build of PyTorch (torch==2.13.0+cpu) into the venv,
#                     for machines without a GPU. PyTorch is otherwise never installed behind your back:
#                     pip's unpinned `torch` is a multi-GB CUDA build, wrong for AMD GPUs.
# --with-system-deps  first install the system packages the build needs and this machine lacks: a C++
#                     compiler, Python headers, ninja and the libaio headers (without them async_io, the
#                     op of NVMe offload, is not built), and on Debian/Ubuntu python3-venv when the venv
#                     is still to be made, with apt-get, dnf or zypper, as root or through passwordless
#                     sudo. Otherwise it prints the command to run and goes on without them.
# --with-clients      also install transformers, accelerate, peft and Lightning (requirements/clients.txt),
#                     the libraries verify's client checks run, with the venv's PyTorch held at its version.
# --offline BUNDLE    an air-gapped machine: everything comes from BUNDLE, a directory `mlstack-ds bundle` made
#                     (docs/air-gapped.md), and nothing from the network, this repository or a pip.conf: the
#                     tool itself (its wheel, sha256-checked against BUNDLE/bundle.json), the setuptools or
#                     wheel the venv lacks, the clients (the bundle must be made --with-clients), then
#                     `mlstack-ds install --offline BUNDLE`. pip gets --no-index, a --find-links per project
#                     of BUNDLE/simple, PIP_CONFIG_FILE=/dev/null and none of your PIP_* variables. torch is
#                     never in a bundle: install the site's PyTorch first (--with-torch is refused), and
#                     --with-system-deps only prints the package manager's command (it needs a network).
# Never prompts; sudo only for --with-system-deps and only without a password (sudo -n); safe to re-run.
# At the end it names what is still missing and the one command that adds it.
# Exit codes: those of `mlstack-ds install`; before it runs, 2 for a bad option (or an --offline directory
# that is not a bundle), 3 for what this machine lacks (Python >= 3.10, a venv it can make, system packages it
# could not install) and 7 for what pip could not install: verify's clients, or with --offline what the bundle
# lacks (the tool's wheel, a bundle for this Python, the clients).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$repo/.venv"
with_torch=""
with_system_deps=""
with_clients=""
offline=""
passthrough=()
command_line=("$0" "$@")  # for the closing summary's "run this again with ..."

no_bundle_given() {
  echo "error: --offline needs a bundle directory" >&2
  echo "hint: --offline DIR, where DIR is what \`mlstack-ds bundle --to DIR\` made (docs/air-gapped.md)" >&2
  exit 2
}
usage() { sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p;}' "${BASH_SOURCE[0]}"; }  # the comment block above

while (($#)); do
  case "$1" in
    --venv) [[ $# -ge 2 ]] || { echo "error: --venv needs a directory" >&2; exit 2; }; venv=$2; shift 2 ;;
    --venv=*) venv=${1#--venv=}; shift ;;
    --with-torch) [[ $# -ge 2 ]] || { echo "error: --with-torch needs a kind (cpu)" >&2; exit 2; }; with_torch=$2; shift 2 ;;
    --with-torch=*) with_torch=${1#--with-torch=}; shift ;;
    --with-system-deps) with_system_deps=1; shift ;;
    --with-clients) with_clients=1; shift ;;
    --offline) [[ $# -ge 2 && -n $2 ]] || no_bundle_given; offline=$2; shift 2 ;;
    --offline=?*) offline=${1#--offline=}; shift ;;
    --offline=) no_bundle_given ;;
    -h|--help) usage; exit 0 ;;
    --) shift; passthrough+=("$@"); break ;;
    *) passthrough+=("$1"); shift ;;
  esac
done

case "$with_torch" in
  ""|cpu) ;;
  *) echo "error: --with-torch $with_torch: only 'cpu' can be installed by this script" >&2
     echo "hint: for ROCm, install PyTorch from https://download.pytorch.org/whl/rocmX.Y (matching your ROCm) first" >&2
     exit 2 ;;
esac

# --- --offline BUNDLE: checked before anything is installed; a bundle never holds torch ---
if [[ -n $offline ]]; then
  [[ -d $offline ]] && offline=$(cd "$offline" && pwd)
  if [[ ! -f $offline/bundle.json ]]; then
    echo "error: --offline $offline is not a bundle (no bundle.json)" >&2
    echo "hint: make it with \`mlstack-ds bundle --to DIR\` on a machine with network access, copy DIR here, then pass --offline DIR" >&2
    exit 2
  fi
  if [[ -n $with_torch ]]; then
    echo "error: --with-torch $with_torch cannot be used with --offline: a bundle never holds PyTorch" >&2
    echo "hint: install the site's PyTorch into the venv (or the system Python) first, then run this command again without --with-torch" >&2
    exit 2
  fi
fi

# --- system packages: a C++ compiler, Python headers, ninja, libaio headers, in that order per manager ---
package_manager() {
  local m
  for m in apt-get dnf zypper; do command -v "$m" >/dev/null && { echo "$m"; return; }; done
  return 0
}
system_packages() {
  case $1 in
    apt-get) echo build-essential python3-dev ninja-build libaio-dev ;;
    dnf) echo gcc-c++ python3-devel ninja-build libaio-devel ;;
    zypper) echo gcc-c++ python3-devel ninja libaio-devel ;;
  esac
}
# What each package (same order) is for, as the closing summary names it.
PACKAGE_ROLES=("a C++ compiler for the build" "Python headers for the build" "ninja for parallel op builds"
               "libaio headers for async_io and verify's nvme_offload")
package_installed() {  # MANAGER PACKAGE
  if [[ $1 == apt-get ]]; then
    [[ $(dpkg-query -W -f='${Status}' "$2" 2>/dev/null) == "install ok installed" ]]
  else
    rpm -q "$2" >/dev/null 2>&1
  fi
}
# Debian and Ubuntu keep venv's ensurepip apart from python3: without python3-venv, `python3 -m venv` stops
# half-way ("ensurepip is not available") and leaves a venv without pip behind.
venv_package() {  # MANAGER: the package `python3 -m venv` needs, while the venv is still to be made
  [[ $1 == apt-get && ! -x $venv/bin/python ]] && echo python3-venv
  return 0
}
missing_packages() {  # MANAGER: the missing ones, one a line
  local p
  for p in $(system_packages "$1") $(venv_package "$1"); do package_installed "$1" "$p" || echo "$p"; done
}
install_argv() {  # MANAGER PACKAGES...: the install command, without the root prefix
  local manager=$1; shift
  case $manager in
    apt-get) echo "env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $*" ;;
    dnf) echo "dnf install -y $*" ;;
    zypper) echo "zypper --non-interactive install $*" ;;
  esac
}
# The command a user without root runs by hand, as one line.
manual_command() {  # MANAGER PACKAGES...
  local manager=$1; shift
  if [[ $manager == apt-get ]]; then echo "sudo apt-get update && sudo apt-get install -y $*"
  else echo "sudo $(install_argv "$manager" "$@")"; fi
}

install_system_deps() {
  local manager missing as_root=()
  manager=$(package_manager)
  if [[ -z $manager ]]; then
    echo "==> --with-system-deps: no apt-get, dnf or zypper here; install a C++ compiler, the Python headers," \
         "ninja and the libaio headers with this system's package manager" >&2
    return 0
  fi
  mapfile -t missing < <(missing_packages "$manager")
  if ((${#missing[@]} == 0)); then
    echo "==> system packages: all there ($(system_packages "$manager"))" >&2
    return 0
  fi
  if [[ -n $offline ]]; then
    # A package manager fetches from its repositories: --offline reaches no network, so the command is only named.
    echo "==> not done: --offline installs no system packages (${missing[*]}): $manager needs its package repositories" >&2
    echo "    run, from this site's package mirror: $(manual_command "$manager" "${missing[@]}")" >&2
    echo "    then run this command again; going on without them" >&2
    return 0
  fi
  if [[ $(id -u) -eq 0 ]]; then
    as_root=()
  elif sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    echo "==> not done: installing system packages ${missing[*]} needs root, and sudo asks for a password" >&2
    echo "    run: $(manual_command "$manager" "${missing[@]}")" >&2
    echo "    then run this command again; going on without them" >&2
    return 0
  fi
  echo "==> installing system packages with $manager: ${missing[*]}" >&2
  local argv
  read -r -a argv <<<"$(install_argv "$manager" "${missing[@]}")"
  if [[ $manager == apt-get ]]; then
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || {
      echo "error: apt-get update failed" >&2; echo "hint: check the package sources, then run this command again" >&2
      exit 3; }
  fi
  "${as_root[@]}" "${argv[@]}" >&2 || {
    echo "error: $manager could not install ${missing[*]}" >&2
    echo "hint: run \`$(manual_command "$manager" "${missing[@]}")\` to see why, then this command again" >&2
    exit 3; }
}

[[ -n $with_system_deps ]] && install_system_deps

python=${PYTHON:-python3}
command -v "$python" >/dev/null || { echo "error: $python not found" >&2; echo "hint: install Python >= 3.10" >&2; exit 3; }
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || {
  echo "error: $python is $("$python" -V 2>&1); mlstack-ds needs Python >= 3.10" >&2; exit 3; }

# --- --offline: what the bundle holds for this venv, read (standard library only) before anything changes ---
# Prints the tool's wheel (its sha256 checked against the manifest), the `bundle` command that completes the
# bundle, the one that adds the clients, then the client requirements, one a line (none when it has no clients).
READ_BUNDLE='import hashlib, json, shlex, sys
from pathlib import Path
bundle, with_clients = Path(sys.argv[1]), sys.argv[2] == "1"
def stop(code, error, hint):
    print(f"error: {error}", f"hint: {hint}", sep="\n", file=sys.stderr)
    sys.exit(code)
try:
    m = json.loads((bundle / "bundle.json").read_text(encoding="utf-8"))
    target, version, torch, recipe = m["target"], m["tool_version"], m["torch"], m["recipe"]
    made_for, platform = target["python_version"], target["platform"]
    tools = [f for f in m["files"] if f["kind"] == "tool" and f["project"] == "mlstack-ds" and f["version"] == version]
    clients = [str(r) for r in m["requested"].get("clients", [])]
except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
    stop(2, f"{bundle}/bundle.json is not a bundle manifest ({type(exc).__name__}: {exc})",
         f"make the bundle again on a machine with network access: mlstack-ds bundle --to {bundle}")
def command(to, python, *extra):
    return shlex.join(["mlstack-ds", "bundle", "--to", str(to), "--python-version", python, "--platform", platform,
                       "--recipe", recipe, *extra, "--torch", torch])
here = "%d.%d" % sys.version_info[:2]
complete = command(bundle, here, *(["--with-clients"] if clients else []))
with_clients_command = command(bundle, here, "--with-clients")
if made_for != here:
    other = bundle.with_name(bundle.name + "-py" + here)
    stop(7, f"the bundle in {bundle} was made for Python {made_for}; this venv has Python {here}; "
         "nothing was installed", "make one for this Python (each target has its own directory) on a machine with "
         f"network access: {command(other, here)}")
wheel = bundle / tools[0]["path"] if tools else None
if wheel is None or not wheel.is_file():
    stop(7, f"the bundle in {bundle} lacks mlstack-ds {version}\u0027s own wheel; nothing was installed",
         f"on a machine with network access, complete it: {complete}; then copy it here again")
if hashlib.sha256(wheel.read_bytes()).hexdigest() != tools[0]["sha256"]:
    stop(7, f"the bundle in {bundle} holds a modified {wheel.name} (not the sha256 of its manifest); "
         "nothing was installed", f"remove it, then, on a machine with network access, complete the bundle: "
         f"{complete}; then copy it here again")
if with_clients and not clients:
    stop(7, f"--with-clients: the bundle in {bundle} was made without verify\u0027s clients (transformers, "
         "accelerate, peft, lightning); nothing was installed", "on a machine with network access, add them: "
         f"{with_clients_command}; then copy it here again")
print(wheel, complete, with_clients_command, *clients, sep="\n")'
if [[ -n $offline ]]; then
  bundle_python=$python
  [[ -x $venv/bin/python ]] && bundle_python=$venv/bin/python
  bundle_facts=$("$bundle_python" -c "$READ_BUNDLE" "$offline" "$with_clients") || exit $?
  mapfile -t bundle_facts <<<"$bundle_facts"
  tool_wheel=${bundle_facts[0]}
  complete_bundle_command=${bundle_facts[1]}
  clients_bundle_command=${bundle_facts[2]}
  bundle_clients=("${bundle_facts[@]:3}")
fi
# The venv's pip held to the bundle: --no-index, a --find-links per project of BUNDLE/simple, no pip.conf, none
# of the user's PIP_* variables (as `mlstack-ds install --offline` runs pip: mlstack_ds/bundle/offline.py).
offline_pip() {  # pip ARGS...
  local links=() d
  for d in "$offline"/simple/*/; do links+=(--find-links "${d%/}"); done
  (
    for d in $(compgen -e); do [[ $d == PIP_* ]] && unset "$d"; done
    export PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
    exec "$venv/bin/python" -m pip "$1" --no-index "${links[@]}" "${@:2}"
  )
}
venv_pip() {  # pip ARGS...: held to the bundle with --offline
  if [[ -n $offline ]]; then offline_pip "$@"; else "$venv/bin/python" -m pip "$@"; fi
}

if [[ ! -x $venv/bin/python ]]; then
  echo "==> creating $venv (with system site-packages)" >&2
  [[ -e $venv ]] && venv_existed=1 || venv_existed=""
  if ! made=$("$python" -m venv --system-site-packages "$venv" 2>&1); then
    # What venv made goes, so that the next run makes it again instead of reusing a venv without pip.
    if [[ -z $venv_existed ]]; then rm -rf "$venv"; else rm -f "$venv/pyvenv.cfg" "$venv"/bin/python*; fi
    printf '%s\n' "$made" >&2
    if [[ $made == *"ensurepip is not"* ]]; then
      echo "error: $python cannot make a venv: its ensurepip is missing (Debian and Ubuntu ship it in python3-venv)" >&2
      echo "hint: run this command again with --with-system-deps, or: sudo apt-get install -y python3-venv" >&2
    else
      echo "error: $python -m venv could not make $venv (its message is above)" >&2
      echo "hint: give another directory with --venv DIR, or fix what the message names" >&2
    fi
    exit 3
  fi
fi

# The PyTorch the venv sees already (its own or the system's): "rocm 2.5.1+rocm6.2", "cpu 2.13.0+cpu" or "".
probe_torch() {
  "$venv/bin/python" -c 'import torch
print("rocm" if torch.version.hip else "cuda" if torch.version.cuda else "cpu", torch.__version__)' 2>/dev/null || true
}
existing_torch=$(probe_torch)
if [[ $with_torch == cpu && -n $existing_torch && $existing_torch != cpu* ]]; then
  # Checked before anything is installed: a CPU torch in the venv would shadow the GPU one.
  echo "error: the venv already sees a ${existing_torch%% *} PyTorch (${existing_torch#* }); --with-torch cpu would shadow it with a CPU build" >&2
  echo "hint: leave out --with-torch cpu: DeepSpeed is then built for the PyTorch you have" >&2
  exit 2
fi

if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  echo "error: $venv has no pip (a venv made half-way, e.g. while python3-venv was missing)" >&2
  echo "hint: remove it (rm -rf $venv) and run this command again; it will be made anew" >&2
  exit 3
fi
# Whether the venv's mlstack-ds was installed from WHEEL (pip's direct_url.json names the file).
installed_from() {  # WHEEL
  "$venv/bin/python" -c 'import json, sys
from importlib import metadata
from pathlib import Path
origin = json.loads(metadata.distribution("mlstack-ds").read_text("direct_url.json") or "{}")
sys.exit(origin.get("url") != Path(sys.argv[1]).as_uri())' "$1" 2>/dev/null
}
if [[ -n $offline ]]; then
  # Its dependencies from the bundle, then the tool itself from its wheel where pip kept an installed version equal
  # to the wheel's (one from this repository, say).
  echo "==> installing mlstack-ds into $venv from $offline (${tool_wheel##*/}; no network)" >&2
  { offline_pip install --quiet "$tool_wheel" && { installed_from "$tool_wheel" ||
      offline_pip install --quiet --no-deps --force-reinstall "$tool_wheel"; }; } || {
    echo "error: pip could not install mlstack-ds from the bundle in $offline (pip's message is above)" >&2
    echo "hint: complete the bundle on a machine with network access: $complete_bundle_command; then copy it here again" >&2
    exit 7; }
else
  echo "==> installing mlstack-ds into $venv" >&2
  "$venv/bin/python" -m pip install --quiet "$repo"
fi

if [[ $with_torch == cpu ]]; then
  if [[ -n $existing_torch ]]; then
    echo "==> a CPU PyTorch is already installed: ${existing_torch#* }" >&2
  else
    # The repository's one torch pin (requirements/torch.txt), its CPU build.
    torch_cpu="$(grep -v '^#' "$repo/requirements/torch.txt")+cpu"
    echo "==> installing PyTorch (CPU build, $torch_cpu)" >&2
    "$venv/bin/python" -m pip install --quiet "$torch_cpu"
  fi
fi

# DeepSpeed's build runs setuptools' bdist_wheel. A new venv's own setuptools is its Python's ensurepip copy
# (65.5 on 3.11: no bdist_wheel without the `wheel` package; none at all from 3.12), and it shadows the newer
# one a system PyTorch's site-packages may have. The tool's rule (detect/wheel_builder.py) names what to add.
builder=$("$venv/bin/python" -c 'from mlstack_ds.detect.wheel_builder import main; main()')
if [[ -n $builder ]]; then
  echo "==> installing $builder into $venv${offline:+ from $offline}: its setuptools cannot build wheels (no bdist_wheel)" >&2
  venv_pip install --quiet "$builder" || {
    echo "error: pip could not install $builder into $venv${offline:+ from the bundle in $offline}" >&2
    if [[ -n $offline ]]; then
      echo "hint: complete the bundle on a machine with network access: $complete_bundle_command; then copy it here again" >&2
      exit 7
    fi
    echo "hint: run \`$venv/bin/python -m pip install $builder\` to see why, then this command again" >&2
    exit 3; }
fi

clients_installed() {
  "$venv/bin/python" -c 'import importlib.util as u, sys
sys.exit(not all(u.find_spec(n) for n in ("transformers", "accelerate", "peft", "lightning")))' 2>/dev/null
}

install_clients() {
  local torch_version constraints
  if clients_installed; then
    echo "==> verify's clients (transformers, accelerate, peft, lightning) are already installed" >&2
    return 0
  fi
  torch_version=$(probe_torch)
  torch_version=${torch_version#* }
  if [[ -z $torch_version ]]; then
    # accelerate, peft and lightning depend on torch: without one to hold, pip would fetch a multi-GB CUDA build.
    echo "==> not done: verify's clients (transformers, accelerate, peft, lightning) need the venv's PyTorch first (it is held at its version)" >&2
    return 0
  fi
  constraints=$(mktemp)
  echo "torch==$torch_version" >"$constraints"
  if [[ -n $offline ]]; then
    echo "==> installing transformers, accelerate, peft, lightning from $offline, torch held at $torch_version" >&2
    clients_from=("${bundle_clients[@]}")
  else
    echo "==> installing transformers, accelerate, peft, lightning (requirements/clients.txt), torch held at $torch_version" >&2
    clients_from=(-r "$repo/requirements/clients.txt")
  fi
  if ! venv_pip install --quiet "${clients_from[@]}" -c "$constraints"; then
    rm -f "$constraints"
    echo "error: pip could not install verify's clients (${offline:+from the bundle, }requirements/clients.txt) with torch==$torch_version held" >&2
    echo "hint: pip's message above says which requirement conflicts; torch was left as it was" >&2
    exit 7
  fi
  rm -f "$constraints"
}

[[ -n $with_clients ]] && install_clients

# The closing summary: what is still missing that this script can add, each with the one command that adds it.
rerun() {  # OPTIONS...: this command again with OPTIONS added (before any `--`)
  printf '%q ' "${command_line[0]}" "$@" "${command_line[@]:1}"
}
summary() {
  local manager missing=() roles="" i p packages=() fix nothing=1
  manager=$(package_manager)
  if [[ -n $manager ]]; then
    read -r -a packages <<<"$(system_packages "$manager")"
    for i in "${!packages[@]}"; do
      p=${packages[$i]}
      package_installed "$manager" "$p" || { missing+=("$p"); roles+="${roles:+, }${PACKAGE_ROLES[$i]}"; }
    done
  fi
  if ((${#missing[@]})); then
    nothing=""
    if [[ -z $with_system_deps && -z $offline ]] && { [[ $(id -u) -eq 0 ]] || sudo -n true 2>/dev/null; }; then
      fix=$(rerun --with-system-deps)
    else
      fix="$(manual_command "$manager" "${missing[@]}") && $(rerun)"
    fi
    echo "==> left out: $roles (system package(s) ${missing[*]}); add with: ${fix% }" >&2
  fi
  if ! clients_installed; then
    nothing=""
    if [[ -n $(probe_torch) ]]; then
      # An install that is already up to date runs no verify: --force reinstalls from the cache and verifies.
      if [[ -n $offline ]] && ((${#bundle_clients[@]} == 0)); then
        fix="$clients_bundle_command (on a machine with network access), copy the bundle here, then $(rerun --with-clients)--force"
      else
        fix="$(rerun --with-clients)--force"
      fi
      echo "==> left out: verify's client checks (not all of transformers, accelerate, peft, lightning); add with: $fix" >&2
    fi
  fi
  if [[ -n $nothing ]]; then
    echo "==> nothing left out that this script can add: the system packages and verify's clients are installed" >&2
  fi
}

# Without torch, `install` stops with the exact PyTorch index for the detected ROCm (exit 3).
# The tool runs as a child (the summary comes after it), so a SIGTERM or SIGHUP sent to this script (a job
# controller, `timeout`) is passed on: the tool stops its build or verify cleanly and this script waits for
# it. Ctrl-C needs no passing on: the terminal sends it to the tool too (same process group).
offline_args=()
[[ -n $offline ]] && offline_args=(--offline "$offline")
"$venv/bin/mlstack-ds" install --python "$venv/bin/python" "${offline_args[@]}" "${passthrough[@]}" <&0 &
tool=$!
trap 'kill -TERM "$tool" 2>/dev/null' TERM HUP
trap ':' INT
set +e
wait "$tool"
rc=$?
while kill -0 "$tool" 2>/dev/null; do  # `wait` returned for a trapped signal: the tool is still stopping
  wait "$tool"
  rc=$?
done
set -e
trap - TERM HUP INT
if ((rc == 130)); then
  exit "$rc"  # stopped: no summary of what was left out
fi
summary
exit "$rc"
