"""Aligning records: keyed id tags, sharding, the ECDH PSI and its proofs. Imports: floor, primitives."""
