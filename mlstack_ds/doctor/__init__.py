"""`mlstack-ds doctor`: the known ways DeepSpeed breaks on ROCm, as rules that turn the machine's
state (and optionally a log) into findings with the exact fix."""

from mlstack_ds.doctor.engine import Diagnosis, diagnose, run_rules
from mlstack_ds.doctor.model import DoctorInput, Finding, Rule

__all__ = ["Diagnosis", "DoctorInput", "Finding", "Rule", "diagnose", "run_rules"]
