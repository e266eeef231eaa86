"""The pure core of secure-release: every step of the paper as a small, verified function.

Nothing in this package opens a socket, a file or a process, or imports grpc
(``tests/system/test_mech_imports.py``). Its only threads are the process-wide pool of
:func:`mechanism.primitives.stream.worker_pool`, for block-parallel numpy work. "DESIGN x.y" in
docstrings cites docs/design.md, section x, item y; "Sec.", "Theorem" and "Eq." cite Lin, Wang,
Rane 2013 (docs/references.md).

Rooms, from the floor up. A room imports the floor and the rooms its line names, never one above
it (``tests/unit/test_layers.py`` checks every import against this table):

=============  ==========================================================  ==============================
room           holds                                                       may import
=============  ==========================================================  ==============================
(the floor)    ``errors`` (named errors), ``schema`` (attributes, joint    the floor
               codes, DESIGN 3), ``cells`` (the one cell rule),
               ``printing`` (results laid out as tables, no I/O)
primitives/    keys, ChaCha20 keystreams, pads (DESIGN 3.3), packing,      the floor
               the shared m-tuple (DESIGN 3.2), gamma-diagonal PRAM (3.4)
alignment/     keyed id tags (``keyed_hash``, DESIGN 3.1), sharding, the   primitives
               N-party ECDH PSI (``psi``), its group and its proofs
privacy/       epsilon, gamma, m*, exact MSE (``accounting``: Thm 3.2,     primitives
               Eq. 2, Cor. 3.6, Thm 3.4), the plan, the guarantee, the
               ledger
estimation/    A^-1, the simplex projection, MLE (``estimators``),         primitives, privacy
               unified intervals, marginals, the report, references,
               multiple imputation (``imputation``, its sweeps
               ``loglinear_draws``, its diagnostics ``mixing``; DESIGN 13)
analysis/      tests of independence (``association``), effect sizes,      primitives, privacy,
               models (``regression``), power, sub-tables, suggestions,    estimation
               Rubin's rules (``pooling``)
protocol/      the agreed ``spec``, the whole protocol in memory           primitives, alignment,
               (``in_memory``), every architecture of Sec. V-B             privacy, estimation
               (``architectures``, ``index_sharing``, ``server_sampling``)
simulation/    the count-level Monte Carlo of Sec. IV (``monte_carlo``)    primitives, privacy,
               and its synthetic data sets                                 estimation
=============  ==========================================================  ==============================
"""
