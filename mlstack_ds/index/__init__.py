"""A team's index of prebuilt DeepSpeed wheels: `publish` writes a PEP 503 "simple" index (each wheel beside
the plan it was built from), `install --index` picks the wheel whose plan matches this machine's and
installs it after checking it, with no compiler needed."""
