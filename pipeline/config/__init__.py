"""Settings, declared once: the ``batchlu.*`` keys with their shipped defaults (``batchlu.yaml``),
their parsers and choices, and the one frozen ``Options`` object built from them that travels from
the command line to the tasks."""
