"""The curator's own cluster (``--engine dask``): the engine, its forkserver, the shard stages
that run on the workers, the leader's matching and the sharded release. Imports the curator's
base modules and ``records/``, never ``release/``."""
