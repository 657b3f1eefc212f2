"""`python -m mlstack_ds` runs the same CLI as the `mlstack-ds` console script."""

from mlstack_ds.cli.app import main

if __name__ == "__main__":
    main()
