"""The build stage: fetch and patch the pinned source into a staging tree, build its wheel into the cache."""
