"""The install stage: the pipeline (detect -> plan -> build -> install -> verify), installing a wheel with torch
held, rollback and uninstall, and the same wheel on every node of a hostfile or a Slurm allocation."""
