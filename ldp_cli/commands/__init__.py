"""Sub-commands of the ``ldp`` command line, one module each with ``register(subparsers)``."""
