"""One curator's release steps: agree, reserve, prepare, upload, wait, serve keys (``runner``),
the agreement client, the PSI ring, server-side sampling and the link to the release server.
Imports the base modules, ``records/`` and ``cluster/``; never the CLI."""
