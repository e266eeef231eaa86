"""--psi-workers: the PSI's pieces done in spawned worker processes (system tier: it starts
processes) give bit-identical lists and still refuse bad points."""

from __future__ import annotations

import numpy as np
import pytest
from test_mech_psi import KEYS, _ids, bad_points

from secure_release.mechanism.alignment.psi import (
    POINT_BYTES,
    InvalidPointError,
    PsiWorkers,
    hash_to_group,
    psi_finish,
    psi_reblind,
    psi_start,
    run_psi,
)
from secure_release.mechanism.errors import ShapeMismatchError


def test_worker_processes_give_bit_identical_lists_and_still_reject_bad_points() -> None:
    """--psi-workers: the pieces done in a spawned worker join to exactly the one-process result,
    and a bad point in the worker's piece (the last) is refused like one in the caller's."""
    ids = _ids(0, 41)
    one = psi_start(ids, KEYS[0])
    back = psi_reblind(one.sent, KEYS[1])
    with PsiWorkers(2, min_points=1) as pool:
        assert pool.pieces(41) == [(0, 20), (20, 41)] and pool.pieces(0) == [(0, 0)]
        two = psi_start(ids, KEYS[0], pool)
        assert two.sent == one.sent and np.array_equal(two.row_of, one.row_of)
        assert psi_reblind(two.sent, KEYS[1], pool) == back
        assert np.array_equal(psi_finish(two, back, pool), psi_finish(one, back))
        assert hash_to_group(ids, pool) == hash_to_group(ids)
        assert run_psi([ids, ids[:30]], KEYS[:2], pool).tags[1].tobytes() == run_psi([ids, ids[:30]], KEYS[:2]).tags[
            1].tobytes()  # fmt: skip
        two_party = psi_start(ids, KEYS[0], pool, num_curators=2)  # its finish only validates
        for bad in bad_points().values():
            with pytest.raises(InvalidPointError):
                psi_reblind(back[:-POINT_BYTES] + bad, KEYS[1], pool)  # the last piece: done by the worker
            with pytest.raises(InvalidPointError):
                psi_finish(two, back[:-POINT_BYTES] + bad, pool)
            with pytest.raises(InvalidPointError):
                psi_finish(two_party, back[:-POINT_BYTES] + bad, pool)
    with PsiWorkers(2) as pool:
        assert pool.pieces(999) == [(0, 999)]  # short lists stay in the calling process
    with pytest.raises(ShapeMismatchError):
        PsiWorkers(0)
