"""The curator's one typed config: flags > SECURE_RELEASE_<FLAG> env > --config file, and the
settings it refuses (no network, no files but the ones written here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from secure_release.curator.cli import build_parser
from secure_release.curator.config import CuratorConfig, config_from_args, parse_cipher, parse_sizes
from secure_release.infra.config import ConfigError, apply_env_and_config, subcommand_parser
from secure_release.mechanism.errors import (
    DuplicateNameError,
    InvalidEpsilonError,
    InvalidNameError,
    TooFewCuratorsError,
    UnknownCipherError,
)
from secure_release.mechanism.primitives.pads import CipherMode

KEY_HEX = "ab" * 32


@pytest.fixture()
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "align.key"
    path.write_text(KEY_HEX + "\n")
    for name in ("alice.csv", "alice.json"):  # the config checks that --data and --schema exist
        (tmp_path / name).write_text("")
    return path


def _base(key_file: Path) -> list[str]:
    return [
        "--data", str(key_file.parent / "alice.csv"), "--schema", str(key_file.parent / "alice.json"),
        "--release-id", "r1", "--epsilon", "0.5",
        "--server", "127.0.0.1:7000", "--name", "alice", "--curators", "alice, bob", "--leader",
        "--insecure", "--alignment-key-file", str(key_file),
    ]  # fmt: skip


def _config(argv: list[str]) -> CuratorConfig:
    parser = build_parser()
    apply_env_and_config(subcommand_parser(parser, "run"), argv)
    return config_from_args(parser.parse_args(["run", *argv]))


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("SECURE_RELEASE_"):
            monkeypatch.delenv(name)


def test_defaults_and_types(key_file: Path) -> None:
    config = _config([*_base(key_file), "--grant", "res", "--grant", "res", "--grant", "other"])
    assert config.curators == ("alice", "bob") and config.leader and config.leader_address is None
    assert config.cipher is CipherMode.CHACHA20 and config.m is None and config.key_retention == 7 * 24 * 3600.0
    assert config.dataset == "alice.csv" and config.keystore == Path("keystore-alice")
    assert (config.listen_host, config.listen_port) == ("127.0.0.1", 0)
    assert config.grants == ("res", "other")  # repeated grants collapse, order kept
    assert config.researchers == ("researcher", "res", "other")  # the notified one first
    assert config.alignment_key.reveal().hex() == KEY_HEX
    assert KEY_HEX not in repr(config)  # keys print as fingerprints only


def test_flag_beats_env_beats_config_file(
    key_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "c.json"
    conf.write_text(json.dumps({"epsilon": 0.25, "key-retention": 3.0, "timeout": 9, "dataset": "fromfile"}))
    argv = [a for a in _base(key_file)]
    argv[argv.index("--epsilon") + 1] = "0.1"
    monkeypatch.setenv("SECURE_RELEASE_EPSILON", "0.75")
    monkeypatch.setenv("SECURE_RELEASE_KEY_RETENTION", "2.0")
    config = _config([*argv, "--config", str(conf)])
    assert config.epsilon == 0.1  # flag over env and file
    assert config.key_retention == 2.0  # env over file
    assert config.timeout == 9.0 and config.dataset == "fromfile"  # file over the defaults


def test_secret_in_config_file_is_refused_without_echoing_it(key_file: Path, tmp_path: Path) -> None:
    conf = tmp_path / "c.json"
    conf.write_text(json.dumps({"alignment-key": KEY_HEX}))
    with pytest.raises(ConfigError, match="alignment_key") as info:
        _config([*_base(key_file), "--config", str(conf)])
    assert KEY_HEX not in str(info.value)


def test_secret_from_env_is_allowed(key_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    argv = _base(key_file)
    del argv[argv.index("--alignment-key-file") : argv.index("--alignment-key-file") + 2]
    monkeypatch.setenv("SECURE_RELEASE_ALIGNMENT_KEY", KEY_HEX)
    assert _config(argv).alignment_key.reveal().hex() == KEY_HEX


def test_no_budget_or_key_on_the_command_line(key_file: Path) -> None:
    """The budget is a ledger policy and a key on argv shows in /proc/PID/cmdline: both flags are gone."""
    for flag, value in (("--budget", "5"), ("--alignment-key-hex", KEY_HEX)):
        with pytest.raises(SystemExit):
            _config([*_base(key_file), flag, value])


def test_missing_alignment_key(key_file: Path) -> None:
    argv = _base(key_file)[:-2]
    with pytest.raises(ConfigError, match="--alignment-key-file"):
        _config(argv)


def test_leader_and_follower_settings(key_file: Path) -> None:
    follower = [a for a in _base(key_file) if a != "--leader"]
    with pytest.raises(ConfigError, match="needs --leader-address"):
        _config(follower)
    config = _config([*follower, "--leader-address", "127.0.0.1:7101", "--alphabet-sizes", "6,4"])
    assert not config.leader and config.expected_sizes is None  # the cross-check is the leader's
    with pytest.raises(ConfigError, match="exclude each other"):
        _config([*_base(key_file), "--leader-address", "127.0.0.1:7101"])


def test_test_only_secrets(key_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seed = ["--insecure-test-seed", "01" * 32]
    with pytest.raises(ConfigError, match="SECURE_RELEASE_TESTING=1"):
        _config([*_base(key_file), *seed])
    monkeypatch.setenv("SECURE_RELEASE_TESTING", "1")
    assert _config([*_base(key_file), *seed]).test_seed is not None
    follower = [a for a in _base(key_file) if a != "--leader"] + ["--leader-address", "h:1"]
    with pytest.raises(ConfigError, match="leading curator only"):
        _config([*follower, *seed])


@pytest.mark.parametrize(
    ("flag", "value", "error"),
    [
        ("--curators", "alice", TooFewCuratorsError),
        ("--curators", "alice,alice", DuplicateNameError),
        ("--curators", "bob,carol", ConfigError),
        ("--release-id", "../r1", InvalidNameError),
        ("--epsilon", "0", InvalidEpsilonError),
        ("--key-retention", "nan", ConfigError),
        ("--max-rows", "0", ConfigError),
        ("--m", "0", ConfigError),
        ("--listen", "nowhere", ConfigError),
        ("--alphabet-sizes", "6", ConfigError),
    ],
)
def test_bad_settings_are_named(key_file: Path, flag: str, value: str, error: type[Exception]) -> None:
    argv = _base(key_file)
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    with pytest.raises(error):
        _config(argv)


def test_tls_needs_certs(key_file: Path) -> None:
    with pytest.raises(ConfigError, match="--certs"):
        _config([a for a in _base(key_file) if a != "--insecure"])


def test_parse_cipher_and_sizes() -> None:
    assert parse_cipher("OTP") is CipherMode.OTP
    with pytest.raises(UnknownCipherError, match="allowed: otp, chacha20"):
        parse_cipher("rot13")
    assert parse_sizes("6,4", ("a", "b")) == (6, 4) and parse_sizes(None, ("a", "b")) is None
    for bad in ("6,x", "6,4,2", "6,1"):
        with pytest.raises(ConfigError):
            parse_sizes(bad, ("a", "b"))


def test_duckdb_query_setting(key_file: Path) -> None:
    assert _config(_base(key_file)).query is None
    config = _config([*_base(key_file), "--query", "SELECT id, edu FROM people"])
    assert config.query == "SELECT id, edu FROM people"
