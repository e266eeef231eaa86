"""Tests of independence, effects, models, power, sub-tables. Imports: floor, primitives, privacy, estimation."""
