"""Attributes, mixed-radix alphabets and joint codes (DESIGN 3, notation).

Curator j's symbol is the mixed-radix code of its attributes, the first attribute most
significant: with domain sizes (d_1, ..., d_r) and category indices (i_1, ..., i_r),
x_j = ((i_1 d_2 + i_2) d_3 + ...) + i_r, an element of Z_{k_j}, k_j = d_1 ... d_r.
The joint cell over N curators is the mixed-radix code of (x_1, ..., x_N), curator 1 most
significant, in Z_K with K = k_1 ... k_N.
"""

from __future__ import annotations

import datetime
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from math import prod
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.errors import (
    AlphabetOverflowError,
    DuplicateNameError,
    EmptyDomainError,
    InvalidBinsError,
    InvalidGroupsError,
    ShapeMismatchError,
    SymbolOutOfRangeError,
    UnknownCategoryError,
)

#: A curator's symbols travel as uint32: its alphabet k_j must be <= 2**32.
MAX_CURATOR_ALPHABET = 2**32
#: Joint codes are int64; K must be <= 2**62 so sums and products stay exact.
MAX_JOINT_ALPHABET = 2**62

SymbolArray = npt.NDArray[np.uint32]
CodeArray = npt.NDArray[np.int64]


def edge_text(edge: float) -> str:
    """A bin edge as a label writes it: an integral edge without a decimal point (2500), any
    other in the shortest form that reads back exactly (0.25)."""
    value = float(edge)
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


_EPOCH = datetime.date(1970, 1, 1).toordinal()


def date_text(day: float) -> str:
    """A day number (days since 1970-01-01) as an ISO date."""
    return datetime.date.fromordinal(int(day) + _EPOCH).isoformat()


def date_edges(name: str, edges: Sequence[Any]) -> tuple[float, ...] | None:
    """ISO date edges ("2020-01-01") as day numbers since 1970-01-01, or None if they are not
    all date strings (then they must be numbers)."""
    if not edges or not all(isinstance(e, str) for e in edges):
        return None
    try:
        return tuple(float(datetime.date.fromisoformat(e).toordinal() - _EPOCH) for e in edges)
    except ValueError as exc:
        raise InvalidBinsError(
            f"attribute {name!r}: date bins are ISO dates (YYYY-MM-DD), got {list(edges)!r}"
        ) from exc


def bin_labels(edges: Sequence[float], dates: bool = False) -> tuple[str, ...]:
    """The labels of the bins between ``edges``: "[a, b)" for every bin but the last, which is
    closed: "[a, b]" (``dates``: day numbers, written as ISO dates)."""
    texts = [date_text(e) if dates else edge_text(e) for e in edges]
    last = len(texts) - 2
    return tuple(f"[{texts[i]}, {texts[i + 1]}{']' if i == last else ')'}" for i in range(len(texts) - 1))


def check_edges(name: str, edges: Sequence[float]) -> tuple[float, ...]:
    """``edges`` as floats after checking there are at least two, all finite, strictly increasing."""
    try:
        values = tuple(float(e) for e in edges)
    except (TypeError, ValueError) as exc:
        raise InvalidBinsError(f"attribute {name!r}: bins must be numbers, got {list(edges)!r}") from exc
    if len(values) < 2:
        raise InvalidBinsError(f"attribute {name!r}: bins needs at least two edges (one bin), got {list(edges)!r}")
    if not all(math.isfinite(v) for v in values):
        raise InvalidBinsError(f"attribute {name!r}: every bin edge must be finite, got {list(edges)!r}")
    if any(b <= a for a, b in itertools.pairwise(values)):
        raise InvalidBinsError(f"attribute {name!r}: bin edges must be strictly increasing, got {list(edges)!r}")
    return values


@dataclass(frozen=True)
class Attribute:
    """An attribute with ordered categories (the order fixes the codes).

    Optional, public preprocessing (none of it changes the codes' meaning, which the categories
    alone fix, so it is left out of equality):

    * ``bins``: public edges e_0 < ... < e_B of a numeric attribute; a value x is in bin i when
      e_i <= x < e_(i+1), the last bin closed, and the categories are the bins' labels "[a, b)"
      (:func:`bin_labels`), then the missing label if any. A value outside [e_0, e_B] is refused,
      unless ``clamp`` is set: then it is counted in the first or the last bin.
    * ``missing``: the label of an extra, last category for empty or null cells and for the
      tokens in ``missing_tokens`` (such as "?" or "NA"); without it, a missing value is refused.
    * ``groups``: a public hierarchy of a categorical attribute, ``((group, (category, ...)),
      ...)``: every category but the missing label in exactly one group (:func:`check_groups`).
      It changes no code; ``plan --suggest`` offers merging the categories into the groups.
    """

    name: str
    categories: tuple[str, ...]
    bins: tuple[float, ...] | None = field(default=None, compare=False)
    clamp: bool = field(default=False, compare=False)
    missing: str | None = field(default=None, compare=False)
    missing_tokens: tuple[str, ...] = field(default=(), compare=False)
    dates: bool = field(default=False, compare=False)  # bins are day numbers (ISO dates in the schema)
    groups: tuple[tuple[str, tuple[str, ...]], ...] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.categories:
            raise EmptyDomainError(f"attribute {self.name!r} has no categories; give at least one")
        if len(set(self.categories)) != len(self.categories):
            raise UnknownCategoryError(
                f"attribute {self.name!r} lists a category twice; categories must be distinct"
            )
        if self.bins is not None:
            edges = check_edges(self.name, self.bins)
            expected = bin_labels(edges, self.dates) + ((self.missing,) if self.missing is not None else ())
            if self.categories != expected:
                raise InvalidBinsError(
                    f"attribute {self.name!r}: the categories of a binned attribute are its bins' labels "
                    f"{list(expected)}, got {list(self.categories)}"
                )
        elif self.clamp:
            raise InvalidBinsError(f"attribute {self.name!r}: clamp needs bins (public edges to clamp to)")
        if self.missing is not None:
            if self.missing.strip() == "" or self.missing != self.missing.strip():
                raise UnknownCategoryError(
                    f"attribute {self.name!r}: the missing label must be a non-empty word without "
                    f"surrounding spaces, got {self.missing!r}"
                )
            if self.categories[-1] != self.missing or self.missing in self.categories[:-1]:
                raise UnknownCategoryError(
                    f"attribute {self.name!r}: the missing label {self.missing!r} must be the last "
                    "category and no other category"
                )
            clash = sorted(set(self.missing_tokens) & set(self.categories))
            if clash:
                raise UnknownCategoryError(
                    f"attribute {self.name!r}: missing token(s) {clash} are also categories; a token "
                    "must not be a value of its own"
                )
        elif self.missing_tokens:
            raise UnknownCategoryError(
                f"attribute {self.name!r}: missing tokens {list(self.missing_tokens)} need a "
                '"missing" label (the category they are counted in)'
            )
        if "" in self.categories:
            raise UnknownCategoryError(
                f"attribute {self.name!r}: the empty string is not a category; declare "
                '"missing": LABEL to count empty cells under a public label'
            )
        if self.groups is not None:
            check_groups(self)

    @classmethod
    def binned(
        cls, name: str, edges: Sequence[Any], clamp: bool = False, missing: str | None = None,
        missing_tokens: Sequence[str] = (),
    ) -> Attribute:
        """A numeric attribute binned at public ``edges`` (labels from :func:`bin_labels`); ISO
        date strings as edges make a date attribute (binned by day)."""
        days = date_edges(name, edges)
        values = check_edges(name, days if days is not None else edges)
        labels = bin_labels(values, days is not None) + ((missing,) if missing is not None else ())
        return cls(name, labels, values, bool(clamp), missing, tuple(missing_tokens), days is not None)

    def edge_label(self, edge: float) -> str:
        """One edge as the labels write it (a number, or an ISO date)."""
        return date_text(edge) if self.dates else edge_text(edge)

    @property
    def size(self) -> int:
        return len(self.categories)

    @property
    def missing_code(self) -> int | None:
        """The code of the missing label (the last one), or None without one."""
        return self.size - 1 if self.missing is not None else None

    def bin_codes(self, values: npt.NDArray[np.floating[Any]]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.bool_]]:
        """Bin index of each value (vectorized) and which values are refused: not finite, or
        outside [e_0, e_B] without ``clamp`` (a clamped value gets the first or the last bin)."""
        if self.bins is None:
            raise InvalidBinsError(f"attribute {self.name!r} has no bins")
        inner = np.asarray(self.bins[1:-1], dtype=np.float64)
        codes = np.searchsorted(inner, values, side="right")  # e_B itself falls in the last bin
        # NaN fails both comparisons; a clamped value needs only to be finite
        bad = ~np.isfinite(values) if self.clamp else ~((values >= self.bins[0]) & (values <= self.bins[-1]))
        return codes, np.asarray(bad)

    def describe(self) -> str | None:
        """One sentence on this attribute's public preprocessing, or None if it has none."""
        parts: list[str] = []
        if self.bins is not None:
            lo, hi = self.edge_label(self.bins[0]), self.edge_label(self.bins[-1])
            parts.append(f"{self.name} binned at public edges {[self.edge_label(e) for e in self.bins]}")
            if self.clamp:
                parts.append(
                    f"clamped: a value below {lo} is counted in {self.categories[0]} and one above {hi} "
                    f"in {self.categories[len(self.bins) - 2]}, so those bins hold values outside their "
                    "labels (a fixed, data-independent map of each record: the guarantee is unchanged)"
                )
            else:
                parts.append(f"values outside [{lo}, {hi}] refused")
        if self.missing is not None:
            tokens = f" and the tokens {list(self.missing_tokens)}" if self.missing_tokens else ""
            parts.append(f"{self.name}: empty cells{tokens} counted as {self.missing!r}")
        return "; ".join(parts) if parts else None

    def encode(self, values: Sequence[str] | npt.NDArray[Any]) -> npt.NDArray[np.int64]:
        """Category indices of ``values`` (vectorized); unknown values raise with their rows.
        A binned attribute also takes numbers (binned at its edges); a missing label counts empty
        cells, NaN/None and its missing tokens."""
        raw = np.asarray(values)
        if self.bins is not None and raw.dtype.kind in "iuf":
            numbers = raw.astype(np.float64)
            codes, bad = self.bin_codes(numbers)
            if self.missing is not None:
                nan = np.isnan(numbers)
                codes[nan], bad = self.size - 1, bad & ~nan
            self._refuse(np.flatnonzero(bad), numbers, "outside the bins " + self._range_text())
            return codes.astype(np.int64)
        if raw.dtype == object:
            raw = np.asarray(["" if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in raw.tolist()])
        arr = raw.astype(str)
        if self.missing is not None:
            arr = np.where(np.isin(arr, [*self.missing_tokens, ""]), self.missing, arr)
        cats = np.asarray(self.categories, dtype=str)
        order = np.argsort(cats, kind="stable")
        sorted_cats = cats[order]
        pos = np.searchsorted(sorted_cats, arr)
        pos_clipped = np.minimum(pos, len(cats) - 1)
        ok = sorted_cats[pos_clipped] == arr
        if not np.all(ok):
            bad_rows = np.flatnonzero(~ok)
            if self.bins is not None:
                return self._encode_number_text(arr, ok, order[pos_clipped])
            hint = "" if self.missing is not None else ' (an empty value is missing: declare "missing": LABEL)'
            self._refuse(bad_rows, arr, f"outside its categories; allowed: {list(self.categories)}{hint}")
        return order[pos_clipped].astype(np.int64)

    def _encode_number_text(
        self, arr: npt.NDArray[np.str_], is_label: npt.NDArray[np.bool_], label_codes: npt.NDArray[np.intp]
    ) -> npt.NDArray[np.int64]:
        """A binned attribute given as text: labels as they are, the rest parsed as numbers."""
        rest = np.flatnonzero(~is_label)
        if self.dates:
            numbers = np.asarray([_to_day(v) for v in arr[rest].tolist()], dtype=np.float64)  # small, in memory
        else:
            try:
                numbers = arr[rest].astype(np.float64)
            except ValueError:
                numbers = np.asarray([_to_float(v) for v in arr[rest].tolist()], dtype=np.float64)
        codes, bad = self.bin_codes(numbers)
        self._refuse(rest[bad], arr, "outside the bins " + self._range_text() + " (or not a number)")
        out = label_codes.astype(np.int64)
        out[rest] = codes
        return out

    def _range_text(self) -> str:
        assert self.bins is not None
        tail = "; declare \"missing\" for empty cells" if self.missing is None else ""
        return f"[{self.edge_label(self.bins[0])}, {self.edge_label(self.bins[-1])}]{tail}"

    def _refuse(self, rows: npt.NDArray[np.intp], values: npt.NDArray[Any], allowed: str) -> None:
        if rows.size:
            shown = ", ".join(f"row {int(i)}: {_shown(values[i])}" for i in rows[:5])
            raise UnknownCategoryError(
                f"attribute {self.name!r}: {rows.size} value(s) {allowed} ({shown})"
            )


def _to_day(text: str) -> float:
    try:
        return float(datetime.date.fromisoformat(text[:10]).toordinal() - _EPOCH)
    except ValueError:
        return math.nan


def _to_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _shown(value: Any) -> str:
    item = value.item() if isinstance(value, np.generic) else value
    return repr(item)


def check_groups(attribute: Attribute) -> None:
    """Validate a categorical attribute's public hierarchy ``groups``: at least one group; group
    names non-empty, without surrounding spaces, distinct and not the missing label; every group
    non-empty; every category but the missing label in exactly one group, and nothing else."""
    name, groups = attribute.name, attribute.groups or ()
    if attribute.bins is not None:
        raise InvalidGroupsError(
            f"attribute {name!r}: groups are for categorical attributes; a binned attribute merges "
            "adjacent bins by its edges"
        )
    if not groups:
        raise InvalidGroupsError(f"attribute {name!r}: groups must name at least one group")
    labels = [g for g, _ in groups]
    bad = [g for g in labels if not isinstance(g, str) or g.strip() == "" or g != g.strip()]
    if bad:
        raise InvalidGroupsError(f"attribute {name!r}: group names must be non-empty words without surrounding "
                                 f"spaces, got {bad!r}")  # fmt: skip
    if len(set(labels)) != len(labels):
        raise InvalidGroupsError(f"attribute {name!r}: group names must be distinct, got {labels}")
    if attribute.missing is not None and attribute.missing in labels:
        raise InvalidGroupsError(f"attribute {name!r}: the missing label {attribute.missing!r} cannot name a group")
    empty = [g for g, members in groups if not members]
    if empty:
        raise InvalidGroupsError(f"attribute {name!r}: group(s) {empty} have no categories")
    members = [c for _, cats in groups for c in cats]
    plain = attribute.categories[:-1] if attribute.missing is not None else attribute.categories
    if attribute.missing is not None and attribute.missing in members:
        raise InvalidGroupsError(
            f"attribute {name!r}: the missing label {attribute.missing!r} stays a category of its own; "
            "leave it out of the groups"
        )
    unknown = sorted(set(members) - set(plain))
    if unknown:
        raise InvalidGroupsError(f"attribute {name!r}: groups list {unknown}, which are not categories: "
                                 f"{list(plain)}")  # fmt: skip
    twice = sorted({c for c in members if members.count(c) > 1})
    if twice:
        raise InvalidGroupsError(f"attribute {name!r}: categories {twice} are in more than one group; each "
                                 "category must be in exactly one")  # fmt: skip
    left = [c for c in plain if c not in set(members)]
    if left:
        raise InvalidGroupsError(f"attribute {name!r}: categories {left} are in no group; each category must be "
                                 "in exactly one")  # fmt: skip


def groups_from_dict(name: str, groups: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The schema file's ``"groups": {GROUP: [CATEGORY, ...], ...}`` as the attribute's tuple (in
    the file's order), after checking its shape."""
    if not isinstance(groups, Mapping) or not all(
        isinstance(cats, list) and all(isinstance(c, str) for c in cats) for cats in groups.values()
    ):
        raise InvalidGroupsError(
            f'attribute {name!r}: groups must be {{"GROUP": ["CATEGORY", ...], ...}}, got {groups!r}'
        )
    return tuple((str(g), tuple(cats)) for g, cats in groups.items())


def attribute_from_dict(data: Mapping[str, Any]) -> Attribute:
    """An attribute from its schema-file entry: ``{"name", "categories", "groups"?}`` or
    ``{"name", "bins", "clamp"?}``, either with ``"missing"?`` and ``"missing_tokens"?``."""
    name = str(data["name"])
    known = {"name", "categories", "bins", "clamp", "missing", "missing_tokens", "groups"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise InvalidBinsError(f"attribute {name!r}: unknown field(s) {unknown}; allowed: {sorted(known)}")
    missing = data.get("missing")
    missing_label = None if missing is None else str(missing)
    tokens = data.get("missing_tokens", [])
    if not isinstance(tokens, list):
        raise UnknownCategoryError(f"attribute {name!r}: missing_tokens must be a list of strings, got {tokens!r}")
    token_tuple = tuple(str(t) for t in tokens)
    if "bins" in data:
        if "categories" in data:
            raise InvalidBinsError(f"attribute {name!r}: give either categories or bins, not both")
        if not isinstance(data["bins"], list):
            raise InvalidBinsError(f"attribute {name!r}: bins must be a list of edges, got {data['bins']!r}")
        clamp = data.get("clamp", False)
        if not isinstance(clamp, bool):
            raise InvalidBinsError(f"attribute {name!r}: clamp must be true or false, got {clamp!r}")
        if "groups" in data:
            raise InvalidGroupsError(
                f"attribute {name!r}: groups are for categorical attributes; a binned attribute merges "
                "adjacent bins by its edges"
            )
        return Attribute.binned(name, data["bins"], clamp, missing_label, token_tuple)
    if "clamp" in data:
        raise InvalidBinsError(f"attribute {name!r}: clamp needs bins (public edges to clamp to)")
    categories = tuple(str(c) for c in data["categories"])
    if missing_label is not None and missing_label in categories:
        raise UnknownCategoryError(
            f"attribute {name!r}: the missing label {missing_label!r} is already a category; it must be "
            "a label of its own (it becomes the last category, so it must be the last category and no other)"
        )
    if missing_label is not None:
        categories = (*categories, missing_label)
    groups = groups_from_dict(name, data["groups"]) if "groups" in data else None
    return Attribute(name, categories, None, False, missing_label, token_tuple, groups=groups)


def attribute_to_dict(attribute: Attribute) -> dict[str, Any]:
    """The schema-file entry of ``attribute`` (inverse of :func:`attribute_from_dict`)."""
    out: dict[str, Any] = {"name": attribute.name}
    if attribute.bins is not None and attribute.dates:
        out["bins"] = [date_text(e) for e in attribute.bins]
        if attribute.clamp:
            out["clamp"] = True
    elif attribute.bins is not None:
        out["bins"] = [int(e) if float(e).is_integer() and abs(e) < 2**53 else e for e in attribute.bins]
        if attribute.clamp:
            out["clamp"] = True
    else:
        out["categories"] = list(attribute.categories[:-1] if attribute.missing is not None else attribute.categories)
    if attribute.missing is not None:
        out["missing"] = attribute.missing
        if attribute.missing_tokens:
            out["missing_tokens"] = list(attribute.missing_tokens)
    if attribute.groups is not None:
        out["groups"] = {group: list(members) for group, members in attribute.groups}
    return out


@dataclass(frozen=True)
class CuratorSchema:
    """One curator's slice: its attributes, in order; the alphabet is their product."""

    name: str
    attributes: tuple[Attribute, ...]

    def __post_init__(self) -> None:
        if not self.attributes:
            raise EmptyDomainError(f"curator {self.name!r} has no attributes; give at least one")
        if self.alphabet_size > MAX_CURATOR_ALPHABET:
            raise AlphabetOverflowError(
                f"curator {self.name!r}: alphabet size {self.alphabet_size} exceeds "
                f"{MAX_CURATOR_ALPHABET} (symbols are uint32); split the attributes across curators"
            )

    @property
    def alphabet_size(self) -> int:
        return prod(a.size for a in self.attributes)

    @property
    def radices(self) -> tuple[int, ...]:
        return tuple(a.size for a in self.attributes)

    def encode(self, columns: Mapping[str, Sequence[str] | npt.NDArray[np.str_]]) -> SymbolArray:
        """Mixed-radix symbols of the rows given as one sequence of labels per attribute."""
        missing = [a.name for a in self.attributes if a.name not in columns]
        if missing:
            raise UnknownCategoryError(
                f"curator {self.name!r}: missing column(s) {missing}; "
                f"expected {[a.name for a in self.attributes]}"
            )
        lengths = {len(columns[a.name]) for a in self.attributes}
        if len(lengths) != 1:
            raise ShapeMismatchError(f"curator {self.name!r}: columns differ in length {lengths}")
        indices = [a.encode(columns[a.name]) for a in self.attributes]
        return mixed_radix_encode(indices, self.radices).astype(np.uint32)

    def decode(self, symbols: npt.ArrayLike) -> dict[str, npt.NDArray[np.str_]]:
        """Labels per attribute for each symbol (inverse of :meth:`encode`)."""
        codes = check_symbols(symbols, self.alphabet_size).astype(np.int64)
        digits = mixed_radix_decode(codes, self.radices)
        return {
            a.name: np.asarray(a.categories, dtype=str)[d]
            for a, d in zip(self.attributes, digits, strict=True)
        }

    def labels(self) -> list[tuple[str, ...]]:
        """The category labels of every symbol 0 .. k-1, in code order."""
        grids = np.indices(self.radices).reshape(len(self.radices), -1)
        return [
            tuple(self.attributes[j].categories[int(grids[j, c])] for j in range(len(self.radices)))
            for c in range(self.alphabet_size)
        ]


@dataclass(frozen=True)
class JointSchema:
    """The N >= 2 curators of a release, in the order of the joint code."""

    curators: tuple[CuratorSchema, ...]

    def __post_init__(self) -> None:
        if len(self.curators) < 1:
            raise EmptyDomainError("a joint schema needs at least one curator")
        names = [c.name for c in self.curators]
        if len(set(names)) != len(names):
            raise DuplicateNameError(f"curator names must be distinct, got {names}")
        check_joint_alphabet(self.alphabet_sizes)

    @property
    def alphabet_sizes(self) -> tuple[int, ...]:
        return tuple(c.alphabet_size for c in self.curators)

    @property
    def joint_size(self) -> int:
        return prod(self.alphabet_sizes)

    @property
    def attribute_names(self) -> list[str]:
        return [a.name for c in self.curators for a in c.attributes]

    def cell_labels(self) -> list[tuple[str, ...]]:
        """Labels (one per attribute, all curators) of every joint cell, in code order."""
        per_curator = [c.labels() for c in self.curators]
        grids = np.indices(self.alphabet_sizes).reshape(len(self.curators), -1)
        return [
            tuple(
                lab for j in range(len(self.curators)) for lab in per_curator[j][int(grids[j, c])]
            )
            for c in range(self.joint_size)
        ]


def check_joint_alphabet(alphabet_sizes: Sequence[int]) -> int:
    """Validate per-curator alphabet sizes and return K = prod k_j."""
    if len(alphabet_sizes) == 0:
        raise EmptyDomainError("no curator alphabets given; need at least one size >= 1")
    for k in alphabet_sizes:
        if int(k) != k or k < 1:
            raise EmptyDomainError(f"alphabet size {k!r} is invalid; each must be an integer >= 1")
        if k > MAX_CURATOR_ALPHABET:
            raise AlphabetOverflowError(
                f"alphabet size {k} exceeds {MAX_CURATOR_ALPHABET} (symbols are uint32)"
            )
    joint = prod(int(k) for k in alphabet_sizes)
    if joint > MAX_JOINT_ALPHABET:
        raise AlphabetOverflowError(
            f"joint alphabet K = {joint} exceeds {MAX_JOINT_ALPHABET} (joint codes are int64)"
        )
    return joint


def check_symbols(symbols: npt.ArrayLike, alphabet_size: int) -> npt.NDArray[np.uint32]:
    """Return ``symbols`` as uint32 after checking every one is in Z_k."""
    arr = np.asarray(symbols)
    if arr.ndim != 1:
        raise ShapeMismatchError(f"symbols must be a 1-D array, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise SymbolOutOfRangeError(f"symbols must be integers, got dtype {arr.dtype}")
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= alphabet_size:
            raise SymbolOutOfRangeError(
                f"symbol(s) in [{lo}, {hi}] outside Z_{alphabet_size}; "
                f"allowed 0..{alphabet_size - 1}"
            )
    return arr.astype(np.uint32, copy=False)


def mixed_radix_encode(
    digits: Sequence[npt.NDArray[np.integer]], radices: Sequence[int], dtype: npt.DTypeLike = np.int64
) -> npt.NDArray[Any]:
    """Mixed-radix code of digit columns, the first column most significant, in ``dtype``
    (which must hold the product of the radices; computed in place, no int64 copy of a digit
    column)."""
    if len(digits) != len(radices):
        raise ShapeMismatchError(f"{len(digits)} digit columns for {len(radices)} radices")
    code = np.zeros(len(digits[0]) if digits else 0, dtype=dtype)
    for column, radix in zip(digits, radices, strict=True):
        code *= int(radix)
        np.add(code, column, out=code, casting="unsafe")
    return code


def mixed_radix_decode(codes: npt.NDArray[np.integer], radices: Sequence[int]) -> list[CodeArray]:
    """Digit columns of mixed-radix ``codes`` (inverse of :func:`mixed_radix_encode`)."""
    rest = np.asarray(codes, dtype=np.int64).copy()
    out: list[CodeArray] = []
    for radix in reversed(radices):
        out.append(rest % int(radix))
        rest //= int(radix)
    return out[::-1]


def joint_codes(
    columns: Sequence[npt.NDArray[np.integer]], alphabet_sizes: Sequence[int]
) -> CodeArray:
    """Joint cell codes of per-curator symbol columns (curator 1 most significant)."""
    check_joint_alphabet(alphabet_sizes)
    lengths = {len(c) for c in columns}
    if len(lengths) > 1:
        raise ShapeMismatchError(f"curator columns differ in length: {sorted(lengths)}")
    return mixed_radix_encode(columns, alphabet_sizes)


def split_joint(codes: npt.NDArray[np.integer], alphabet_sizes: Sequence[int]) -> list[SymbolArray]:
    """Per-curator symbols of joint codes (inverse of :func:`joint_codes`)."""
    return [d.astype(np.uint32) for d in mixed_radix_decode(codes, alphabet_sizes)]
