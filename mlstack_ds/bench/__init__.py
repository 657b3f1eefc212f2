"""`mlstack-ds bench`: training throughput and memory per ZeRO stage, measured on this machine.

`spec` (what is run: model shape, stages, world sizes, steps), `run` (one launch per world size and
stage, through verify's launcher code, of the worker's `bench` entry in the target interpreter), `report`
(statistics, scaling, the comparison with the stored reference), `reference` (the AMD guide's numbers
as data with their source), `plot` (the optional PNG). Nothing here imports torch or DeepSpeed.
"""
