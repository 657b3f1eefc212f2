"""System facts are read from a fake root (dev/, proc/, sys/, usr/include) and from a fake
DeepSpeed install; the target-interpreter probe runs the real interpreter."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from support.doctor_inputs import make_env
from support.target_env import bare_venv

from mlstack_ds.detect.model import DeepSpeedInfo, PythonInfo
from mlstack_ds.detect.target_probe import TargetFacts, probe_target
from mlstack_ds.detect.toolchain import probe_toolchain
from mlstack_ds.doctor.facts import collect_facts, kfd_native_archs, parse_gfx_target_version
from mlstack_ds.installed.build_record import parse_git_version_info
from mlstack_ds.installed.journal import Journal, begin_change

# In the format DeepSpeed 0.19.5's setup.py writes it (setup.py, "git_version_info_installed.py").
GIT_VERSION_INFO = (
    "version='0.19.5 '\n"
    "git_hash='unknown'\n"
    "git_branch='unknown'\n"
    "installed_ops={'deepspeed_not_implemented': False, 'async_io': False, 'cpu_adam': True, "
    "'fused_adam': False}\n"
    "accelerator_name='cuda'\n"
    "torch_info={'version': '2.5', 'bf16_support': False, 'cuda_version': '0.0', 'nccl_version': '2.20', "
    "'hip_version': '6.2'}\n"
)


NO_ANSWER = TargetFacts(PythonInfo("python", "unknown"))


def write(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def fake_root(tmp_path: Path, kfd: bool = True) -> Path:
    root = tmp_path / "root"
    (root / "dev" / "shm").mkdir(parents=True)
    if kfd:
        write(root / "dev" / "kfd")
    write(root / "proc" / "cmdline", "BOOT_IMAGE=/vmlinuz ro quiet iommu=pt\n")
    write(root / "sys" / "class" / "iommu" / "ivhd0" / "name", "ivhd0")
    nodes = root / "sys" / "class" / "kfd" / "kfd" / "topology" / "nodes"
    write(nodes / "0" / "properties", "cpu_cores_count 16\nsimd_count 0\ngfx_target_version 0\n")
    write(nodes / "1" / "properties", "simd_count 208\ngfx_target_version 90010\nvendor_id 4098\n")
    write(nodes / "2" / "properties", "simd_count 96\ngfx_target_version 110000\n")
    return root


def this_python_env(deepspeed: DeepSpeedInfo | None = None):
    env = make_env(deepspeed=deepspeed)
    return type(env)(**{**env.__dict__, "python": PythonInfo(sys.executable, "3")})


def test_facts_from_a_fake_root(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    write(root / "usr" / "include" / "libaio.h")
    facts = collect_facts(this_python_env(), environ={"PATH": os.environ["PATH"]}, root=root)
    assert facts.kfd_exists and facts.kfd_accessible
    assert facts.kernel_cmdline is not None and "iommu=pt" in facts.kernel_cmdline
    assert facts.iommu_enabled is True
    assert facts.kfd_native_archs == ("gfx90a", "gfx1100")
    assert facts.libaio_headers
    statvfs = os.statvfs(root / "dev" / "shm")
    assert facts.shm_bytes == statvfs.f_frsize * statvfs.f_blocks
    # the target interpreter (this one) answered the probe
    assert facts.target_prefix == sys.prefix
    assert facts.receipt_path == str(Path(sys.prefix) / "share" / "mlstack-ds" / "receipt.json")
    assert not facts.receipt_exists
    assert facts.warnings == ()


def test_an_empty_root_is_all_unknowns_not_errors(tmp_path: Path) -> None:
    root = tmp_path / "empty"
    root.mkdir()
    facts = collect_facts(this_python_env(), environ={"PATH": ""}, root=root)
    assert not facts.kfd_exists and not facts.kfd_accessible
    assert facts.shm_bytes is None and facts.kernel_cmdline is None and facts.iommu_enabled is None
    assert facts.kfd_native_archs == () and not facts.libaio_headers
    assert facts.cxx_compiler is None and facts.tools["ninja"] is None and facts.tools["hipcc"] is None
    assert facts.tools["numactl"] is None
    assert facts.shm_segments is not None and facts.shm_segments.segments == ()


def test_tools_are_found_on_path_and_hipcc_under_rocm_path(tmp_path: Path) -> None:
    bin_dir, rocm = tmp_path / "bin", tmp_path / "rocm"
    for exe in (bin_dir / "g++", bin_dir / "ninja", bin_dir / "numactl", rocm / "bin" / "hipcc"):
        write(exe, "#!/bin/sh\n").chmod(0o755)
    write(rocm / ".info" / "version", "6.2.4-120\n")
    environ = {"PATH": str(bin_dir), "ROCM_PATH": str(rocm)}
    facts = collect_facts(this_python_env(), environ=environ, root=fake_root(tmp_path))
    assert facts.cxx_compiler == str(bin_dir / "g++")
    assert facts.tools["hipcc"] == str(rocm / "bin" / "hipcc")
    assert facts.tools["numactl"] == str(bin_dir / "numactl")
    assert facts.rocm_home == str(rocm)
    assert facts.rocm_info_version_file


def test_deepspeed_shm_segments_are_read_from_the_roots_dev_shm(tmp_path: Path) -> None:
    """The segments below `root`; its `proc` has no processes, so nothing there can be using them."""
    root = fake_root(tmp_path)
    segment = write(root / "dev" / "shm" / "deepspeed_allreduce_buffer_0_127.0.0.1_29500_0", "x" * 100)
    write(root / "dev" / "shm" / "sem.other", "x")
    facts = collect_facts(this_python_env(), environ={"PATH": ""}, root=root)
    assert facts.shm_segments is not None
    assert [(s.path, s.size) for s in facts.shm_segments.leaked] == [(str(segment), 100)]


def test_libaio_headers_found_through_cpath(tmp_path: Path) -> None:
    include = tmp_path / "aio" / "include"
    write(include / "libaio.h")
    environ = {"PATH": "", "CPATH": str(include)}
    facts = collect_facts(this_python_env(), environ=environ, root=fake_root(tmp_path))
    assert facts.libaio_headers


def test_deepspeed_build_record_and_receipt(tmp_path: Path) -> None:
    """A real (pip-less) venv as the target: its prefix holds the receipt, its site-packages DeepSpeed."""
    venv = bare_venv(tmp_path / "venv")
    site = tmp_path / "site-packages"
    write(site / "deepspeed" / "git_version_info_installed.py", GIT_VERSION_INFO)
    write(venv / "share" / "mlstack-ds" / "receipt.json", "{}")
    env = make_env(deepspeed=DeepSpeedInfo("0.19.5", str(site)))
    env = type(env)(**{**env.__dict__, "python": PythonInfo(str(venv / "bin" / "python"), "3")})
    facts = collect_facts(env, environ={"PATH": ""}, root=fake_root(tmp_path))
    assert facts.target_prefix == str(venv)
    assert facts.receipt_exists
    (damage,) = facts.install_damage  # "{}" is no receipt: the doctor says so (MLS-DS-006), never raises
    assert damage.startswith(f"receipt {venv}/share/mlstack-ds/receipt.json is unusable: it is not a receipt "
                             "this mlstack-ds can read: the receipt lacks accelerator")
    build = facts.ds_build
    assert build is not None
    assert build.version == "0.19.5"
    assert build.prebuilt_ops == ["cpu_adam"]
    assert (build.torch_version, build.hip_version, build.accelerator) == ("2.5", "6.2", "cuda")


def test_an_interrupted_change_is_the_damage_doctor_reports(tmp_path: Path) -> None:
    """A change journal left by a killed install (installed/journal.py): doctor names it, as `status` does,
    whatever the half-swapped files look like (MLS-DS-006, fix: install repairs it)."""
    venv = bare_venv(tmp_path / "venv")
    site = tmp_path / "site-packages"
    write(site / "deepspeed" / "git_version_info_installed.py", GIT_VERSION_INFO)
    python = str(venv / "bin" / "python")
    begin_change(venv, [str(site)], Journal(action="install", pid=12345, started_at="2026-11-26T10:00:00Z",
                                            from_version="0.19.5", to_version="0.19.8", python=python))
    env = make_env(deepspeed=DeepSpeedInfo("0.19.5", str(site)))
    env = type(env)(**{**env.__dict__, "python": PythonInfo(python, "3")})
    facts = collect_facts(env, environ={"PATH": ""}, root=fake_root(tmp_path))
    (damage,) = facts.install_damage
    assert damage == ("`mlstack-ds install` (pid 12345, started 2026-11-26T10:00:00Z: DeepSpeed 0.19.5 -> 0.19.8) was "
                      "interrupted before it finished: DeepSpeed may be half-installed and `import deepspeed` is "
                      f"refused until `mlstack-ds install --python {python}` repairs it")


def test_missing_build_record_is_a_warning(tmp_path: Path) -> None:
    env = this_python_env(DeepSpeedInfo("0.19.5", str(tmp_path / "nowhere")))
    facts = collect_facts(env, environ={"PATH": ""}, root=fake_root(tmp_path))
    assert facts.ds_build is None
    assert any("git_version_info_installed.py not found" in w for w in facts.warnings)


def test_git_version_info_is_read_without_executing_it() -> None:
    values = parse_git_version_info("import os\nos.system('false')\nversion='1.0'\nx = os.getcwd()\n")
    assert values == {"version": "1.0"}
    assert parse_git_version_info("this is not python(") == {}


def test_gfx_target_version_decoding() -> None:
    assert parse_gfx_target_version("gfx_target_version 90010\n") == "gfx90a"
    assert parse_gfx_target_version("gfx_target_version 100300\n") == "gfx1030"
    assert parse_gfx_target_version("gfx_target_version 120001\n") == "gfx1201"
    assert parse_gfx_target_version("gfx_target_version 0\n") is None
    assert parse_gfx_target_version("junk") is None
    assert kfd_native_archs(Path("/nonexistent")) == ()


def test_a_broken_target_interpreter_becomes_a_warning(tmp_path: Path) -> None:
    script = "#!/bin/sh\necho 'Fatal Python error: init_fs_encoding' >&2\nexit 1\n"
    broken = write(tmp_path / "python", script)
    broken.chmod(0o755)
    target = probe_target(broken, {"PATH": ""}, torch=False)
    assert (target.python.include_dir, target.python.prefix, target.nvidia_packages) == (None, None, ())
    assert not target.answered
    assert "exited with 1" in target.warnings[0]
    assert "init_fs_encoding" in target.warnings[0]


def test_install_and_doctor_agree_on_the_compiler_and_libaio(tmp_path: Path) -> None:
    """One facts layer (toolchain.py): $CXX (also clang++), and libaio.h through C_INCLUDE_PATH, count
    for both the plan and doctor; an unresolvable $CXX fails both."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    clang = bin_dir / "clang++"
    clang.write_text("#!/bin/sh\n")
    clang.chmod(0o755)
    include = tmp_path / "include"
    include.mkdir()
    (include / "libaio.h").write_text("")
    environ = {"PATH": str(bin_dir), "CXX": "clang++", "C_INCLUDE_PATH": str(include)}
    toolchain = probe_toolchain(environ, None)
    facts = collect_facts(make_env(), environ=environ, root=tmp_path, target=NO_ANSWER)
    assert toolchain.cxx == facts.cxx_compiler == str(clang)
    assert toolchain.libaio_headers and facts.libaio_headers
    missing = {"PATH": str(bin_dir), "CXX": "g++-99"}
    assert probe_toolchain(missing, None).cxx is None
    assert collect_facts(make_env(), environ=missing, root=tmp_path,
                         target=NO_ANSWER).cxx_compiler is None
