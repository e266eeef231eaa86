"""The unit tier: pure functions and files in tmp_path; no sockets, no processes.

The autouse guard from tests/guard.py runs around every test below this folder."""

from guard import unit_tier_guard

__all__ = ["unit_tier_guard"]
