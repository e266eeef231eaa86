"""The spec, the protocol in memory, each architecture. Imports: floor, primitives, alignment, privacy, estimation."""
