"""Air-gapped installs: `bundle --to DIR` gathers everything an offline node needs into one directory (a PEP 503
index, the pinned sdist, the patch series, a manifest), and `install --offline DIR` checks that DIR covers the
plan before it installs from nothing else.
"""
