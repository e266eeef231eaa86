"""A curator's wind-down after its --timeout is bounded once, not per call (issue 47): every
abort a run sends once its deadline has passed shares one ``give_up_s``. A campaign schedule
(``bench/fault_campaign.py``, seed 46: the leader's link to the server cut for longer than its
--timeout) found the leader outliving its --timeout by two 10 s abort retries in a row."""

from __future__ import annotations

import time

from secure_release.curator.release.upload import ServerLink
from secure_release.curator.waits import Deadline


def _link(seconds: float) -> ServerLink:
    link = ServerLink.__new__(ServerLink)  # no channel: only the deadlines are looked at
    link.deadline = Deadline(seconds)
    return link


def test_before_the_deadline_an_abort_may_take_what_the_run_has_left() -> None:
    link = _link(60.0)
    assert 59.0 < link.wind_down(10.0).left() <= 60.0


def test_past_the_deadline_every_abort_shares_one_give_up() -> None:
    link = _link(0.0)
    first = link.wind_down(0.3)
    assert 0.2 < first.left() <= 0.3
    time.sleep(0.2)
    second = link.wind_down(0.3)
    assert second is first and second.left() <= 0.1  # what is left of the one, not a new 0.3 s
    time.sleep(0.15)
    assert link.wind_down(0.3).left() == 0.0
