"""The paper's Section IV, reproduced (``secure-release reproduce``).

- :mod:`.sweeps`: the simulations behind Figures 5-9 and the exact coverage table, and their CSVs;
- :mod:`.findings`: the "where we differ from the paper" findings, one function per finding;
- :mod:`.report`: docs/reproduction.md's text, computed from the CSVs alone.

The figures themselves are drawn by :mod:`secure_release.plotting`.
"""
