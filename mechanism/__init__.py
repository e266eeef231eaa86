"""The pure core of secure-release: every step of the paper as a small, verified function.

Nothing in this package opens a socket, a file or imports grpc (a test enforces it).
"DESIGN x.y" in docstrings cites docs/design.md, section x, item y. Modules:

- :mod:`mechanism.errors`      named errors, each saying what was wrong and what is allowed
- :mod:`mechanism.schema`      attributes, mixed-radix alphabets, joint codes
- :mod:`mechanism.keys`        seeds and keys that never print their bytes; labelled HKDF
- :mod:`mechanism.stream`      ChaCha20 keystreams and exact uniform integers from them
- :mod:`mechanism.sampling`    the shared ordered m-tuple of positions (DESIGN 3.2)
- :mod:`mechanism.pads`        one-time and ChaCha20 pads, additive encryption (DESIGN 3.3)
- :mod:`mechanism.pram`        gamma-diagonal PRAM on joint rows (DESIGN 3.4)
- :mod:`mechanism.accounting`  epsilon, gamma, m*, bounds, exact MSE
  (Thm 3.2, Eq. 2, Cor. 3.6, Thm 3.4)
- :mod:`mechanism.estimators`  A^-1, marginals, standard errors, simplex projection, MLE
- :mod:`mechanism.alignment`   keyed id tags (AES-256-CMAC, column-wise) and the canonical order
- :mod:`mechanism.ledger`      sequential composition, budget and seed-reuse refusal
- :mod:`mechanism.plan`        the public parameters of one release
- :mod:`mechanism.spec`        ReleaseSpec (what the parties agree on), the name grammars
- :mod:`mechanism.report`      ReleaseReport, the researcher's typed result
- :mod:`mechanism.protocol`    the whole protocol in memory, one call (and the leader's agreement)
"""
