"""The options registry: every option that two or more commands take is declared here, once.

Why one module: `--python` used to be a `Path` in one command, a `str` in another and resolved in
three places; `--source` defaulted to `pypi` for `install` and to `git` for `fetch`; the recipe was
`--recipe` for some commands and `--deepspeed-version` for others; `--hostfile` was declared in four
modules and `--cache-dir` in three with three help texts. A command module declares only the options no
other command has (`tests/unit/test_cli_options_registry.py` holds this).

One style: `Annotated` aliases, the default written at the parameter (`cache_dir: CacheDirOption = None`),
so two commands can share a flag and differ in its default. Where the flag does a different thing in each
command (what `--hostfile` runs on the nodes, what `--timeout` bounds), one private factory here declares
it, and the per-command aliases below it say the difference; the flag, its type and its shared wording stay
in this file. Each command still parses the values it always accepted (`--world-size` is one number for
`verify`, a list for `bench`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from mlstack_ds.bench.spec import DEFAULT_SEQ_LEN, GUIDE_SEQ_LEN
from mlstack_ds.detect.environment import resolve_python
from mlstack_ds.recipe import DEFAULT_RECIPE

# `--source` default for `fetch`, `install` and `build`: the PyPI sdist. The package index is what pip
# already reaches on machines where github.com is not (air-gapped sites run an index mirror or a
# find-links directory; proxies and certificates are pip's own configuration), and the sdist is pinned by
# sha256 in the recipe, so it is as exact as the git tag plus commit. `--source git` is one option away.
DEFAULT_SOURCE = "pypi"


def _resolve_python(value: Path | None) -> Path:
    """The one resolution of `--python` (an interpreter or a venv directory; default: this interpreter),
    done while parsing so that every command gets the same absolute path and the same refusals. A command
    body gets this `Path`, never None, and resolves nothing again."""
    return resolve_python(value)


# --- every command's ---------------------------------------------------------------------------------------

JsonOption = Annotated[bool, typer.Option(
    "--json", help="Print one JSON document on stdout (also on failure); progress goes to stderr.")]

# Declared `Path`: the callback turns "not given" (None) into this interpreter before the body runs.
PythonOption = Annotated[Path, typer.Option(
    "--python", callback=_resolve_python, metavar="PATH",
    help="Target interpreter or venv directory (the one that has or gets DeepSpeed). Default: the one "
    "running mlstack-ds.")]

RecipeOption = Annotated[str, typer.Option(
    "--recipe", "--deepspeed-version", metavar="NAME|VERSION|PATH",
    help="The pinned release: a shipped recipe (deepspeed-0.19.5), its version (0.19.5) or a recipe .toml "
    "file. --deepspeed-version is an alias.")]

# --- the source and the build: `fetch`, `install`, `build` (and `patches refresh` for the cache) -------------

SourceOption = Annotated[str, typer.Option(
    "--source", metavar="pypi|git|URL|PATH",
    help="Where DeepSpeed's source comes from: pypi (the pinned sdist, via pip's index configuration; "
    "default), git (the pinned tag and commit), an http(s) URL of an archive, or a local checkout, "
    "sdist directory or archive.")]
GitUrlOption = Annotated[str | None, typer.Option(
    "--git-url", help="Clone from this URL or local mirror instead of the recipe's (with --source git).")]
GitCommitOption = Annotated[str | None, typer.Option(
    "--git-commit", help="Expect this commit for the tag instead of the pinned one (a mirror).")]
Sha256Option = Annotated[str | None, typer.Option(
    "--sha256", help="Expected sha256 of a URL/PATH archive that is not the pinned sdist.")]
CacheDirOption = Annotated[Path | None, typer.Option(
    "--cache-dir", help="Downloads, sources and wheels (default $XDG_CACHE_HOME/mlstack-ds).")]

# The build's own options, shared by `install` and `build` (the same plan, one stops at the wheel).
ArchOption = Annotated[str | None, typer.Option(
    "--arch", help="GPU targets, e.g. gfx1100 or gfx90a,gfx942. Default: $PYTORCH_ROCM_ARCH, else the detected "
    "discrete GPUs.")]
JobsOption = Annotated[int | None, typer.Option(
    "--jobs", help="The compile budget, split over ops, files and ROCm archs (up to twice as many compilers, "
    "so an op left alone keeps every core); clamped to what memory allows (2 GiB per "
    "compile, per arch for hipcc). 1: one compile at a time. Default: the CPUs.")]
NoPatchesOption = Annotated[bool, typer.Option("--no-patches", help="Build upstream as released, unpatched.")]
DryRunOption = Annotated[bool, typer.Option("--dry-run", help="Print the build plan and stop; change nothing.")]
RebuildOption = Annotated[bool, typer.Option("--rebuild", help="Rebuild the wheel instead of reusing the cache.")]

# --- changing an environment: `install`, `rollback`, `uninstall` ------------------------------------------------

# One change at a time per environment (installed/lock.py): the others wait for it, and say so.
LockTimeoutOption = Annotated[float | None, typer.Option(
    "--lock-timeout", metavar="SECONDS", min=0,
    help="When another mlstack-ds install, rollback or uninstall is changing the same environment, wait at "
    "most this long for it (0: refuse at once, exit 7). Default: wait until it ends.")]

# --- multi-node and runs: `install`, `verify`, `bench`, `doctor` ----------------------------------------------


def _hostfile(does: str) -> Any:
    return Annotated[Path | None, typer.Option(
        "--hostfile", metavar="FILE",
        help=f"Multi-node: {does} FILE is a DeepSpeed hostfile (`host slots=N` lines); its nodes are reached "
        "over ssh, with --python at the same path on every node. See docs/multinode.md.")]


InstallHostfileOption = _hostfile(
    "build once here, install the same wheel on every node (mlstack-ds at the same path too), all or nothing, "
    "then verify across the nodes.")
VerifyHostfileOption = _hostfile(
    "run the suite on the nodes through DeepSpeed's launcher (passwordless ssh and pdsh here; the launch "
    "files are copied to nodes that do not share this host's file system).")
BenchHostfileOption = _hostfile("run the stages on the nodes through DeepSpeed's launcher, as `verify "
                                "--hostfile` does.")
DoctorHostfileOption = _hostfile(
    "check every node (reachable, the --python interpreter, torch/DeepSpeed/ROCm versions, GPU targets, "
    "hostname and interfaces) and what differs between them, instead of this machine.")


def _slurm(does: str) -> Any:
    return Annotated[bool, typer.Option(
        "--slurm",
        help=f"Multi-node inside a Slurm allocation (`salloc`, an `sbatch` script): {does} The nodes and ranks "
        "come from the allocation (SLURM_JOB_NODELIST, --ntasks-per-node or --gpus-per-node, else the GPUs "
        "here, else 1 per node); no hostfile, ssh or pdsh. See docs/multinode.md.")]


VerifySlurmOption = _slurm("run the suite on every allocated node, one srun task per rank.")
InstallSlurmOption = _slurm(
    "build once here (a login node without GPUs builds for the nodes' targets), install the same wheel on every "
    "allocated node through srun (node-local environments each, a shared one once), all or nothing, then "
    "verify --slurm. The wheel cache (--cache-dir) must be on a file system every node sees.")
BenchSlurmOption = _slurm("run the stages on the allocated nodes, one srun task per rank; --nodes 1,2 "
                         "measures scaling across them.")
DoctorSlurmOption = _slurm(
    "check every allocated node at once (one srun task per node: the same facts and differences as "
    "--hostfile) and Slurm's own pitfalls (double GPU masking, one CPU per task, the rendezvous host and port).")


def _world_size(kind: type, metavar: str | None, what: str) -> Any:
    return Annotated[kind | None, typer.Option(
        "--world-size", metavar=metavar, help=f"Ranks to launch{what} (default: the GPU count; 2 on CPU).")]


WorldSizeOption = _world_size(int, None, "")  # verify: one number
WorldSizesOption = _world_size(str, "N[,N...]", " per run; several (1,2) measure scaling")  # bench: a list


def _nodes(kind: type, metavar: str | None, what: str) -> Any:
    return Annotated[kind, typer.Option("--nodes", metavar=metavar, help=f"Nodes{what}.")]


ConfigNodesOption = _nodes(int, None, "")  # config: how many nodes to plan for
BenchNodesOption = _nodes(
    str | None, "N[,N...]", " (with --slurm): run on the allocation's first N nodes, each count in turn (1,2: "
    "scaling efficiency across nodes); default every allocated node")  # bench: a list within the allocation


def _timeout(bounds: str) -> Any:
    return Annotated[float, typer.Option("--timeout", help=f"Seconds {bounds}; on expiry its processes are "
                                         "killed.")]


VerifyTimeoutOption = _timeout("a launch may go with no rank reporting (a hang; a slow machine keeps reporting), "
                               "and as many per check at most; over --hostfile, seconds for the whole run")
BenchTimeoutOption = _timeout("a stage may go with no rank reporting (a hang; a slow machine keeps reporting), "
                              "and three times that in all; where a node's files come back only at the end, "
                              "seconds per stage")


def _ds_config(use: str) -> Any:
    return Annotated[Path | None, typer.Option(
        "--config", "--ds-config", metavar="FILE",
        help=f"Your DeepSpeed config (read as DeepSpeed reads it, hjson included): {use} --ds-config is an "
        "alias.")]


VerifyConfigOption = _ds_config(
    "the `config` check trains the suite's model under it (stage, offload, precision, buckets as given) "
    "against the torch reference. DeepSpeed's parser judges it first; a rejected key is an error before "
    "anything is launched. Alone, runs only that check.")
BenchConfigOption = _ds_config(
    "the base of the ZeRO runs (buckets, offload, precision as given; the stage and micro-batch come from "
    "--stages and --micro-batch). Checked by DeepSpeed first.")
DoctorConfigOption = _ds_config("rates libaio by its NVMe offload.")

# --- the model's shape: `config` and `bench` -------------------------------------------------------------------

MicroBatchOption = Annotated[int, typer.Option(
    "--micro-batch", help="The micro-batch: sequences per rank (GPU) and step.")]


def _seq_len(kind: Any, default: str) -> Any:
    return Annotated[kind, typer.Option("--seq-len", help=f"Tokens per sequence{default}.")]


SeqLenOption = _seq_len(int, "")
BenchSeqLenOption = _seq_len(int | None, f" (default: {DEFAULT_SEQ_LEN['tiny']} for tiny, {GUIDE_SEQ_LEN} for the "
                             "others)")

# --- outputs and trees: `config`, `patches` ----------------------------------------------------------------------


def _out(metavar: str | None, what: str) -> Any:
    return Annotated[Path | None, typer.Option("--out", metavar=metavar, help=f"Where {what}.")]


ConfigOutOption = _out("FILE", "the config is written (default: stdout)")
DraftOutOption = _out(None, "the draft series goes (default ./deepspeed-VERSION.patches-draft of --to); must "
                      "not exist or be empty, and never a shipped series directory")


def _tree(kind: Any, which: str) -> Any:
    return Annotated[kind, typer.Option("--tree", help=f"The DeepSpeed tree: {which}.")]


TreeOption = _tree(Path | None, "the fetched release (default ./deepspeed-VERSION)")
AnyTreeOption = _tree(Path, "any, e.g. your own checkout")
NewTreeOption = _tree(Path | None, "the new release's (default: fetch the --to recipe's sdist, cached)")
SeriesOption = Annotated[Path | None, typer.Option("--series", help="This series file, not the recipe's.")]


def _to(kind: Any, metavar: str, what: str) -> Any:
    return Annotated[kind, typer.Option("--to", metavar=metavar, help=what)]


RefreshToOption = _to(str, "NAME|VERSION", "The new release's recipe.")  # patches refresh
PublishToOption = _to(Path, "DIR", "The index directory (made if absent): DIR/simple is the PEP 503 index to serve.")
BundleToOption = _to(Path, "DIR", "The bundle directory (made if absent; run again over it to complete it): "
                     "DIR/simple is a PEP 503 index, as `publish` writes, so publish can add wheels to it.")

# --- prebuilt wheels from a team's index: `install` and `doctor` (index/) ------------------------------------

INDEX_VARIABLE = "MLSTACK_DS_INDEX"
OfflineOption = Annotated[Path | None, typer.Option(
    "--offline", metavar="DIR", help="A bundle (`mlstack-ds bundle --to DIR`). install: DIR is checked to cover this "
    "install first (missing pieces are named, with the bundle command that adds them; exit 7), then a prebuilt "
    "DeepSpeed wheel of DIR that fits is installed (`bundle --prebuilt`), else DIR's sdist is built; pip gets "
    "--no-index and DIR only; with --hostfile/--slurm every node checks it before any installs "
    "(DIR on a shared file system). doctor: reports that check (per node with --hostfile/--slurm).")]
IndexOption = Annotated[str | None, typer.Option(
    "--index", metavar="URL|DIR", envvar=INDEX_VARIABLE, show_envvar=True,
    help="A package index of prebuilt DeepSpeed wheels (`mlstack-ds publish`): http(s)://.../simple or a "
    "directory. The wheel whose plan fits this machine's is installed instead of building one.")]

__all__ = [
    "DEFAULT_RECIPE", "DEFAULT_SOURCE", "INDEX_VARIABLE", "AnyTreeOption", "ArchOption", "BenchConfigOption",
    "BenchHostfileOption", "BenchSeqLenOption", "BenchTimeoutOption", "BundleToOption", "CacheDirOption",
    "ConfigOutOption", "DoctorConfigOption", "DoctorHostfileOption", "DraftOutOption", "DryRunOption",
    "GitCommitOption",
    "GitUrlOption", "IndexOption", "InstallHostfileOption", "JobsOption", "JsonOption", "MicroBatchOption",
    "NewTreeOption", "NoPatchesOption", "PublishToOption", "PythonOption", "RebuildOption", "RecipeOption",
    "RefreshToOption", "SeqLenOption", "SeriesOption", "Sha256Option", "SourceOption", "TreeOption",
    "VerifyConfigOption", "VerifyHostfileOption", "VerifyTimeoutOption", "WorldSizeOption", "WorldSizesOption",
]
