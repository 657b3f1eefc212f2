"""`mlstack-ds config`: a DeepSpeed config chosen for one model on given GPUs, every choice with its reason.

`model` (what is trained), `hardware` (what it runs on), `target` (DeepSpeed's own estimators and
config parser, asked in the target interpreter), `rules` (the pure choices), `hf` (Hugging Face's
"auto" values). Nothing here imports torch or DeepSpeed.
"""
