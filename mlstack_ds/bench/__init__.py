"""`mlstack-ds bench`: training throughput and memory per ZeRO stage, measured on this machine.

`spec` (what is run: model shape, stages, world sizes, steps), `run` (one launch per world size and
stage, through verify's launcher code, of the worker's `bench` entry in the target interpreter), `report`
(statistics, scaling, the guide's cells beside the measured ones), `guide` (the AMD guide's tables as data,
every cell as printed), `physics` and `peaks` (the ZeRO memory and FLOP formulas, AMD GPUs' peak rates with
sources), `verdicts` (a computed verdict on every guide cell), `reference` (when a run may stand beside the
guide), `reference_view` (`--reference`'s tables), `plot` (the optional PNG). Nothing here imports torch or DeepSpeed.
"""
