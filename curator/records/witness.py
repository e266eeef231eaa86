"""The curator's side of the server's budget witness (``server/witness.py``).

Before a release reserves, the curator asks the witness what it holds for the data set and
refuses if its ledger is behind (:class:`LedgerBehindError`: the ledger was rolled back to an older
copy, replaced by a fresh one, or lost entries with its head). After a reservation is durable in
the ledger, the curator moves the witness up to it. ``budget set`` on a data set the ledger does
not cover carries the witness's counts over as spent (:func:`carry_over`), so deleting the ledger
and setting the budget again never forgets spending.

The data set is named to the server only as an HMAC under a key derived from the curator's private
key (``HeadSigner.witness_fingerprint``). Without certificates (insecure mode, tests) the key is a
hash of the curator's name: the server could then test guesses of data-set names.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

from secure_release.curator.records.ledgerfile import LedgerFile
from secure_release.curator.records.ledgersign import HeadSigner
from secure_release.curator.waits import Deadline, retry_until
from secure_release.mechanism.privacy.ledger import BUDGET_SLACK, LedgerEntry, LedgerTamperedError, PrivacyLedger
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

WITNESS_CALL_S = 10.0


class LedgerBehindError(LedgerTamperedError):
    """The server's witness knows more reservations or epsilon for a data set than the ledger."""


class BudgetWitness:
    """One curator's witness calls over a ReleaseServer stub."""

    def __init__(
        self, stub: pb_grpc.ReleaseServerStub, curator: str, signer: HeadSigner | None, deadline: Deadline | None = None
    ) -> None:
        """``deadline``: calls are retried while the server is unreachable until then (30 s if None)."""
        self.stub, self.curator, self.signer = stub, curator, signer
        self.deadline = deadline

    def key(self, dataset: str) -> bytes:
        """The keyed fingerprint the server files this data set under."""
        if self.signer is not None:
            return self.signer.witness_fingerprint(dataset)
        return hashlib.sha256(f"secure-release insecure witness v1\n{self.curator}\n{dataset}".encode()).digest()

    def _ask(self, dataset: str, count: int, total: float, record: bool) -> pb.WitnessReply:
        request = pb.WitnessRequest(
            curator=self.curator, dataset_key=self.key(dataset), reservations=count, epsilon_total=total, record=record
        )
        reply: pb.WitnessReply = retry_until(
            lambda t: self.stub.WitnessLedger(request, timeout=t),
            "the server's budget witness",
            self.deadline or Deadline(30.0),
            per_call_s=WITNESS_CALL_S,
        )
        return reply

    def known(self, dataset: str) -> tuple[int, float]:
        """(reservations, epsilon total) the witness holds for ``dataset``."""
        reply = self._ask(dataset, 0, 0.0, record=False)
        return int(reply.reservations), float(reply.epsilon_total)

    def check(
        self, ledger: PrivacyLedger, dataset: str, record: bool = False,
        reread: Callable[[], PrivacyLedger] | None = None,
    ) -> None:  # fmt: skip
        """:class:`LedgerBehindError` if the witness knows more than ``ledger`` for ``dataset``;
        with ``record``, first move the witness up to the ledger's counts.

        ``reread``: the ledger read again once the witness answered, compared when ``ledger``
        looks behind. Concurrent releases on one keystore need it: another process may reserve
        (the ledger first, then the witness) between this ledger's read and the witness's answer,
        and a ledger read after that answer holds every reservation the answer counts, unless the
        ledger was really rolled back (a campaign of concurrent releases found the race:
        ``bench/fault_campaign.py``, seed 20)."""
        count, total = ledger.witnessed(dataset)
        reply = self._ask(dataset, count, total, record)
        if reread is not None and self._behind(reply, count, total):
            count, total = reread().witnessed(dataset)
        if self._behind(reply, count, total):
            raise LedgerBehindError(
                f"the ledger records {count} reservations ({total:.6g} epsilon) for data set {dataset!r}, but the "
                f"server's witness has seen {reply.reservations} ({reply.epsilon_total:.6g}): the ledger was rolled "
                "back, replaced or cut; no release runs on it. Restore the newest ledger, or see docs/privacy.md "
                "('When the ledger is refused')"
            )


    @staticmethod
    def _behind(reply: pb.WitnessReply, count: int, total: float) -> bool:
        return bool(reply.reservations > count or reply.epsilon_total > total * (1 + BUDGET_SLACK) + 1e-12)


def carry_over(ledger_file: LedgerFile, witness: BudgetWitness, dataset: str, name: str) -> LedgerEntry | None:
    """Append a carry entry for what the witness knows beyond the ledger (counted as spent)."""
    count, total = witness.known(dataset)
    _, entry = ledger_file.update(lambda led: led.carry(dataset, name, count, total, time.time()))
    return entry


__all__ = ["BudgetWitness", "LedgerBehindError", "carry_over"]
