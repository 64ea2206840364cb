"""``python -m expertcache``: the same command line as the ``expertcache`` script."""

from expertcache.cli import main

if __name__ == "__main__":  # pragma: no cover
    main()
