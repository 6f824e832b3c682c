"""``python -m tessera``: the ``tessera`` command."""

from tessera.cli import main

if __name__ == "__main__":  # pragma: no cover
    main(prog_name="tessera")
