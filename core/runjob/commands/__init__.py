"""The ``runjob`` command line: thin wrappers, one module a command or a pair of close ones."""
