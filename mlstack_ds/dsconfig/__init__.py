"""DeepSpeed configs, read and judged as DeepSpeed does (hjson in the target, its own parser and estimators):
the one home doctor, verify, bench and config share."""
