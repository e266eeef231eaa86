"""One curator's part of a release, end to end (reusing mechanism.protocol's steps).

start the Curator service -> tags (protocol.curator_tags) -> agreement with the leader
(common tags, plan, seed) -> align -> ledger check -> sample (sampling.sample_positions) ->
encrypt under a fresh pad (protocol.curator_encrypt) -> register + upload in CHUNK_ROWS chunks
(retries, idempotent) -> commit -> serve keys until SIGTERM (or until every granted researcher
fetched them with --exit-after-keys).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc

from secure_release.curator.keystore import Keystore
from secure_release.curator.service import (
    CIPHER_OF_PB,
    PB_CIPHER,
    CuratorService,
    LeaderState,
    tag_chunks,
    tags_from_bytes,
)
from secure_release.curator.table import load_schema, read_table
from secure_release.infra.config import (
    ConfigError,
    JsonLog,
    split_address,
    testing_enabled,
    with_retries,
    write_port_file,
)
from secure_release.infra.tls import bind, make_grpc_server, secure_channel
from secure_release.mechanism.alignment import TagArray, align
from secure_release.mechanism.errors import SecureReleaseError, ShapeMismatchError
from secure_release.mechanism.keys import AlignmentKey, PadKey, Seed
from secure_release.mechanism.ledger import PrivacyLedger
from secure_release.mechanism.packing import CHUNK_ROWS, digest_of, pack_symbols
from secure_release.mechanism.pads import CipherMode
from secure_release.mechanism.protocol import curator_encrypt, curator_tags
from secure_release.mechanism.sampling import sample_positions
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc


class AgreementError(SecureReleaseError):
    """The leader's agreement contradicts this curator's own release spec."""


def _progress(done: int, total: int, label: str) -> None:
    if not sys.stderr.isatty() or total <= 0:
        return
    width = 30
    filled = int(width * done / total)
    sys.stderr.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def _alignment_key(args: argparse.Namespace) -> AlignmentKey:
    if args.alignment_key_hex:
        return AlignmentKey.from_hex(args.alignment_key_hex.strip())
    if args.alignment_key_file:
        return AlignmentKey.from_hex(Path(args.alignment_key_file).read_text().strip())
    raise ConfigError(
        "the curators must share an alignment key: pass --alignment-key-file FILE (64 hex digits, "
        "same file content at every curator; never give it to the server or researcher)"
    )


def run(args: argparse.Namespace) -> int:
    log = JsonLog("curator", args.name)
    if (args.insecure_test_seed or args.insecure_test_pad_key) and not testing_enabled():
        raise ConfigError("--insecure-test-* flags are allowed only with SECURE_RELEASE_TESTING=1")
    cipher = CipherMode.parse(args.cipher)
    curators = [c.strip() for c in args.curators.split(",") if c.strip()]
    if args.name not in curators or len(curators) < 2:
        raise ConfigError(f"--curators must list >= 2 curators including {args.name!r}, got {curators}")
    spec = load_schema(args.schema)
    if spec.schema.name != args.name:
        raise ConfigError(f"schema {args.schema} is for curator {spec.schema.name!r}, not {args.name!r}")
    table = read_table(args.data, spec)
    own_size = spec.schema.alphabet_size
    log("table_loaded", rows=int(table.ids.size), alphabet_size=own_size)

    keystore = Keystore(args.keystore or f"keystore-{args.name}", budget=args.budget)
    dataset = args.dataset or Path(args.data).name
    ledger = keystore.load_ledger()
    if ledger.budget != args.budget and args.budget is not None:
        ledger = PrivacyLedger(args.budget, ledger.entries)
        keystore.save_ledger(ledger)
    # Refuse early (before any message leaves) if the budget cannot cover this release.
    ledger.check(dataset, args.release_id, args.epsilon, "pending")
    akey = _alignment_key(args)

    service = CuratorService(args.name, spec.schema, log)
    leader_state: LeaderState | None = None
    if args.leader:
        expected = _expected_sizes(args, curators, own_size)
        seed = Seed.from_hex(args.insecure_test_seed) if args.insecure_test_seed else None
        leader_state = LeaderState(
            args.release_id,
            tuple(curators),
            expected,
            args.epsilon,
            args.m,
            cipher,
            args.researcher,
            seed=seed,
        )
        service.lead(leader_state)
    server = make_grpc_server()
    pb_grpc.add_CuratorServicer_to_server(service, server)
    host, port = split_address(args.listen)
    bound = bind(server, host, port, args.certs, args.name, args.insecure)
    server.start()
    write_port_file(args.port_file, bound)
    log("listening", address=f"{host}:{bound}", leader=bool(args.leader))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        tags = curator_tags(table, akey)
        if leader_state is not None:
            leader_state.add_tags(args.name, tags, own_size)
            if not leader_state.wait_all_tags(args.timeout):
                if leader_state.error is not None:
                    raise AgreementError(leader_state.error)
                missing = sorted(set(curators) - set(leader_state.tags))
                leader_state.fail(f"no tags from {missing}")
                raise AgreementError(f"timed out waiting for the tags of {missing}")
            params, seed, common = leader_state.agree()
        else:
            params, seed, common = _follow(args, tags, own_size, log)
        _check_params(params, args, curators, own_size, cipher)
        alignment = align(tags, common)
        log(
            "aligned",
            matched=alignment.num_matched,
            unmatched=alignment.num_unmatched,
            rows=alignment.num_rows,
        )
        n, m = int(params.n), int(params.m)
        keystore.check_release(dataset, args.release_id, args.epsilon, seed.fingerprint)
        positions = sample_positions(seed, n, m, args.release_id)
        aligned = table.symbols()[alignment.row_order]
        injected = PadKey.from_hex(args.insecure_test_pad_key) if args.insecure_test_pad_key else None
        ciphertext, pad = curator_encrypt(aligned, positions, own_size, cipher, injected)
        keystore.save_pad(args.release_id, pad, {"dataset": dataset})
        keystore.charge_release(dataset, args.release_id, args.epsilon, seed.fingerprint)
        log(
            "ledger_charged",
            dataset=dataset,
            epsilon=args.epsilon,
            remaining=keystore.load_ledger().remaining(dataset),
            seed_fingerprint=seed.fingerprint,
        )
        service.add_release(args.release_id, pad, [g for g in args.grant if g])
        _upload(args, params, ciphertext, own_size, log)
        if args.exit_after_keys:
            while not stop.is_set():
                if service.wait_keys_served(args.release_id, timeout=0.5):
                    log("keys_served", release_id=args.release_id)
                    break
        else:
            log("serving_keys", release_id=args.release_id, grants=sorted(args.grant))
            while not stop.wait(0.5):
                pass
        return 0
    finally:
        server.stop(grace=1.0)
        log("stopped")


def _expected_sizes(
    args: argparse.Namespace, curators: list[str], own_size: int
) -> tuple[int, ...] | None:
    """The optional ``--alphabet-sizes`` cross-check (each curator sends its own size)."""
    if not args.alphabet_sizes:
        return None
    try:
        sizes = tuple(int(s) for s in str(args.alphabet_sizes).split(","))
    except ValueError:
        raise ConfigError(
            f"--alphabet-sizes must be comma-separated integers, got {args.alphabet_sizes!r}"
        ) from None
    if len(sizes) != len(curators):
        raise ConfigError(f"--alphabet-sizes has {len(sizes)} entries for {len(curators)} curators")
    if sizes[curators.index(args.name)] != own_size:
        raise ConfigError(
            f"--alphabet-sizes gives {args.name} size {sizes[curators.index(args.name)]}, its schema has {own_size}"
        )
    return sizes


def _follow(
    args: argparse.Namespace, tags: TagArray, own_size: int, log: JsonLog
) -> tuple[pb.ReleaseParams, Seed, TagArray]:
    if not args.leader_address:
        raise ConfigError("a curator that does not lead needs --leader-address HOST:PORT")
    channel = secure_channel(args.leader_address, args.certs, args.name, args.insecure)
    stub = pb_grpc.CuratorStub(channel)
    resp = with_retries(
        lambda: stub.SubmitTags(tag_chunks(args.release_id, args.name, tags, own_size), timeout=60),
        "submit_tags",
        log,
        attempts=12,
    )
    log("tags_submitted", leader=args.leader_address, tags=int(resp.tags_received))

    def get() -> tuple[pb.ReleaseParams, Seed, TagArray]:
        params: pb.ReleaseParams | None = None
        seed: Seed | None = None
        parts: list[bytes] = []
        for chunk in stub.GetAgreement(
            pb.AgreementRequest(release_id=args.release_id, curator=args.name), timeout=args.timeout
        ):
            if chunk.sequence == 0:
                params, seed = chunk.params, Seed(chunk.sampling_seed)
            parts.append(chunk.common_tags)
        if params is None or seed is None:
            raise AgreementError("the leader sent no agreement")
        return params, seed, tags_from_bytes(b"".join(parts))

    out = with_retries(get, "get_agreement", log, attempts=12)
    channel.close()
    return out


def _check_params(
    params: pb.ReleaseParams,
    args: argparse.Namespace,
    curators: list[str],
    own_size: int,
    cipher: CipherMode,
) -> None:
    problems = []
    if params.release_id != args.release_id:
        problems.append(f"release id {params.release_id!r}")
    if list(params.curators) != curators:
        problems.append(f"curators {list(params.curators)}")
    if int(params.alphabet_sizes[curators.index(args.name)]) != own_size:
        problems.append(f"alphabet size {params.alphabet_sizes[curators.index(args.name)]} for {args.name}")
    if abs(params.epsilon - args.epsilon) > 1e-12:
        problems.append(f"epsilon {params.epsilon}")
    if args.m is not None and int(params.m) != args.m:
        problems.append(f"m {params.m}")
    if CIPHER_OF_PB.get(params.cipher) is not cipher:
        problems.append("cipher")
    if problems:
        raise AgreementError("the leader's release spec differs from ours: " + ", ".join(problems))


def _upload(args: argparse.Namespace, params: pb.ReleaseParams, ciphertext: object, k: int, log: JsonLog) -> None:
    channel = secure_channel(args.server, args.certs, args.name, args.insecure)
    stub = pb_grpc.ReleaseServerStub(channel)
    with_retries(
        lambda: stub.RegisterPart(pb.RegisterPartRequest(params=params, curator=args.name), timeout=30),
        "register",
        log,
        attempts=12,
    )
    log("registered", release_id=args.release_id, n=int(params.n), m=int(params.m))
    m = int(params.m)
    chunks = [pack_symbols(ciphertext[i : i + CHUNK_ROWS], k) for i in range(0, m, CHUNK_ROWS)]  # type: ignore[index]
    digest = digest_of(chunks)

    def messages() -> Iterator[pb.UploadChunk]:
        for seq, data in enumerate(chunks):
            _progress(seq + 1, len(chunks), f"{args.name} upload")
            yield pb.UploadChunk(release_id=args.release_id, curator=args.name, sequence=seq, symbols=data)
        yield pb.UploadChunk(
            release_id=args.release_id,
            curator=args.name,
            commit=True,
            digest=digest,
            num_chunks=len(chunks),
        )

    resp = with_retries(lambda: stub.UploadCiphertext(messages(), timeout=120), "upload", log, attempts=8)
    if not resp.committed:
        raise ShapeMismatchError(f"the server did not commit {args.name}'s upload")
    log("committed", release_id=args.release_id, chunks=len(chunks), stored=int(resp.symbols_stored))
    channel.close()


_ = (PB_CIPHER, grpc, time)
