"""``python -m sidecar`` is the same as the ``sidecar`` command."""

from sidecar.cli import main

if __name__ == "__main__":
    main()
