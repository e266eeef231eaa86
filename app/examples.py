"""The per-role example commands that fit together (one release of your own two tables), shown
by ``secure-release --help`` and docs/own-data.md (a test keeps the two identical)."""

from __future__ import annotations

#: Ports: server 7000, alice 7101, bob 7102, researcher 7200; all on this machine.
OWN_DATA_STEPS = (
    ("certificates, for a trial on one machine: a CA in certs/ca and one directory certs/NAME per party "
     "(separate organisations: docs/deployment.md)",
     "secure-release pki init certs --curators alice,bob --researcher researcher --analyst analyst"),
    ("alice: the alignment key both curators share (0600; give it to bob, never to the server or researcher)",
     "secure-release keygen alignment align.key"),
    ("each curator: its schema from the public codebook (and, for a numeric column, its public range)",
     "secure-release schema draft alice.csv --curator alice --id-column id --codebook codebook-alice.json "
     "--missing-token NA --out alice.json"),
    ("",
     "secure-release schema draft bob.csv --curator bob --id-column id --codebook codebook-bob.json "
     "--range mass_g=2500:6500 --bins 4 --out bob.json"),
    ("each curator: check its table against its schema (prints its rows, alphabet, bins and missing label)",
     "secure-release schema check alice.csv alice.json"),
    ("",
     "secure-release schema check bob.csv bob.json"),
    ("each curator, once per data set: the total epsilon it allows, in the keystore its runs use",
     "secure-release-curator budget set --keystore keystore-alice --data alice.csv --epsilon 2.0 "
     "--certs certs/alice --name alice"),
    ("",
     "secure-release-curator budget set --keystore keystore-bob --data bob.csv --epsilon 2.0 "
     "--certs certs/bob --name bob"),
    ("anyone: the plan (n: about how many ids both hold; the schemas give K and state the bins)",
     "secure-release plan --n 300 --schema alice.json --schema bob.json --epsilon 1.0"),
    ("terminal 1, the server",
     "secure-release-server --listen 127.0.0.1:7000 --store store --certs certs/server --name server "
     "--researcher-address 127.0.0.1:7200"),
    ("terminal 2, the researcher",
     "secure-release-researcher serve --listen 127.0.0.1:7200 --certs certs/researcher --name researcher --server "
     "127.0.0.1:7000 --curator alice=127.0.0.1:7101 --curator bob=127.0.0.1:7102 --out results --analyst "
     "analyst"),
    ("terminal 3, alice (leads)",
     "secure-release-curator run --data alice.csv --schema alice.json --release-id r1 --epsilon 1.0 "
     "--server 127.0.0.1:7000 --certs certs/alice --name alice --curators alice,bob --leader --listen "
     "127.0.0.1:7101 --alignment-key-file align.key --grant researcher --keystore keystore-alice"),
    ("terminal 4, bob",
     "secure-release-curator run --data bob.csv --schema bob.json --release-id r1 --epsilon 1.0 --server "
     "127.0.0.1:7000 --certs certs/bob --name bob --curators alice,bob --leader-address 127.0.0.1:7101 "
     "--listen 127.0.0.1:7102 --alignment-key-file align.key --grant researcher --keystore keystore-bob"),
    ("the analyst: the estimate, a marginal, an export",
     "secure-release analyst show r1 --researcher 127.0.0.1:7200 --certs certs/analyst --name analyst"),
    ("",
     "secure-release analyst marginal r1 mass_g --researcher 127.0.0.1:7200 --certs certs/analyst "
     "--name analyst"),
    ("",
     "secure-release analyst export r1 r1.parquet --researcher 127.0.0.1:7200 --certs certs/analyst "
     "--name analyst"),
    ("the analyst: one self-contained HTML page to send (headline, warnings, charts, guarantee, plan, cells)",
     "secure-release analyst report r1 --out r1.html --researcher 127.0.0.1:7200 --certs certs/analyst --name "
     "analyst"),
)  # fmt: skip


def own_data_text(indent: str = "  ") -> str:
    """The steps as ``# comment`` and command lines."""
    lines = []
    for comment, command in OWN_DATA_STEPS:
        if comment:
            lines.append(f"{indent}# {comment}")
        lines.append(f"{indent}{command}")
    return "\n".join(lines)
