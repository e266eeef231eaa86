"""The pure core of secure-release: every step of the paper as a small, verified function.

Nothing in this package opens a socket, a file or a process, or imports grpc
(``tests/system/test_mech_imports.py``; the import layers: ``tests/unit/test_layers.py``). Its
only threads are the process-wide pool of :func:`mechanism.stream.worker_pool`, for
block-parallel numpy work. "DESIGN x.y" in docstrings cites docs/design.md, section x, item y;
"Sec.", "Theorem" and "Eq." cite Lin, Wang, Rane 2013 (docs/references.md). Modules, in the
order of a release:

- :mod:`mechanism.errors`          named errors, each saying what was wrong and what is allowed
- :mod:`mechanism.keys`            seeds and keys that never print their bytes; labelled HKDF
- :mod:`mechanism.stream`          ChaCha20 keystreams, exact uniform integers, the worker pool
- :mod:`mechanism.schema`          attributes, mixed-radix alphabets, joint codes (DESIGN 3)
- :mod:`mechanism.spec`            ReleaseSpec (what the parties agree on), name grammars, validators
- :mod:`mechanism.plan`            the public parameters of one release and the plan printed for it
- :mod:`mechanism.accounting`      epsilon, gamma, m*, bounds, exact MSE (Thm 3.2, Eq. 2, Cor. 3.6, Thm 3.4)
- :mod:`mechanism.guarantee`       the privacy guarantee of one release in standard form
- :mod:`mechanism.ledger`          a curator's ledger: sequential composition, budget, sample-reuse refusal
- :mod:`mechanism.alignment`       keyed id tags (AES-256-CMAC, column-wise) and the canonical order (DESIGN 3.1)
- :mod:`mechanism.psi`             private alignment: the N-party ECDH private set intersection
- :mod:`mechanism.sampling`        the shared ordered m-tuple of positions (DESIGN 3.2)
- :mod:`mechanism.index_sharing`   the ordered m-tuple drawn by the leader, packed in m ceil(log2 n) bits
- :mod:`mechanism.pads`            one-time and ChaCha20 pads, additive encryption over Z_k (DESIGN 3.3)
- :mod:`mechanism.packing`         the packed wire form of symbol columns (1, 2 or 4 bytes a symbol)
- :mod:`mechanism.pram`            gamma-diagonal PRAM on joint rows (DESIGN 3.4)
- :mod:`mechanism.estimators`      A^-1, standard errors, intervals, simplex projection, MLE (DESIGN 3.5-3.6)
- :mod:`mechanism.unified`         unified (Feldman-Cousins) cell intervals: never empty, holding the estimate
- :mod:`mechanism.marginals`       marginals and conditional tables of an estimate, with standard errors
- :mod:`mechanism.report`          ReleaseReport, the researcher's typed result
- :mod:`mechanism.subtables`       a release's observed counts summed onto named attributes (DESIGN 11)
- :mod:`mechanism.association`     calibrated tests of (conditional) independence on perturbed counts (DESIGN 11)
- :mod:`mechanism.effects`         effect sizes of an association with intervals that cover (DESIGN 11)
- :mod:`mechanism.regression`      logistic and multinomial models fitted on the perturbed likelihood (DESIGN 11)
- :mod:`mechanism.power`           the power of a test planned from public inputs, before the budget is spent
- :mod:`mechanism.protocol`        the whole protocol in memory, one call, and each role's step functions
- :mod:`mechanism.variants`        the other architectures of Sec. V-B in memory (index sharing, PSI)
- :mod:`mechanism.server_sampling` server-side sampling from a stored encrypted table (Sec. V-B)
- :mod:`mechanism.simulation`      Monte Carlo of the release at count level, exact interval coverage (Sec. IV)
- :mod:`mechanism.datasets`        the synthetic count tables of Sec. IV
"""
