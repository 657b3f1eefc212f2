"""The plan stage: from detected facts, the recipe and the user's options to one `BuildPlan` (pure), its cache key,
the GPU targets, the ops to build and how many compiles run at once."""
