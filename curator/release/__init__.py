"""One curator's release, a module a step: open (``opening``), align (``aligning``), agree
(``agreeing``, on ``budget``), prepare (``preparing``), upload (``upload``), seal (``sealing``),
serve keys (``serving``), run in order by ``runner``; the refusal and abort paths (``failing``),
the agreement client, the PSI ring and server-side sampling (``stored``).
Imports the base modules, ``records/`` and ``cluster/``; never the CLI."""
