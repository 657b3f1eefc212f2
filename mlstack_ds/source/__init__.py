"""The fetch stage: upstream DeepSpeed at exactly the pinned release, from git, PyPI, a URL or a path.

Public interface (used by `install` later): `parse_source_spec`, `fetch_source`, `SourceSpec`,
`SourceTree`.
"""

from mlstack_ds.source.cache import default_cache_dir
from mlstack_ds.source.fetch import (
    SourceKind,
    SourceSpec,
    SourceTree,
    check_local_source,
    fetch_source,
    parse_source_spec,
)

__all__ = ["SourceKind", "SourceSpec", "SourceTree", "check_local_source", "default_cache_dir", "fetch_source",
           "parse_source_spec"]
