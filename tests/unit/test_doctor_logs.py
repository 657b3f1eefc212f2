"""Log rules: the quoted real error texts (tests/fixtures/doctor-logs) and real ds_report captures
are recognised; clean or unrelated logs are not."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from mlstack_ds.doctor.logs import MAX_LINE_CHARS, literal_prefix, match_log, match_log_stream
from mlstack_ds.doctor.rules import RULES, rule_by_id

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
LOGS = FIXTURES / "doctor-logs"
REAL = FIXTURES / "real"
LUMI_DS_REPORT = REAL / "ds_report_rocm-6.0_torch-2.3.1_ds-0.14.0_lumi-container.txt"
CUDA_DS_REPORT = REAL / "ds_report_cuda-12.8_torch-2.7.0_ds-0.17.2_cotainr-container.txt"

# log file -> the rule that must recognise it
LOG_CASES: dict[str, str] = {
    "mask-64bit_ds-7565.txt": "MLS-LOG-001",
    "cuda-runtime-api_ds-3304.txt": "MLS-LOG-002",
    "oneapi-ccl_rocm-sdk-builder-8.txt": "MLS-LOG-003",
    "hipify-kwarg_ds-1816.txt": "MLS-LOG-005",
    "cublas-gemmalgo_ds-6795.txt": "MLS-LOG-006",
    "cuda-home_ds-3091.txt": "MLS-LOG-007",
    "thread-block-tile-64_ds-4552.txt": "MLS-DS-005",
    "hip-version-mismatch_builder-py.txt": "MLS-DS-002",
    "pytorch-version-mismatch_deepspeed-windows-4.txt": "MLS-DS-002",
    "could-not-detect-rocm_ds-3715.txt": "MLS-ROCM-003",
    "version-dev-missing_ds-2080.txt": "MLS-ROCM-003",
    "no-binary-for-gpu_rocm-2061.txt": "MLS-ARCH-001",
    "invalid-device-function_rocm-3207.txt": "MLS-ARCH-001",
    "tensile-library_pytorch-96964.txt": "MLS-ARCH-001",
    "rccl-iommu_vllm-390.txt": "MLS-NET-001",
    "shm-too-small_env-report.txt": "MLS-SYS-001",
    "bus-error-shm_pipedream-28.txt": "MLS-SYS-001",
    "error-building-extension_ds-3094.txt": "MLS-LOG-008",
    "stale-so-undefined-symbol_ds-3410.txt": "MLS-LOG-009",
    "nccl-unhandled-system-error_transformers-11658.txt": "MLS-NET-002",
    "waited-on-lock_torch-file-baton.txt": "MLS-BUILD-006",
    "dskernels-ds-build-ops_patches-0016.txt": "MLS-ENV-006",
    "ds-accelerator-rejected_real-accelerator-py.txt": "MLS-ENV-005",
    "numactl-missing_captured-bind-cores-to-rank.txt": "MLS-SYS-004",
    "mpi4py-no-launcher_captured-python-script.txt": "MLS-DS-007",
    "mpi4py-deepspeed-launcher-slurm_captured-salloc.txt": "MLS-DS-007",
    "launcher-slurm-not-installed_captured-no-sinfo.txt": "MLS-SLURM-005",
    "eaddrinuse_captured-torchrun-master-port-29500.txt": "MLS-NET-003",
    "eaddrinuse_captured-deepspeed-launcher-default-port.txt": "MLS-NET-003",
    "terminate-without-active-exception_clients-on-cpu.txt": "MLS-LOG-010",
    "aio-undefined-io_submit_captured-nvme-offload-prebuilt-without-libaio.txt": "MLS-LOG-011",
    "gloo-loopback-fallback_captured-two-hosts-hostname-unresolved.txt": "MLS-NET-004",
    "gloo-loopback-127.0.1.1_captured-two-hosts-etc-hosts-line.txt": "MLS-NET-004",
    "cannot-find-lamdhip64_aiter-3264.txt": "MLS-LOG-012",
    "hipblas-header-missing_pytorch-196503.txt": "MLS-LOG-013",
    "warmup-num-steps-zero_captured-warmuplr-config.txt": "MLS-DS-101",
}
# Whole logs captured on this machine (SOURCES.md): the first line the rule must quote, when not line 1.
FIRST_MATCH: dict[str, int] = {
    "numactl-missing_captured-bind-cores-to-rank.txt": 8,
    "mpi4py-no-launcher_captured-python-script.txt": 8,
    "mpi4py-deepspeed-launcher-slurm_captured-salloc.txt": 9,
    "launcher-slurm-not-installed_captured-no-sinfo.txt": 8,
    "eaddrinuse_captured-torchrun-master-port-29500.txt": 45,
    "eaddrinuse_captured-deepspeed-launcher-default-port.txt": 37,
    "aio-undefined-io_submit_captured-nvme-offload-prebuilt-without-libaio.txt": 51,
    "gloo-loopback-fallback_captured-two-hosts-hostname-unresolved.txt": 2,
    "gloo-loopback-127.0.1.1_captured-two-hosts-etc-hosts-line.txt": 20,
    "warmup-num-steps-zero_captured-warmuplr-config.txt": 19,
}
# Rules whose texts come from the real ds_report capture rather than from a quote file.
FROM_DS_REPORT = {"MLS-BUILD-005", "MLS-LOG-004", "MLS-DS-001"}
# ds_report's ninja line: the real captures say [OKAY]; [FAIL] is the same line with env_report's FAIL.
FROM_NINJA_LINE = {"MLS-BUILD-002"}


def ids(text: str) -> set[str]:
    return {f.rule_id for f in match_log(text, RULES)}


def test_every_log_rule_is_exercised_by_a_real_text() -> None:
    with_patterns = {rule.id for rule in RULES if rule.log_patterns}
    assert set(LOG_CASES.values()) | FROM_DS_REPORT | FROM_NINJA_LINE == with_patterns


def test_every_quote_file_is_used_and_sourced() -> None:
    files = {p.name for p in LOGS.glob("*.txt")}
    assert files == set(LOG_CASES)
    sources = (LOGS / "SOURCES.md").read_text()
    assert all(f"`{name}`" in sources for name in files)


@pytest.mark.parametrize("name", sorted(LOG_CASES))
def test_quoted_error_is_recognised(name: str) -> None:
    text = (LOGS / name).read_text()
    found = {f.rule_id: f for f in match_log(text, RULES)}
    rule_id = LOG_CASES[name]
    assert rule_id in found
    assert found[rule_id].origin == "log"
    assert found[rule_id].evidence.startswith(f"log line {FIRST_MATCH.get(name, 1)}: ")


@pytest.mark.parametrize("name", sorted(LOG_CASES))
def test_each_quote_matches_only_its_own_rule(name: str) -> None:
    assert ids((LOGS / name).read_text()) == {LOG_CASES[name]}


def test_lumi_rocm_ds_report() -> None:
    """The real ROCm ds_report: libaio missing, sparse_attn incompatible (info), no prebuilt ops."""
    findings = {f.rule_id: f for f in match_log(LUMI_DS_REPORT.read_text(), RULES)}
    assert set(findings) == FROM_DS_REPORT
    assert findings["MLS-LOG-004"].severity == "info"
    assert findings["MLS-BUILD-005"].severity == "info"
    expected = "log line 47: deepspeed wheel compiled w. ...... torch 0.0, hip 0.0"
    assert findings["MLS-DS-001"].evidence == expected


def test_cuda_ds_report_has_no_rocm_findings() -> None:
    """The CUDA capture shares the libaio warning but was built with torch 2.7 and has no ROCm lines."""
    assert ids(CUDA_DS_REPORT.read_text()) == {"MLS-BUILD-005"}


def test_ds_report_with_prebuilt_ops_is_not_flagged() -> None:
    text = (REAL / "ds_report-envinfo_rocm-5.1_after-pr-1906.txt").read_text()
    assert "compiled w. ...... torch 1.10, hip 5.1" in text
    assert ids(text) == set()


def test_repeated_lines_are_counted_and_colour_codes_stripped() -> None:
    line = "\x1b[93m [WARNING] \x1b[0m sparse_attn is not compatible with ROCM"
    [finding] = match_log(f"{line}\nother\n{line}\n", RULES)
    assert finding.evidence == ("log line 1: [WARNING]  sparse_attn is not compatible with ROCM "
                                "(and 1 more line(s): 3)")


def test_only_the_first_few_matching_lines_are_kept() -> None:
    line = "fatal error: oneapi/ccl.hpp: No such file or directory"
    [finding] = match_log("\n".join([line, "other"] * 1000), RULES)
    assert finding.evidence == f"log line 1: {line} (and 999 more line(s): 3, 5, 7, …)"


def test_a_clean_build_log_has_no_findings() -> None:
    text = "Successfully built deepspeed\nInstalling collected packages: deepspeed\nSuccessfully installed\n"
    assert match_log(text, RULES) == []


def stream_ids(data: bytes, block_bytes: int) -> dict[str, str]:
    return {f.rule_id: f.evidence for f in match_log_stream(io.BytesIO(data), RULES, block_bytes=block_bytes)}


@pytest.mark.parametrize("block_bytes", [1, 7, 64, 1 << 20])
def test_streaming_equals_whole_text_at_any_block_size(block_bytes: int) -> None:
    """Block boundaries fall inside lines, inside colour codes and inside UTF-8 sequences."""
    text = LUMI_DS_REPORT.read_text() + "ünïcødé line\n" + (LOGS / "mask-64bit_ds-7565.txt").read_text()
    whole = {f.rule_id: f.evidence for f in match_log(text, RULES)}
    assert stream_ids(text.encode(), block_bytes) == whole
    assert set(whole) == FROM_DS_REPORT | {"MLS-LOG-001"}


def test_binary_log_does_not_crash_and_still_matches() -> None:
    data = bytes(range(256)) * 50 + b"\xff\xfe The mask must be a 64-bit integer \x80\n" + b"\x00" * 100
    found = stream_ids(data, 1000)
    assert set(found) == {"MLS-LOG-001"}
    assert found["MLS-LOG-001"].startswith("log line ")


def test_one_huge_line_is_matched_in_bounded_pieces() -> None:
    """A log with no newline at all (a progress bar, a binary dump) larger than MAX_LINE_CHARS."""
    filler = b"x" * (MAX_LINE_CHARS + 10)
    data = filler + b" The mask must be a 64-bit integer " + filler + b" The mask must be a 64-bit integer"
    found = stream_ids(data, 1 << 16)
    assert found["MLS-LOG-001"].startswith("log line 1: xxx")
    assert "more line" not in found["MLS-LOG-001"]  # one line, matched in several pieces, counts once


def test_line_numbers_survive_many_blocks() -> None:
    data = b"noise\n" * 100_000 + b"fatal error: oneapi/ccl.hpp: No such file or directory\n" + b"noise\n" * 10
    assert stream_ids(data, 4096)["MLS-LOG-003"].startswith("log line 100001: fatal error: oneapi/ccl.hpp")


def test_ds_report_ninja_fail_line_is_recognised() -> None:
    """The real capture's line 10 is `ninja .................. [OKAY]`; DeepSpeed's env_report prints
    `print('ninja', '.' * 18, FAIL)` with FAIL = red `[FAIL]` when ninja is missing: same line, other word."""
    okay = LUMI_DS_REPORT.read_text().splitlines()[9]
    assert okay == "ninja .................. [OKAY]"
    failed = okay.replace("[OKAY]", "\x1b[91m[FAIL]\x1b[0m")
    report = LUMI_DS_REPORT.read_text().replace(okay, failed)
    found = {f.rule_id: f for f in match_log(report, RULES)}
    assert found["MLS-BUILD-002"].evidence == "log line 10: ninja .................. [FAIL]"
    assert found["MLS-BUILD-002"].severity == "warning"
    assert "MLS-BUILD-002" not in ids(LUMI_DS_REPORT.read_text())  # the real [OKAY] line


def test_undefined_symbol_outside_deepspeed_is_not_a_stale_op() -> None:
    """ROCm/TheRock#3466: torch's own library with a missing symbol is a broken torch, not a stale op."""
    line = ("ImportError: /usr/local/lib64/python3.13/site-packages/torch/lib/libtorch_hip.so: undefined symbol: "
            "_ZNK2at10TensorBase14const_data_ptrIN3c104HalfELi0EEEPKT_v")
    assert "MLS-LOG-009" not in ids(line)


def test_every_log_pattern_starts_with_a_literal() -> None:
    """Each pattern scans whole 1 MiB blocks from its literal prefix (str.find); without one it falls
    back to the regex engine's scan, several times slower on a big log."""
    for rule in RULES:
        for pattern in rule.log_patterns:
            assert len(literal_prefix(pattern)) >= 4, f"{rule.id}: {pattern.pattern}"


@pytest.mark.parametrize(
    ("pattern", "prefix"),
    [
        (r"cuda_runtime_api\.h'?:? (file not found|No such file)", "cuda_runtime_api.h"),
        (r"ninja \.+ \[FAIL\]", "ninja "),
        (r"hipify\(\) got an", "hipify() got an"),
        (r"Bus error\b", "Bus error"),
        (r"(HIP|CUDA) version", ""),
        (r"\bword", ""),
        (r"abc*", "ab"),
    ],
)
def test_literal_prefix(pattern: str, prefix: str) -> None:
    assert literal_prefix(re.compile(pattern)) == prefix
    assert literal_prefix(re.compile(pattern, re.IGNORECASE)) == ""


@pytest.mark.parametrize(
    ("line", "port"),
    [
        ((LOGS / "eaddrinuse_captured-deepspeed-launcher-default-port.txt").read_text().splitlines()[36], "29500"),
        # older torch (showlab/Tune-A-Video#90)
        ("RuntimeError: The server socket has failed to listen on any local network address. The server socket "
         "has failed to bind to [::]:29500 (errno: 98 - Address already in use).", "29500"),
        ("[W socket.cpp:426] [c10d] The server socket has failed to bind to 0.0.0.0:25641 (errno: 98 - Address "
         "already in use).", "25641"),  # hunto/DIST_KD#10, a torchrun given --master_port=25641
    ],
)
def test_port_in_use_names_the_port_in_its_fix(line: str, port: str) -> None:
    [finding] = match_log(line, RULES)
    assert finding.rule_id == "MLS-NET-003"
    assert finding.fix[0].startswith(f"ss -ltnp 'sport = :{port}'   # which process listens on port {port}")
    assert "<port>" in rule_by_id("MLS-NET-003").fix[0]  # the page's generic fix


def test_numactl_log_quotes_both_lines() -> None:
    [finding] = match_log((LOGS / "numactl-missing_captured-bind-cores-to-rank.txt").read_text(), RULES)
    assert finding.evidence == "log line 8: please install the numactl package with apt (and 1 more line(s): 21)"
    assert finding.severity == "error"


def test_abort_at_exit_explanation_is_one_amendable_constant() -> None:
    from mlstack_ds.doctor.rules import launch_rules

    rule = rule_by_id("MLS-LOG-010")
    assert rule.symptom is launch_rules.ABORT_AT_EXIT_EXPLANATION
    assert rule.fix is launch_rules.ABORT_AT_EXIT_FIX
    assert "torch.distributed.destroy_process_group()" in rule.fix[0]


def test_clangs_form_of_the_missing_hipblas_header_is_recognised() -> None:
    """hipcc (clang) words the same failure `'<header>' file not found`."""
    line = "fatal error: 'hipblas/hipblas.h' file not found"
    assert ids(line) == {"MLS-LOG-013"}


def test_other_missing_libraries_are_not_the_wheels_link_failure() -> None:
    assert "MLS-LOG-012" not in ids("/usr/bin/ld: cannot find -lrocm_smi64: No such file or directory")
