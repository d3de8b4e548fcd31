"""Sub-commands of the ``dynacoord`` CLI, one module per command group (see ``dynacoord.cli``)."""
